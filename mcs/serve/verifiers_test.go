package serve

import (
	"context"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/identity/azuretpm/azuretpmtest"
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
    azure: {subscriptions: ["8d2e6c4b-1a3f-4e5d-b7c9-2f0a1e3d5b6c"]}
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
	// A lab Azure PKI: its roots in files, its intermediates in
	// directories.
	azCA, err := azuretpmtest.NewCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	azIMDS, err := azuretpmtest.NewIMDSCA(time.Now(), "metadata.azure.com")
	if err != nil {
		t.Fatal(err)
	}
	pemFile := func(name string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	azRoot, imdsRoot := pemFile("az-root.pem", azCA.Root.Raw), pemFile("imds-root.pem", azIMDS.Root.Raw)
	pemFile("az-inter/i.pem", azCA.Intermediate.Raw)
	pemFile("imds-inter/i.pem", azIMDS.Intermediate.Raw)
	lab := func(c *Config) {
		c.AzureVTPMRoots, c.AzureIMDSRoots = azRoot, imdsRoot
		c.AzureVTPMIntermediatesDir, c.AzureIMDSIntermediatesDir = filepath.Join(dir, "az-inter"), filepath.Join(dir, "imds-inter")
	}
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
		{"the Azure vTPM on the shipped roots", nil, "[azure-vtpm]", []attest.Kind{attest.KindAzureVTPM, attest.KindTPM}},
		{"the Azure vTPM on a lab PKI", lab, "[azure-vtpm, gce-vtpm]", []attest.Kind{attest.KindAzureVTPM, attest.KindGCEVTPM, attest.KindTPM}},
		{"an Azure vTPM roots file without a certificate", func(c *Config) { c.AzureVTPMRoots = empty }, "[azure-vtpm]", nil},
		{"an IMDS roots file without a certificate", func(c *Config) { c.AzureIMDSRoots = empty }, "[azure-vtpm]", nil},
		{"a lab AK intermediate beside the pinned root it does not chain to", func(c *Config) { c.AzureVTPMIntermediatesDir = filepath.Join(dir, "az-inter") }, "[azure-vtpm]", nil},
		{"an IMDS intermediates directory that is not there", func(c *Config) { c.AzureIMDSIntermediatesDir = filepath.Join(dir, "nope") }, "[azure-vtpm]", nil},
		{"Azure's roots files, but no pool takes azure-vtpm", func(c *Config) { c.AzureVTPMRoots = empty }, "[tpm]", []attest.Kind{attest.KindTPM}},
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
	for _, k := range attest.AllKinds() {
		if rows[k] != 1 {
			t.Errorf("kind %s has %d builders, want 1", k, rows[k])
		}
		delete(rows, k)
	}
	for k := range rows {
		t.Errorf("builder for %s, a kind the policy does not take", k)
	}
}
