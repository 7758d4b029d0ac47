package policy_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
)

// TestMicrosoftCA2023: the rule of the move off Microsoft's 2011 Secure
// Boot CAs, on real logs: RHEL 8 on a machine of the 2011 set (db, KEK and
// the shim's verifier all 2011); a GCE TDX VM of 2024, whose db and KEK
// hold both sets (its log shows no firmware verification of a chain);
// Container-Optimized OS on TDX, whose chain Google's own db key verified
// (no Microsoft CA at all). Its from date turns refusals into audits
// until then.
func TestMicrosoftCA2023(t *testing.T) {
	rhel, tdx, cos := learned(t, "rhel8-uefi"), learned(t, "ubuntu-2404-intel-tdx"), learned(t, "cos-125-intel-tdx-secure-boot")
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	past, future := now.Add(-time.Hour).Format(time.RFC3339), now.Add(30*24*time.Hour).Format(time.RFC3339)
	for _, tc := range []struct {
		name    string
		machine policy.Learned
		rule    string
		want    attest.Reason
		setting string // the refusal's or the audit's
		audit   bool
	}{
		{name: "db: a 2011 db", machine: rhel, rule: "{db: true}", want: attest.ReasonPolicySecureBootCA, setting: "microsoftCA2023.db"},
		{name: "db: a db that holds both sets", machine: tdx, rule: "{db: true}"},
		{name: "kek: a 2011 KEK", machine: rhel, rule: "{kek: true}", want: attest.ReasonPolicySecureBootCA, setting: "microsoftCA2023.kek"},
		{name: "kek: a KEK that holds both", machine: tdx, rule: "{kek: true}"},
		{name: "chain: verified through Microsoft UEFI CA 2011", machine: rhel, rule: "{chain: true}", want: attest.ReasonPolicySecureBootCA, setting: "microsoftCA2023.chain"},
		{name: "chain: the log shows no firmware verification", machine: tdx, rule: "{chain: true}", want: attest.ReasonPolicySecureBootCA, setting: "microsoftCA2023.chain"},
		{name: "chain: the platform owner's own db key", machine: cos, rule: "{chain: true}"},
		{name: "db: no Microsoft CA in db at all", machine: cos, rule: "{db: true}", want: attest.ReasonPolicySecureBootCA, setting: "microsoftCA2023.db"},
		{name: "from in the future: reported, admitted", machine: rhel, rule: "{db: true, kek: true, from: " + future + "}", setting: "microsoftCA2023.db", audit: true},
		{name: "from passed: refused", machine: rhel, rule: "{db: true, from: " + past + "}", want: attest.ReasonPolicySecureBootCA, setting: "microsoftCA2023.db"},
		{name: "audited like any rule", machine: rhel, rule: "{chain: true}\naudit: [microsoftCA2023]", setting: "microsoftCA2023.chain", audit: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := bootPolicy(t, anyChain+"microsoftCA2023: "+tc.rule+"\n")
			d, err := p.Decide("w", claimsOf(tc.machine), policy.Options{Now: now})
			if r, _ := attest.ReasonOf(err); r != tc.want {
				t.Fatalf("decided %v; want %q", err, tc.want)
			}
			var d2 *attest.Denial
			if err != nil && (!errors.As(err, &d2) || !strings.HasSuffix(d2.Setting, tc.setting)) {
				t.Errorf("refusal %v; want one naming setting …%s", err, tc.setting)
			}
			if err != nil {
				return
			}
			i := slices.IndexFunc(d.Audits, func(a policy.Audit) bool { return a.Rule == policy.RuleMicrosoftCA2023 })
			if got := i >= 0; got != tc.audit {
				t.Fatalf("audits %+v; want an audit of the rule: %v", d.Audits, tc.audit)
			}
			if tc.audit && (d.Audits[i].Reason != attest.ReasonPolicySecureBootCA || !strings.HasSuffix(d.Audits[i].Setting, tc.setting)) {
				t.Errorf("audit %+v; want %s naming %s", d.Audits[i], attest.ReasonPolicySecureBootCA, tc.setting)
			}
		})
	}
}

// TestMicrosoftCA2023RequiresSomething: a rule that requires nothing does
// not load (it would read as a protection it is not).
func TestMicrosoftCA2023RequiresSomething(t *testing.T) {
	doc := "apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\ntrust:\n  ekRoots: [{name: vendor, dir: /x}]\npools:\n  w:\n    evidence: [tpm]\n    tpm:\n      ekTrust: [ca:vendor]\n" +
		indent(anyChain+"kernelCmdline: {any: true}\ngrub: {any: true}\nmicrosoftCA2023: {from: 2027-01-01T00:00:00Z}\n", "      ")
	if _, err := policy.Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), "requires nothing") {
		t.Fatalf("a microsoftCA2023 of no requirement loaded: %v", err)
	}
}

// TestSecureBootCAsTrust: trust.secureBootCAs loads only well formed.
func TestSecureBootCAsTrust(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name, entry, want string
	}{
		{"well formed", "{name: lab, variable: db, year: 2023, sha256: " + fp + "}", ""},
		{"no name", "{variable: db, year: 2023, sha256: " + fp + "}", "a name is required"},
		{"another variable", "{name: lab, variable: dbx, year: 2023, sha256: " + fp + "}", "want db or KEK"},
		{"another year", "{name: lab, variable: KEK, year: 2024, sha256: " + fp + "}", "want 2011 or 2023"},
		{"no fingerprint", "{name: lab, variable: db, year: 2023}", "sha256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := "apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\ntrust:\n  ekRoots: [{name: vendor, dir: /x}]\n  secureBootCAs: [" + tc.entry + "]\npools:\n  w:\n    evidence: [tpm]\n    tpm:\n      ekTrust: [ca:vendor]\n" +
				indent(anyChain+"kernelCmdline: {any: true}\ngrub: {any: true}\n", "      ")
			p, err := policy.Parse([]byte(doc))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("loaded or refused otherwise (%v); want %q", err, tc.want)
			case tc.want == "" && len(p.SecureBootCAs().Extra) != 1:
				t.Fatal("the CA is not in the policy's set")
			}
		})
	}
}
