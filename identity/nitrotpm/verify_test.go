package nitrotpm_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/nitrotpm"
	"github.com/nodeproof/nodeproof/identity/nitrotpm/nitrotpmtest"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// bootLog is a real log with SHA-384 digests (a GCE Shielded VM's: the
// NitroTPM's own firmware logs the same way, crypto-agile with SHA-384).
const bootLog = "ubuntu-2104-no-secure-boot"

// world: one EC2 instance with a NitroTPM (swtpm with SHA-256 and SHA-384
// banks behind the fake NSM), its identity document signed by a test
// Region, and the verifier.
type world struct {
	now      time.Time
	region   *awstest.Region
	iid      awstest.Document
	identity aws.Evidence
	pki      *nitrotpmtest.PKI
	tpm      *tpm.SocketChannel
	nsm      *nitrotpmtest.NSM
	swtpm    *swtpm.TPM
}

var (
	worldOnce sync.Once
	theWorld  *world
	worldErr  error
)

func newWorld(t testing.TB) *world {
	t.Helper()
	worldOnce.Do(func() {
		w := &world{now: time.Now().Truncate(time.Millisecond)}
		theWorld, worldErr = w, w.build()
	})
	if worldErr != nil {
		t.Fatalf("NitroTPM test world (needs swtpm: %s): %v", swtpm.InstallHint, worldErr)
	}
	return theWorld
}

func (w *world) build() error {
	var err error
	if w.region, err = awstest.NewRegion("us-east-1"); err != nil {
		return err
	}
	// Started two hours ago: older than identity/aws's default document
	// age, which the attestation document's nonce makes moot.
	w.iid = awstest.NewDocument("us-east-1", w.now.Add(-2*time.Hour))
	if w.identity, err = w.identityOf(w.iid); err != nil {
		return err
	}
	if w.pki, err = nitrotpmtest.NewPKI(w.iid.InstanceID, "us-east-1", w.now); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "nodeproof-nitrotpm-")
	if err != nil {
		return err
	}
	man, err := swtpm.NewManufacturer(dir)
	if err != nil {
		return err
	}
	state := filepath.Join(dir, "tpm")
	if err := man.Provision(context.Background(), state, "sha256,sha384"); err != nil {
		return err
	}
	if w.swtpm, err = swtpm.Start(context.Background(), state); err != nil {
		return err
	}
	log := firmwaretestdata.MustLog(bootLog)
	if w.tpm, err = tpm.DialSocket("tcp", w.swtpm.Addr, log); err != nil {
		return err
	}
	if _, err := tpmtest.ExtendLog(w.tpm, log); err != nil {
		return err
	}
	w.nsm = &nitrotpmtest.NSM{PKI: w.pki, TPM: w.tpm, Clock: time.Now}
	return nil
}

func (w *world) identityOf(d awstest.Document) (aws.Evidence, error) {
	f, err := w.region.Files(d)
	if err != nil {
		return aws.Evidence{}, err
	}
	return aws.Evidence{Document: f.Document, PKCS7: f.RSA2048}, nil
}

func (w *world) verifier(t testing.TB, clock func() time.Time) *nitrotpm.Verifier {
	t.Helper()
	if clock == nil {
		clock = time.Now
	}
	iv, err := aws.NewVerifier(aws.Options{Certs: aws.NewRegionCerts(map[string][]*x509.Certificate{"us-east-1": {w.region.Cert}}), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	v, err := nitrotpm.NewVerifier(nitrotpm.Options{Roots: []*x509.Certificate{w.pki.Root}, Identity: iv, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// attestation runs the node's side: challenge, collector on the world's
// TPM behind nsm, answer.
func (w *world) attestation(t testing.TB, v *nitrotpm.Verifier, nsm nitrotpm.NSM) (*attest.Session, *nitrotpm.Evidence) {
	t.Helper()
	c, err := nitrotpm.NewCollector(nopClose{w.tpm}, nsm)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := testenv.KubeletKeySHA256(t)
	chal, sess, err := v.Challenge("workers", key, c.Request())
	if err != nil {
		t.Fatal(err)
	}
	ev, err := c.Answer(chal, key, w.identity)
	if err != nil {
		t.Fatal(err)
	}
	return sess, ev
}

// nopClose keeps the shared TPM channel open when a collector closes.
type nopClose struct{ *tpm.SocketChannel }

func (nopClose) Close() error { return nil }

func clone(t testing.TB, ev *nitrotpm.Evidence) *nitrotpm.Evidence {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var out nitrotpm.Evidence
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// TestVerify: an instance's NitroTPM evidence, as the collector makes it
// through the NSM, is accepted, and the claims name the instance the
// identity document names and the boot the SHA-384 log tells.
func TestVerify(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t, nil)
	sess, ev := w.attestation(t, v, w.nsm)
	c, err := v.Verify(context.Background(), sess, ev)
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind != attest.KindNitroTPM || c.Identity != "aws:123456789012/us-east-1/i-1234567890abcdef0" || c.NodeName != "ip-10-0-1-2.ec2.internal" {
		t.Errorf("claims %s %s %s", c.Kind, c.Identity, c.NodeName)
	}
	if c.Instance == nil || c.Instance.Account != "123456789012" || c.Instance.Location != "us-east-1" {
		t.Errorf("AWS claims %+v", c.Instance)
	}
	if c.TPM == nil || c.TPM.PCRBank != "sha384" || c.TPM.EKTrust != "nitro-document" || c.TPM.Boot.LogEvents == 0 || len(c.TPM.PCRs) != 24 {
		t.Errorf("TPM claims %+v", c.TPM)
	}
	if len(c.TPM.Boot.BootApplications) == 0 || len(c.TPM.Boot.BootApplications[0]) != 96 {
		t.Errorf("boot applications %v: want SHA-384 digests from the replayed log", c.TPM.Boot.BootApplications)
	}
}
