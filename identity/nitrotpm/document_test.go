package nitrotpm_test

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/nitrotpm"
)

// TestRoot checks the shipped AWS Nitro root against what AWS publishes
// (https://docs.aws.amazon.com/enclaves/latest/user/verify-root.html):
// subject CN=aws.nitro-enclaves, its validity, a self-signed CA, and its
// SHA-256 fingerprint.
func TestRoot(t *testing.T) {
	root, err := nitrotpm.RootG1()
	if err != nil {
		t.Fatal(err)
	}
	if root.Subject.String() != "CN=aws.nitro-enclaves,OU=AWS,O=Amazon,C=US" || root.Issuer.String() != root.Subject.String() {
		t.Errorf("subject %q issuer %q", root.Subject, root.Issuer)
	}
	sum := sha256.Sum256(root.Raw)
	if got := hex.EncodeToString(sum[:]); got != "641a0321a3e244efe456463195d606317ed7cdcc3c1756e09893f3c68f79bb5b" {
		t.Errorf("SHA-256 fingerprint %s", got)
	}
	if !root.NotBefore.Equal(time.Date(2019, 10, 28, 13, 28, 5, 0, time.UTC)) || !root.NotAfter.Equal(time.Date(2049, 10, 28, 14, 28, 5, 0, time.UTC)) {
		t.Errorf("validity %s to %s", root.NotBefore, root.NotAfter)
	}
	if !root.IsCA || root.CheckSignatureFrom(root) != nil {
		t.Error("not a self-signed CA certificate")
	}
}

func realDocument(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/real-nitrotpm-document.cbor")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rootPool(t testing.TB) *x509.CertPool {
	t.Helper()
	root, err := nitrotpm.RootG1()
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	p.AddCert(root)
	return p
}

// TestRealDocument parses and verifies a document a real EC2 instance's
// Nitro hypervisor signed (testdata/README.md): its ES384 signature, its
// chain through the CA bundle to the shipped root at its own time, and
// every field; after its chain expired it is refused.
func TestRealDocument(t *testing.T) {
	d, err := nitrotpm.ParseDocument(realDocument(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Verify(rootPool(t), d.Timestamp); err != nil {
		t.Fatal(err)
	}
	if d.ModuleID != "i-01cfb383223e42522-tpm0000000000000000" || len(d.PCRs) != 24 || len(d.CABundle) != 4 ||
		hex.EncodeToString(d.Nonce) != "230af3f7c0ec43ccf99a4cab47ac61469a36ea74b1e79740fdf8ccfc8f56161a" || len(d.PublicKey) != 65 || d.UserData != nil {
		t.Errorf("document %s, %d PCRs, %d CAs, nonce %x, public key %d bytes", d.ModuleID, len(d.PCRs), len(d.CABundle), d.Nonce, len(d.PublicKey))
	}
	if got := hex.EncodeToString(d.PCRs[0]); got != "6e901b16932f6e036747d7a57696e4a2cc864008ebc016826ca1d7bd42ab5ac8286ccf49cde6c0284cbc4b63d978a2ec" {
		t.Errorf("PCR 0 %s", got)
	}
	if d.Timestamp != time.UnixMilli(1770113522437).UTC() {
		t.Errorf("timestamp %s", d.Timestamp)
	}
	inst, region, err := nitrotpm.InstanceOf(d)
	if err != nil || inst != "i-01cfb383223e42522" || region != "us-east-1" {
		t.Errorf("instance %q region %q: %v", inst, region, err)
	}
	err = d.Verify(rootPool(t), d.Certificate.NotAfter.Add(time.Second))
	if r, _ := attest.ReasonOf(err); r != attest.ReasonNitroDocExpired {
		t.Errorf("after the leaf expired: %v", err)
	}
	// With no root, the bundle's own root is not trusted for being there.
	err = d.Verify(x509.NewCertPool(), d.Timestamp)
	if r, _ := attest.ReasonOf(err); r != attest.ReasonNitroDocUntrusted {
		t.Errorf("no root: %v", err)
	}
}
