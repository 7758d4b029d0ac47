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
		"GCE vTPM pool without projects":      "evidence: [gce-vtpm]\n    gcp: {zones: [a]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}}",
		"GCE vTPM pool without zones":         "evidence: [gce-vtpm]\n    gcp: {projects: [p]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}}",
		"NitroTPM pool without accounts":      "evidence: [aws-nitrotpm]\n    aws: {regions: [r]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}}",
		"NitroTPM pool without regions":       "evidence: [aws-nitrotpm]\n    aws: {accounts: [a]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}}",
		"NitroTPM pool with no kernel listed": "evidence: [aws-nitrotpm]\n    aws: {accounts: [a], regions: [r]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}}}",
	} {
		if _, err := Parse([]byte("apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\npools:\n  p:\n    " + pool + "\n")); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	// No tpm.ekTrust needed: the cloud vouches for the AK.
	if _, err := Parse([]byte("apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\npools:\n  p:\n    evidence: [gce-vtpm]\n    gcp: {projects: [p], zones: [z]}\n    tpm: {bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}\n")); err != nil {
		t.Errorf("a GCE vTPM pool without tpm.ekTrust: %v", err)
	}
}
