package policy_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/internal/attacktable"
)

// TestBootPolicyAttacks: root on a genuine machine of a pool whose boot
// rules say what they mean (Secure Boot; the shim signed by Microsoft's
// UEFI CA, GRUB and the kernel by Debian's CA; SbatLevel at least shim 4,
// grub 5; no machine-owner key) changes what it boots. Each machine is
// the real Debian 12 live boot's claims as attest/tpm's state machine
// reads them, changed as that machine's log would show the change (the
// state machine's own attack tests, attest/tpm, hold the log to it).
func TestBootPolicyAttacks(t *testing.T) {
	base := learned(t, "debian-12-ovmf-secure-boot")
	const ownKey = "2222222222222222222222222222222222222222222222222222222222222222"
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	rules := signers(microsoftUEFICA, debianCA, debianCA) + "requireSecureBoot: true\nminimumSBAT: {shim: 4, grub: 5}\nmachineOwnerKeys: {allow: []}\n"
	noKernelSigner := "bootComponents:\n  shim: {signedBy: [" + microsoftUEFICA + "]}\n  bootloader: {signedBy: [" + debianCA + "]}\n  kernel: {any: true}\nmachineOwnerKeys: {allow: []}\n"

	// mutate copies the machine's boot state deeply enough to change it.
	mutate := func(f func(b *attest.BootState)) policy.Learned {
		l := base
		b := l.Boot
		b.Authorities = slices.Clone(b.Authorities)
		b.AppVerifications = slices.Clone(b.AppVerifications)
		for i := range b.AppVerifications {
			b.AppVerifications[i].Signers = slices.Clone(b.AppVerifications[i].Signers)
		}
		st := *b.ShimState
		b.ShimState = &st
		f(&b)
		l.Boot = b
		return l
	}
	// shimAuthority adds an authority the shim measured and makes it a
	// possible signer of the kernel (alone, or beside what verified it).
	shimAuthority := func(variable, sha string, alone, grubToo bool) func(b *attest.BootState) {
		return func(b *attest.BootState) {
			b.Authorities = append(b.Authorities, attest.SecureBootAuthority{Variable: variable, By: attest.VerifierShim, SHA256: sha, Subject: "CN=root's own key"})
			for i := 2; i < len(b.AppVerifications); i++ {
				if alone {
					b.AppVerifications[i].Signers = []string{sha}
				} else {
					b.AppVerifications[i].Signers = append(b.AppVerifications[i].Signers, sha)
				}
			}
			if grubToo {
				b.AppVerifications[1].Signers = []string{sha}
			}
			b.ShimState.MokListOnly = ""
		}
	}
	past := now.Add(-time.Hour).Format(time.RFC3339)
	rollout := "bootComponents:\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {allow: [" + otherKey + "]}\nreferenceSets:\n- name: previous\n  notAfter: " + past + "\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {signedBy: [" + debianCA + "]}\n"

	cases := []struct {
		attack  string
		tpm     string
		machine policy.Learned
		want    attest.Reason
	}{
		{"boots GRUB and a kernel signed by its own key in db (test-db-all)", rules,
			mutate(shimAuthority("db", ownKey, true, true)), attest.ReasonPolicyBootSigner},
		{"boots a kernel signed by a db key beside the vendor's certificate (or forges the vendor's authority beside its own): the log cannot say which verified it", rules,
			mutate(shimAuthority("db", ownKey, false, false)), attest.ReasonBootSignerAmbiguous},
		{"enrols a machine-owner key and boots a kernel it signed, where no kernel signer is pinned", noKernelSigner,
			mutate(shimAuthority("MokListRT", ownKey, true, false)), attest.ReasonPolicyMOK},
		{"enrols a MOK beside the vendor certificate: GRUB's MokListRT authority may be either", noKernelSigner,
			mutate(func(b *attest.BootState) { b.ShimState.MokListOnly = "" }), attest.ReasonPolicyMOK},
		{"rolls SBAT back: a shim that applies the original SbatLevel, to boot a revoked GRUB", rules,
			mutate(func(b *attest.BootState) { b.ShimState.SBATDate, b.ShimState.SBAT = "2021030218", map[string]int{} }), attest.ReasonPolicySBAT},
		{"boots an old shim that measures no SbatLevel", rules,
			mutate(func(b *attest.BootState) { b.ShimState.SBATLevelKnown, b.ShimState.SBAT = false, nil }), attest.ReasonPolicySBAT},
		{"turns the shim's validation off (mokutil --disable-validation)", rules,
			mutate(func(b *attest.BootState) {
				b.ShimState.ValidationDisabled = true
				for i := 1; i < len(b.AppVerifications); i++ {
					b.AppVerifications[i] = attest.AppVerification{}
				}
			}), attest.ReasonBootSignerUnknown},
		{"boots a GRUB its signer signed but a dbx update revoked, under a signer rule that admits all its signer signed (policy revoke --dbx-update)", rules + "deniedDigests: [" + base.Boot.BootApplications[attest.StageBootloader] + "]\n",
			base, attest.ReasonPolicyBootDenied},
		{"boots a chain verified by a CA a dbx update revoked, which the stages' signedBy still lists", rules + "deniedSigners: [" + debianCA + "]\n",
			base, attest.ReasonPolicyBootSignerDenied},
		{"hides a revoked signer beside another authority, so the log cannot say which verified the kernel", noKernelSigner + "deniedSigners: [" + ownKey + "]\n",
			mutate(shimAuthority("db", ownKey, false, false)), attest.ReasonPolicyBootSignerDenied},
		{"keeps its firmware's dbx without the update, to stay able to boot what it revokes (policy revoke --require-dbx)", rules + "minimumDBX: {contains: [" + otherKey + "]}\n",
			base, attest.ReasonPolicyDBX},
		{"boots the previous release after its reference set's notAfter", rollout, base, attest.ReasonPolicyReferenceSetExpired},
		{"an EK the pool does not trust, in a pool whose boot rules all audit", "ekTrust: [inventory]\n" + rules + "audit: [requireSecureBoot, bootComponents, minimumSBAT, machineOwnerKeys]\n",
			base, attest.ReasonPolicyEKTrust},
	}
	for _, c := range cases {
		t.Run(c.attack, func(t *testing.T) {
			p := bootPolicy(t, c.tpm)
			_, err := p.Decide("w", claimsOf(c.machine), policy.Options{Now: now})
			got, _ := attest.ReasonOf(err)
			attacktable.Check(t, "TPM boot policy", c.attack, string(c.want), string(got))
		})
	}
}
