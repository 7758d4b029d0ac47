package serve

import (
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/anchors"
	"github.com/nodeproof/nodeproof/identity/gcevtpm/gcevtpmtest"
)

// TestTrustAnchors: the expiry gauge lists what the verifiers trust with
// the operator's flags applied — roots files replace the pinned GCE vTPM
// and Nitro roots, an intermediates directory adds to the shipped ones, an
// expired intermediate is still listed (that is what the alert is for),
// and a flag naming nothing usable stops the server.
func TestTrustAnchors(t *testing.T) {
	now := time.Now()
	ca, err := gcevtpmtest.NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	old, err := gcevtpmtest.NewCA(now.AddDate(-200, 0, 0)) // its intermediate expired long ago
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, ders ...[]byte) string {
		var b []byte
		for _, d := range ders {
			b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d})...)
		}
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	roots := write("roots.pem", ca.Root.Raw)
	write("inter/a.pem", ca.Intermediate.Raw)
	write("inter/b.pem", old.Intermediate.Raw)
	empty := write("empty.pem")

	shipped, err := Config{}.trustAnchors()
	if err != nil {
		t.Fatal(err)
	}
	count := func(as []anchors.Anchor, kind attest.Kind, role string) (n int) {
		for _, a := range as {
			if a.Kind == kind && a.Role == role {
				n++
			}
		}
		return n
	}
	shippedInter := count(shipped, attest.KindGCEVTPM, anchors.RoleIntermediate)
	if n := count(shipped, attest.KindGCEVTPM, anchors.RoleRoot); n != 2 || shippedInter == 0 {
		t.Fatalf("shipped: %d GCE vTPM roots, %d intermediates; want Google's 2 pinned roots and the shipped intermediates", n, shippedInter)
	}

	cases := []struct {
		name    string
		c       Config
		kind    attest.Kind
		role    string
		want    int
		wantErr bool
	}{
		{"GCE roots replaced", Config{GCEVTPMRoots: roots}, attest.KindGCEVTPM, anchors.RoleRoot, 1, false},
		{"GCE intermediates added, the expired one too", Config{GCEVTPMIntermediatesDir: filepath.Join(dir, "inter")}, attest.KindGCEVTPM, anchors.RoleIntermediate, shippedInter + 2, false},
		{"Nitro root replaced by two", Config{NitroTPMRoots: write("nitro.pem", ca.Root.Raw, old.Root.Raw)}, attest.KindNitroTPM, anchors.RoleRoot, 2, false},
		{"GCE roots file without a certificate", Config{GCEVTPMRoots: empty}, "", "", 0, true},
		{"Nitro roots file without a certificate", Config{NitroTPMRoots: empty}, "", "", 0, true},
		{"intermediates directory not there", Config{GCEVTPMIntermediatesDir: filepath.Join(dir, "nope")}, "", "", 0, true},
		{"Azure AK intermediates added", Config{AzureVTPMIntermediatesDir: filepath.Join(dir, "inter")}, attest.KindAzureVTPM, anchors.RoleIntermediate, count(shipped, attest.KindAzureVTPM, anchors.RoleIntermediate) + 2, false},
		{"Azure IMDS intermediates added", Config{AzureIMDSIntermediatesDir: filepath.Join(dir, "inter")}, attest.KindAzureVTPM, anchors.RoleDocumentIntermediate, count(shipped, attest.KindAzureVTPM, anchors.RoleDocumentIntermediate) + 2, false},
		{"Azure vTPM roots file without a certificate", Config{AzureVTPMRoots: empty}, "", "", 0, true},
		{"Azure IMDS roots file without a certificate", Config{AzureIMDSRoots: empty}, "", "", 0, true},
		{"Azure IMDS intermediates directory not there", Config{AzureIMDSIntermediatesDir: filepath.Join(dir, "nope")}, "", "", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			as, err := tc.c.trustAnchors()
			if tc.wantErr {
				if err == nil {
					t.Fatal("listed anchors from a flag naming nothing usable")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n := count(as, tc.kind, tc.role); n != tc.want {
				t.Errorf("%s %s anchors: %d, want %d", tc.kind, tc.role, n, tc.want)
			}
			if len(as)-tc.want != len(shipped)-count(shipped, tc.kind, tc.role) {
				t.Errorf("other anchors changed: %d in all", len(as))
			}
		})
	}
	// An Azure roots file replaces the pinned roots and the shipped
	// intermediates under them (they lead to Microsoft's root), each
	// chain apart.
	if n := count(shipped, attest.KindAzureVTPM, anchors.RoleRoot); n != 1 {
		t.Errorf("shipped: %d Azure vTPM roots, want the 1 pinned", n)
	}
	lab, err := Config{AzureVTPMRoots: roots}.trustAnchors()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		role string
		want int
	}{
		{anchors.RoleRoot, 1},
		{anchors.RoleIntermediate, 0},
		{anchors.RoleDocumentRoot, count(shipped, attest.KindAzureVTPM, anchors.RoleDocumentRoot)},
		{anchors.RoleDocumentIntermediate, count(shipped, attest.KindAzureVTPM, anchors.RoleDocumentIntermediate)},
	} {
		if n := count(lab, attest.KindAzureVTPM, c.role); n != c.want {
			t.Errorf("--azure-vtpm-roots: %d %s anchors, want %d", n, c.role, c.want)
		}
	}
	as, err := Config{GCEVTPMIntermediatesDir: filepath.Join(dir, "inter")}.trustAnchors()
	if err != nil {
		t.Fatal(err)
	}
	expired := false
	for _, a := range as {
		if a.Cert.Equal(old.Intermediate) && a.Cert.NotAfter.Before(now) {
			expired = true
		}
	}
	if !expired {
		t.Error("the expired intermediate is not listed")
	}
}
