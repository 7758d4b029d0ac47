package gcevtpm_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/identity/gcevtpm/gcevtpmtest"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// gceLog is the event log of a real GCE Shielded VM (Ubuntu 21.04).
const gceLog = "ubuntu-2104-no-secure-boot"

// world is what the tests share: a test CA with Google's layout, and
// swtpm VMs provisioned as GCE provisions them.
type world struct {
	now  time.Time
	ca   *gcevtpmtest.CA
	man  *swtpm.Manufacturer
	vm   *gcevtpmtest.VM // RSA and ECC AKs, certified
	inst gcevtpm.InstanceInfo
}

var (
	worldOnce sync.Once
	theWorld  *world
	worldErr  error
)

func newWorld(t testing.TB) *world {
	t.Helper()
	worldOnce.Do(func() {
		w := &world{now: time.Now().Truncate(time.Second), inst: gcevtpmtest.Instance("node-1")}
		if w.ca, worldErr = gcevtpmtest.NewCA(w.now); worldErr != nil {
			return
		}
		dir, err := os.MkdirTemp("", "nodeproof-gcevtpm-")
		if err != nil {
			worldErr = err
			return
		}
		if w.man, worldErr = swtpm.NewManufacturer(dir); worldErr != nil {
			return
		}
		w.vm, worldErr = w.ca.NewVM(context.Background(), w.man, dir+"/vm", firmwaretestdata.MustLog(gceLog), w.inst, w.now, gcevtpmtest.VMOptions{})
		theWorld = w
	})
	if worldErr != nil {
		t.Fatalf("GCE vTPM test world (needs swtpm: %s): %v", swtpm.InstallHint, worldErr)
	}
	return theWorld
}

// newVM provisions another VM (its own swtpm) for inst.
func (w *world) newVM(t testing.TB, inst gcevtpm.InstanceInfo, o gcevtpmtest.VMOptions) *gcevtpmtest.VM {
	t.Helper()
	vm, err := w.ca.NewVM(context.Background(), w.man, t.TempDir(), firmwaretestdata.MustLog(gceLog), inst, w.now, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vm.Close)
	return vm
}

func (w *world) verifier(t testing.TB, o gcevtpm.Options) *gcevtpm.Verifier {
	t.Helper()
	if o.Trust == nil {
		tr, err := w.ca.Trust(w.now)
		if err != nil {
			t.Fatal(err)
		}
		o.Trust = tr
	}
	if o.Clock == nil {
		o.Clock = func() time.Time { return w.now }
	}
	v, err := gcevtpm.NewVerifier(o)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// attestation runs the node's side against v on vm: challenge, collector,
// answer.
func attestation(t testing.TB, v *gcevtpm.Verifier, vm *gcevtpmtest.VM) (*attest.Session, *gcevtpm.Evidence) {
	t.Helper()
	ch, err := vm.Dial()
	if err != nil {
		t.Fatal(err)
	}
	c, err := gcevtpm.NewCollector(context.Background(), ch, gcevtpm.CollectorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := testenv.KubeletKeySHA256(t)
	chal, sess, err := v.Challenge("workers", key, c.Request())
	if err != nil {
		t.Fatal(err)
	}
	ev, err := c.Answer(chal, key)
	if err != nil {
		t.Fatal(err)
	}
	return sess, ev
}

// TestVerify: a GCE vTPM's evidence, as the collector makes it, is
// accepted, and the claims name the instance the certificate names and
// the boot the log tells.
func TestVerify(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t, gcevtpm.Options{})
	sess, ev := attestation(t, v, w.vm)
	c, err := v.Verify(context.Background(), sess, ev)
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind != attest.KindGCEVTPM || c.Identity != "gcp:117478906985/us-central1-a/218557372616137117" || c.NodeName != "node-1" {
		t.Errorf("claims %s %s %s", c.Kind, c.Identity, c.NodeName)
	}
	if c.Instance == nil || c.Instance.Account != "nodeproof-test" || c.Instance.Location != "us-central1-a" || c.Instance.Name != "node-1" || c.Instance.AccountNumber != "117478906985" {
		t.Errorf("GCP claims %+v", c.Instance)
	}
	if c.TPM == nil || c.TPM.PCRBank != "sha256" || c.TPM.EKTrust != "gce-ak-certificate" || c.TPM.Boot.LogEvents == 0 || c.TPM.AKCertIssuer == "" {
		t.Errorf("TPM claims %+v", c.TPM)
	}
	if len(c.TPM.PCRs) != 24 {
		t.Errorf("%d PCRs", len(c.TPM.PCRs))
	}
}

// TestCollectorRefuses: a vTPM whose AK has no certificate, and a TPM
// that is no GCE vTPM, are refused on the node, before any evidence.
func TestCollectorRefuses(t *testing.T) {
	w := newWorld(t)
	for name, c := range map[string]struct {
		o    gcevtpmtest.VMOptions
		want error
	}{
		"AK template but no certificate": {gcevtpmtest.VMOptions{NoCertificate: true}, gcevtpm.ErrNoCertificate},
		"no GCE AK template":             {gcevtpmtest.VMOptions{Algs: []gcevtpmtest.Alg{}}, gcevtpm.ErrNotGCE},
	} {
		t.Run(name, func(t *testing.T) {
			vm := w.newVM(t, w.inst, c.o)
			ch, err := vm.Dial()
			if err != nil {
				t.Fatal(err)
			}
			col, err := gcevtpm.NewCollector(context.Background(), ch, gcevtpm.CollectorOptions{})
			if !errors.Is(err, c.want) {
				if col != nil {
					col.Close()
				}
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	// With only the RSA AK certified, the collector uses it.
	vm := w.newVM(t, w.inst, gcevtpmtest.VMOptions{Algs: []gcevtpmtest.Alg{gcevtpmtest.RSA}})
	v := w.verifier(t, gcevtpm.Options{})
	sess, ev := attestation(t, v, vm)
	if _, err := v.Verify(context.Background(), sess, ev); err != nil {
		t.Fatalf("RSA AK: %v", err)
	}
}
