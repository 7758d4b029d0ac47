package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// TestEvaluateVTPM: a cloud vTPM's claims are judged by the lists of its
// cloud (projects, zones; accounts, regions) and the TPM's boot rules,
// never by tpm.ekTrust; the quote must be of the kind's bank; a pool that
// takes the kind needs its cloud's lists and the boot lists (an empty one
// refuses to load).
func TestEvaluateVTPM(t *testing.T) {
	doc := `
apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
pools:
  gce:
    evidence: [gce-vtpm]
    gcp: {projects: [prod], zones: [us-central1-a]}
    tpm:
      requireSecureBoot: true
      bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {allow: ["` + strings.Repeat("ab", 32) + `"]}}
      kernelCmdline: {any: true}
      grub: {any: true}
  ec2:
    evidence: [aws-nitrotpm]
    aws: {accounts: ["111122223333"], regions: [us-east-1]}
    tpm:
      bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {allow: ["` + strings.Repeat("cd", 48) + `"]}}
      kernelCmdline: {any: true}
      grub: {any: true}
  azure:
    evidence: [azure-vtpm]
    azure: {subscriptions: ["8d2e6c4b-1a3f-4e5d-b7c9-2f0a1e3d5b6c"]}
    tpm:
      requireSecureBoot: true
      bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {allow: ["` + strings.Repeat("ab", 32) + `"]}}
      kernelCmdline: {any: true}
      grub: {any: true}
  anyazure:
    evidence: [azure-vtpm]
    azure: {anySubscription: true}
    tpm:
      bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}
      kernelCmdline: {any: true}
      grub: {any: true}
`
	p, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	gce := func() *attest.Claims {
		return &attest.Claims{Kind: attest.KindGCEVTPM, VerifiedAt: now,
			Instance: &attest.InstanceClaims{Cloud: attest.CloudGCP, Account: "prod", Location: "us-central1-a"}, // no creation time: the certificate has none
			TPM:      &attest.TPMClaims{EKTrust: "gce-ak-certificate", PCRBank: "sha256", Boot: attest.BootState{SecureBootKnown: true, SecureBoot: true, BootApplications: []string{"shim", "grub", strings.Repeat("ab", 32)}}}}
	}
	nitro := func() *attest.Claims {
		return &attest.Claims{Kind: attest.KindNitroTPM, VerifiedAt: now,
			Instance: &attest.InstanceClaims{Cloud: attest.CloudAWS, Account: "111122223333", Location: "us-east-1"},
			TPM:      &attest.TPMClaims{EKTrust: "nitro-document", PCRBank: "sha384", Boot: attest.BootState{BootApplications: []string{"shim", "grub", strings.Repeat("cd", 48)}}}}
	}
	azure := func() *attest.Claims {
		return &attest.Claims{Kind: attest.KindAzureVTPM, VerifiedAt: now,
			Instance: &attest.InstanceClaims{Cloud: attest.CloudAzure, Account: "8d2e6c4b-1a3f-4e5d-b7c9-2f0a1e3d5b6c", ID: "5f3c8a1e-2b7d-4c9a-9e61-0d8b4a7f2c13"}, // no location: the document names none
			TPM:      &attest.TPMClaims{EKTrust: "azure-ak-certificate", PCRBank: "sha256", Boot: attest.BootState{SecureBootKnown: true, SecureBoot: true, BootApplications: []string{"shim", "grub", strings.Repeat("ab", 32)}}}}
	}
	cases := []struct {
		name    string
		pool    string
		claims  *attest.Claims
		mutate  func(c *attest.Claims)
		want    attest.Reason
		setting string
	}{
		{"GCE vTPM", "gce", gce(), func(*attest.Claims) {}, "", ""},
		{"GCE vTPM of another project", "gce", gce(), func(c *attest.Claims) { c.Instance.Account = "dev" }, attest.ReasonPolicyProject, "pools.gce.gcp.projects"},
		{"GCE vTPM in another zone", "gce", gce(), func(c *attest.Claims) { c.Instance.Location = "europe-west1-b" }, attest.ReasonPolicyZone, "pools.gce.gcp.zones"},
		{"GCE vTPM booted with Secure Boot off", "gce", gce(), func(c *attest.Claims) { c.TPM.Boot.SecureBoot = false }, attest.ReasonPolicySecureBootOff, "pools.gce.tpm.requireSecureBoot"},
		{"GCE vTPM booted another kernel", "gce", gce(), func(c *attest.Claims) { c.TPM.Boot.BootApplications[2] = strings.Repeat("ef", 32) }, attest.ReasonPolicyBootNotAllowed, "pools.gce.tpm.bootComponents.kernel.allow"},
		{"GCE vTPM quoting SHA-1", "gce", gce(), func(c *attest.Claims) { c.TPM.PCRBank = "sha1" }, attest.ReasonPolicySHA1, "pools.gce.tpm.allowSHA1"},
		{"GCE vTPM claims without the instance", "gce", gce(), func(c *attest.Claims) { c.Instance = nil }, attest.ReasonMalformed, ""},
		{"GCE vTPM in a Nitro pool", "ec2", gce(), func(*attest.Claims) {}, attest.ReasonPolicyKindNotAllowed, "pools.ec2.evidence"},
		{"NitroTPM", "ec2", nitro(), func(*attest.Claims) {}, "", ""},
		{"NitroTPM of another account", "ec2", nitro(), func(c *attest.Claims) { c.Instance.Account = "444455556666" }, attest.ReasonPolicyAccount, "pools.ec2.aws.accounts"},
		{"NitroTPM in another region", "ec2", nitro(), func(c *attest.Claims) { c.Instance.Location = "eu-west-1" }, attest.ReasonPolicyRegion, "pools.ec2.aws.regions"},
		{"NitroTPM quoting SHA-256", "ec2", nitro(), func(c *attest.Claims) { c.TPM.PCRBank = "sha256" }, attest.ReasonPolicySHA1, "pools.ec2.tpm.allowSHA1"},
		{"NitroTPM booted another kernel", "ec2", nitro(), func(c *attest.Claims) { c.TPM.Boot.BootApplications[2] = strings.Repeat("ef", 48) }, attest.ReasonPolicyBootNotAllowed, "pools.ec2.tpm.bootComponents.kernel.allow"},
		{"Azure vTPM", "azure", azure(), func(*attest.Claims) {}, "", ""},
		{"Azure vTPM of another subscription", "azure", azure(), func(c *attest.Claims) { c.Instance.Account = "0e4f1c2d-3b5a-4e6f-8a9b-0c1d2e3f4a5b" }, attest.ReasonPolicySubscription, "pools.azure.azure.subscriptions"},
		{"Azure vTPM of the subscription upper-cased", "azure", azure(), func(c *attest.Claims) { c.Instance.Account = strings.ToUpper(c.Instance.Account) }, attest.ReasonPolicySubscription, "pools.azure.azure.subscriptions"},
		{"Azure vTPM of any subscription", "anyazure", azure(), func(c *attest.Claims) { c.Instance.Account = "0e4f1c2d-3b5a-4e6f-8a9b-0c1d2e3f4a5b" }, "", ""},
		{"Azure vTPM booted with Secure Boot off", "azure", azure(), func(c *attest.Claims) { c.TPM.Boot.SecureBoot = false }, attest.ReasonPolicySecureBootOff, "pools.azure.tpm.requireSecureBoot"},
		{"Azure vTPM booted another kernel", "azure", azure(), func(c *attest.Claims) { c.TPM.Boot.BootApplications[2] = strings.Repeat("ef", 32) }, attest.ReasonPolicyBootNotAllowed, "pools.azure.tpm.bootComponents.kernel.allow"},
		{"Azure vTPM quoting SHA-1", "azure", azure(), func(c *attest.Claims) { c.TPM.PCRBank = "sha1" }, attest.ReasonPolicySHA1, "pools.azure.tpm.allowSHA1"},
		{"Azure vTPM claims of a GCP instance", "azure", azure(), func(c *attest.Claims) { c.Instance.Cloud = attest.CloudGCP }, attest.ReasonMalformed, ""},
		{"Azure vTPM claims without the TPM", "azure", azure(), func(c *attest.Claims) { c.TPM = nil }, attest.ReasonMalformed, ""},
		{"Azure vTPM in a GCE pool", "gce", azure(), func(*attest.Claims) {}, attest.ReasonPolicyKindNotAllowed, "pools.gce.evidence"},
		{"GCE vTPM in an Azure pool", "azure", gce(), func(*attest.Claims) {}, attest.ReasonPolicyKindNotAllowed, "pools.azure.evidence"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.mutate(tc.claims)
			err := p.Evaluate(tc.pool, tc.claims)
			if got, _ := attest.ReasonOf(err); (tc.want == "") != (err == nil) || got != tc.want {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if got := attest.SettingOf(err); got != tc.setting {
				t.Errorf("setting %q, want %q", got, tc.setting)
			}
		})
	}
	for name, pool := range map[string]string{
		"GCE vTPM pool without projects":         "evidence: [gce-vtpm]\n    gcp: {zones: [a]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}}",
		"GCE vTPM pool without zones":            "evidence: [gce-vtpm]\n    gcp: {projects: [p]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}}",
		"NitroTPM pool without accounts":         "evidence: [aws-nitrotpm]\n    aws: {regions: [r]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}}",
		"NitroTPM pool without regions":          "evidence: [aws-nitrotpm]\n    aws: {accounts: [a]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}}",
		"NitroTPM pool with no kernel listed":    "evidence: [aws-nitrotpm]\n    aws: {accounts: [a], regions: [r]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}}}",
		"Azure vTPM pool without an azure block": "evidence: [azure-vtpm]\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}",
		"Azure vTPM pool with no subscriptions":  "evidence: [azure-vtpm]\n    azure: {subscriptions: []}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}",
		"Azure vTPM pool with a list and any":    "evidence: [azure-vtpm]\n    azure: {subscriptions: [s], anySubscription: true}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}",
		"Azure vTPM pool with no kernel listed":  "evidence: [azure-vtpm]\n    azure: {subscriptions: [s]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}",
		"Azure vTPM pool with a location list":   "evidence: [azure-vtpm]\n    azure: {subscriptions: [s], locations: [westeurope]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}",
	} {
		if _, err := Parse([]byte("apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\npools:\n  p:\n    " + pool + "\n")); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	// No tpm.ekTrust needed: the cloud vouches for the AK.
	if _, err := Parse([]byte("apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\npools:\n  p:\n    evidence: [gce-vtpm]\n    gcp: {projects: [p], zones: [z]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}\n")); err != nil {
		t.Errorf("a GCE vTPM pool without tpm.ekTrust: %v", err)
	}
	if _, err := Parse([]byte("apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\npools:\n  p:\n    evidence: [azure-vtpm]\n    azure: {subscriptions: [s]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}\n")); err != nil {
		t.Errorf("an Azure vTPM pool without tpm.ekTrust: %v", err)
	}
}
