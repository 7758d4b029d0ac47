package serve

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
)

// TestVerifiers: the registry holds the kinds the policy takes (TPM's
// always), each cloud vTPM built from the shipped roots unless a roots file
// replaces them; a roots file that holds no certificate, or an
// intermediates directory that does not exist, stops the server.
func TestVerifiers(t *testing.T) {
	pool := func(kinds string) *policy.Policy {
		p, err := policy.Parse([]byte(`apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
pools:
  worker:
    evidence: ` + kinds + `
    gcp: {projects: [p], zones: [z]}
    aws: {accounts: ["123456789012"], regions: [us-east-1]}
    tpm:
      anyEKTrust: true
      bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}
      kernelCmdline: {any: true}
      grub: {any: true}
`))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c := Config{Clock: time.Now}
	cases := []struct {
		name  string
		edit  func(*Config)
		kinds string
		want  []attest.Kind // nil: an error
	}{
		{"the cloud vTPMs on the shipped roots", nil, "[gce-vtpm, aws-nitrotpm]", []attest.Kind{attest.KindNitroTPM, attest.KindGCEVTPM, attest.KindTPM}},
		{"AIA allowed", func(c *Config) { c.GCEVTPMAIAHosts = []string{"pki.goog"} }, "[gce-vtpm]", []attest.Kind{attest.KindGCEVTPM, attest.KindTPM}},
		{"aws and its NitroTPM", nil, "[aws, aws-nitrotpm]", []attest.Kind{attest.KindAWS, attest.KindNitroTPM, attest.KindTPM}},
		{"no cloud kind", nil, "[tpm]", []attest.Kind{attest.KindTPM}},
		{"a GCE roots file without a certificate", func(c *Config) { c.GCEVTPMRoots = empty }, "[gce-vtpm]", nil},
		{"a Nitro roots file without a certificate", func(c *Config) { c.NitroTPMRoots = empty }, "[aws-nitrotpm]", nil},
		{"an intermediates directory that is not there", func(c *Config) { c.GCEVTPMIntermediatesDir = filepath.Join(dir, "nope") }, "[gce-vtpm]", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cc := c
			if tc.edit != nil {
				tc.edit(&cc)
			}
			r, err := cc.verifiers(context.Background(), pool(tc.kinds))
			if tc.want == nil {
				if err == nil {
					t.Fatalf("built %v", r.Kinds())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := r.Kinds()
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("kinds %v, want %v", got, want)
			}
		})
	}
}

// TestBuildersCoverKinds: every kind a policy may take (attest/policy's
// table of kinds) has exactly one builder, and no builder is for a kind
// the policy does not know.
func TestBuildersCoverKinds(t *testing.T) {
	rows := map[attest.Kind]int{}
	for _, b := range builders {
		rows[b.kind]++
	}
	for _, k := range policy.Kinds() {
		if rows[k] != 1 {
			t.Errorf("kind %s has %d builders, want 1", k, rows[k])
		}
		delete(rows, k)
	}
	for k := range rows {
		t.Errorf("builder for %s, a kind the policy does not take", k)
	}
}
