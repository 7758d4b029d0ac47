package serve

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// TestPolicyReloadAttacks: a policy's version covers the --policy file and every
// trust file it points to: an EK root removed from its directory, an EK
// taken out of the inventory, are new versions as an edit of the policy is;
// a policy is built from exactly the bytes its version hashed, and a trust
// file replaced while the verifiers read it is errChangedWhileRead, never
// applied.
func TestPolicyReloadAttacks(t *testing.T) {
	dir := t.TempDir()
	roots := filepath.Join(dir, "ek-roots")
	ca, err := tpmtest.NewVendorCA("Vendor", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteRoots(roots); err != nil {
		t.Fatal(err)
	}
	inv := filepath.Join(dir, "inventory.yaml")
	write := func(p, body string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(inv, "entries:\n- ekSHA256: "+hex64('a')+"\n  nodeName: m-0\n- ekSHA256: "+hex64('b')+"\n  nodeName: m-1\n")
	pol := filepath.Join(dir, "policy.yaml")
	doc := `apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
trust:
  ekRoots: [{name: vendor, dir: ek-roots}]
  ekInventory: inventory.yaml
pools:
  worker:
    evidence: [tpm]
    tpm: {ekTrust: [ca:vendor, inventory], bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}
`
	write(pol, doc)
	c := Config{Policy: pol, Clock: time.Now}
	version := func() string {
		t.Helper()
		v, err := c.readPolicy()
		if err != nil {
			t.Fatal(err)
		}
		return v.version
	}
	v0 := version()
	if v0 != version() {
		t.Fatal("the same files, two versions")
	}
	write(inv, "entries:\n- ekSHA256: "+hex64('a')+"\n  nodeName: m-0\n")
	v1 := version()
	row := func(attack string, changed bool) {
		t.Helper()
		got := "same version (never applied)"
		if changed {
			got = "new version (applied)"
		}
		attacktable.Check(t, "operator", attack, "new version (applied)", got)
	}
	row("a stolen machine's EK taken out of trust.ekInventory, the policy file untouched", v1 != v0)
	if err := os.Remove(filepath.Join(roots, "intermediate.pem")); err != nil {
		t.Fatal(err)
	}
	row("a vendor CA removed from an ek-roots directory, the policy file untouched", version() != v1)
	write(pol, doc+"    reenrol: always\n")
	v, err := c.readPolicy()
	if err != nil {
		t.Fatal(err)
	}
	if v.pol.Pools["worker"].Reenrol != "always" {
		t.Error("the policy built is not the bytes read")
	}
	// A trust file replaced after the version was read: not applied.
	write(inv, "entries: []\n")
	_, err = c.judgeVersion(context.Background(), v)
	got := "applied"
	if errors.Is(err, errChangedWhileRead) {
		got = "not applied (changed while read)"
	}
	attacktable.Check(t, "operator", "a trust file rewritten between the reload's hash and its build", "not applied (changed while read)", got)
	if v, err = c.readPolicy(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.judgeVersion(context.Background(), v); err != nil {
		t.Errorf("built from unchanged files: %v", err)
	}
}

func hex64(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}
