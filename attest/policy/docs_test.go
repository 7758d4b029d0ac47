package policy_test

import (
	"crypto"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/doctest"
)

const referenceDoc = "../../docs/policy.md"

// example is a named block of docs/policy.md, parsed.
func example(t *testing.T, name string) *policy.Policy {
	t.Helper()
	b, err := doctest.Named(referenceDoc, name)
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse([]byte(b.Text))
	if err != nil {
		t.Fatalf("docs/policy.md example:%s (line %d) does not load: %v", name, b.Line, err)
	}
	return p
}

// TestReferenceExamples: every example of the policy reference loads, and
// each admits the machines it describes and refuses the others, naming the
// setting. (The TPM example also enrols machines on a real server:
// systemtest TestPolicyReferenceTPMExample.)
func TestReferenceExamples(t *testing.T) {
	now := time.Now()
	t.Run("tpm-signers", func(t *testing.T) {
		p := example(t, "tpm-signers")
		boot := func(log string) *attest.Claims {
			bs, err := tpm.LogBootState(firmwaretestdata.MustLog(log), crypto.SHA256)
			if err != nil {
				t.Fatal(err)
			}
			return &attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{EKTrust: "ca:vendor", EKKind: attest.EKKindRSA2048, PCRBank: "sha256", Boot: bs}}
		}
		during := policy.Options{Now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
		after := policy.Options{Now: time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC)}
		if d, err := p.Decide("worker", boot("debian-12-ovmf-secure-boot"), during); err != nil || len(d.Audits) != 0 {
			t.Errorf("the Debian 12 boot the example describes: %v (audits %+v)", err, d)
		}
		if d, err := p.Decide("worker", boot("rhel8-uefi"), during); err != nil || len(d.Audits) != 1 || d.Audits[0].Reason != attest.ReasonPolicySBAT {
			t.Errorf("RHEL 8 during the rollout: %v (audits %+v); want admitted, SBATLevelOutdated audited", err, d)
		}
		if _, err := p.Decide("worker", boot("rhel8-uefi"), after); !isReason(err, attest.ReasonPolicyReferenceSetExpired) {
			t.Errorf("RHEL 8 after the rollout: %v; want %s", err, attest.ReasonPolicyReferenceSetExpired)
		}
		if _, err := p.Decide("worker", boot("sb-cert-eventlog"), during); !isReason(err, attest.ReasonPolicyBootSigner) {
			t.Errorf("Ubuntu's Canonical-signed GRUB: %v; want %s", err, attest.ReasonPolicyBootSigner)
		}
	})
	t.Run("tpm", func(t *testing.T) {
		p := example(t, "tpm")
		bs, err := tpm.LogBootState(firmwaretestdata.MustLog("rhel8-uefi"), crypto.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		claims := func(trust string) *attest.Claims {
			return &attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{EKTrust: trust, EKKind: attest.EKKindRSA2048, PCRBank: "sha256", Boot: bs}}
		}
		for pool, trust := range map[string]string{"worker": "ca:vendor", "master": "inventory"} {
			if err := p.Evaluate(pool, claims(trust)); err != nil {
				t.Errorf("%s: the RHEL 8 machine the example describes is refused: %v", pool, err)
			}
		}
		if got := p.ServeFor("worker").NodeNames; got != "requested" {
			t.Errorf("worker's serve.nodeNames %q: a vendor-certified TPM names no node", got)
		}
		off, err := tpm.LogBootState(firmwaretestdata.MustLog("ubuntu-2104-no-secure-boot"), crypto.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		c := claims("ca:vendor")
		c.TPM.Boot = off
		if r, _ := attest.ReasonOf(p.Evaluate("worker", c)); r != attest.ReasonPolicySecureBootOff {
			t.Errorf("a machine with Secure Boot off: %s, want %s", r, attest.ReasonPolicySecureBootOff)
		}
		if r, _ := attest.ReasonOf(p.Evaluate("master", claims("ca:vendor"))); r != attest.ReasonPolicyEKTrust {
			t.Errorf("a vendor-certified TPM in master: %s, want %s", r, attest.ReasonPolicyEKTrust)
		}
		b, err := doctest.Named(referenceDoc, "tpm-inventory")
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), "ek-inventory.yaml")
		if err := os.WriteFile(f, []byte(b.Text), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := tpm.LoadInventory(f); err != nil {
			t.Errorf("the inventory example does not load: %v", err)
		}
	})
	t.Run("gcp", func(t *testing.T) {
		p := example(t, "gcp")
		c := &attest.Claims{Kind: attest.KindGCP, VerifiedAt: now, Instance: &attest.InstanceClaims{Cloud: attest.CloudGCP, Account: "my-project", Location: "us-central1-b", Created: now.Add(-10 * time.Minute)}}
		if err := p.Evaluate("worker", c); err != nil {
			t.Errorf("an instance the example describes is refused: %v", err)
		}
		c.Instance.Account = "another-project"
		if err := p.Evaluate("worker", c); attest.SettingOf(err) != "pools.worker.gcp.projects" {
			t.Errorf("an instance of another project: %v; want a refusal naming pools.worker.gcp.projects", err)
		}
	})
	t.Run("gce-vtpm", func(t *testing.T) {
		p := example(t, "gce-vtpm")
		c := &attest.Claims{Kind: attest.KindGCEVTPM, VerifiedAt: now, Instance: &attest.InstanceClaims{Cloud: attest.CloudGCP, Account: "my-project", Location: "us-central1-b"},
			TPM: &attest.TPMClaims{EKTrust: "gce-ak-certificate", PCRBank: "sha256", Boot: attest.BootState{SecureBootKnown: true, SecureBoot: true}}}
		if err := p.Evaluate("worker", c); err != nil {
			t.Errorf("a Shielded VM the example describes is refused: %v", err)
		}
		c.Instance.Location = "europe-west4-a"
		if err := p.Evaluate("worker", c); attest.SettingOf(err) != "pools.worker.gcp.zones" {
			t.Errorf("a VM in another zone: %v; want a refusal naming pools.worker.gcp.zones", err)
		}
	})
	t.Run("azure-vtpm", func(t *testing.T) {
		p := example(t, "azure-vtpm")
		c := &attest.Claims{Kind: attest.KindAzureVTPM, VerifiedAt: now, Instance: &attest.InstanceClaims{Cloud: attest.CloudAzure, Account: "8d2e6c4b-1a3f-4e5d-b7c9-2f0a1e3d5b6c", ID: "5f3c8a1e-2b7d-4c9a-9e61-0d8b4a7f2c13"},
			TPM: &attest.TPMClaims{EKTrust: "azure-ak-certificate", PCRBank: "sha256", Boot: attest.BootState{SecureBootKnown: true, SecureBoot: true}}}
		if err := p.Evaluate("worker", c); err != nil {
			t.Errorf("a Trusted Launch VM the example describes is refused: %v", err)
		}
		c.Instance.Account = "0e4f1c2d-3b5a-4e6f-8a9b-0c1d2e3f4a5b"
		if err := p.Evaluate("worker", c); attest.SettingOf(err) != "pools.worker.azure.subscriptions" {
			t.Errorf("a VM of another subscription: %v; want a refusal naming pools.worker.azure.subscriptions", err)
		}
	})
	t.Run("aws", func(t *testing.T) {
		p := example(t, "aws")
		c := &attest.Claims{Kind: attest.KindAWS, Instance: &attest.InstanceClaims{Cloud: attest.CloudAWS, Account: "123456789012", Location: "us-east-1", LiveChecked: true}}
		if err := p.Evaluate("worker", c); err != nil {
			t.Errorf("an instance the example describes is refused: %v", err)
		}
		c.Instance.LiveChecked = false
		if err := p.Evaluate("worker", c); attest.SettingOf(err) != "pools.worker.aws.requireLiveCheck" {
			t.Errorf("an instance the EC2 API did not confirm: %v; want a refusal naming pools.worker.aws.requireLiveCheck", err)
		}
	})
}

// TestReferenceNamesEveryField: docs/policy.md names every field of the
// policy's types (its YAML name, in backticks), so a field added to the
// code without a word in the reference fails here.
func TestReferenceNamesEveryField(t *testing.T) {
	b, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type, string)
	walk = func(ty reflect.Type, path string) {
		for ty.Kind() == reflect.Pointer || ty.Kind() == reflect.Slice || ty.Kind() == reflect.Map {
			ty = ty.Elem()
		}
		if ty.Kind() != reflect.Struct || seen[ty] || ty == reflect.TypeOf(policy.Duration{}) {
			return
		}
		seen[ty] = true
		for i := range ty.NumField() {
			f := ty.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			if !strings.Contains(doc, "`"+name+"`") && !strings.Contains(doc, "."+name+"`") && !strings.Contains(doc, "`"+name+":") && !strings.Contains(doc, "`"+name+".") {
				t.Errorf("docs/policy.md does not name %s%s", path, name)
			}
			walk(f.Type, path+name+".")
		}
	}
	walk(reflect.TypeOf(policy.Policy{}), "")
	walk(reflect.TypeOf(tpm.InventoryEntry{}), "inventory entries.")
	if len(seen) < 10 {
		t.Fatalf("walked %d types: the policy lost its structure?", len(seen))
	}
}

func isReason(err error, r attest.Reason) bool {
	got, ok := attest.ReasonOf(err)
	return ok && got == r
}
