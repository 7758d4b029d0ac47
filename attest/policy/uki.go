package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
)

// UKIRule judges a boot from a unified kernel image (UKI): one signed PE
// holding the kernel, the initramfs and the command line, which
// systemd-stub runs and measures (PCR 11: each section's name and
// content). Its signature covers all three, so a signer rule on the UKI
// judges the whole boot after the firmware and survives updates: a new
// UKI signed by the same key is admitted without a policy change. A pool
// with tpm.uki has no GRUB stage: bootComponents.bootloader and .kernel,
// kernelCmdline, grub, referenceSets and minimumKernel are not set
// (validate says so).
type UKIRule struct {
	// Allow, SignedBy, Any and Deny judge the UKI image as a boot stage's
	// rules do (DigestList): its Authenticode digest as measured into
	// PCR 4, the Secure Boot authority that verified it.
	Allow    []string `yaml:"allow"`
	SignedBy []string `yaml:"signedBy"`
	Any      bool     `yaml:"any"`
	Deny     []string `yaml:"deny"`
	// Sections, when set, pins sections' contents: each listed section
	// (".cmdline", ".initrd", ".osrel", …) must have been measured with
	// one of the listed SHA-256 digests (hex). Optional: a signer rule
	// already covers them; a pin narrows a signer's UKIs to these.
	Sections map[string][]string `yaml:"sections"`
}

// ukiList is tpm.uki's allow and signedBy with its any.
func (u *UKIRule) ukiList() AllowList {
	return AllowList{Field: "tpm.uki.allow", AnyField: "tpm.uki.any", What: "unified kernel images (their digests here, or their signers in signedBy)",
		Items: slices.Concat(u.Allow, u.SignedBy), Any: u.Any, Open: "tpm.uki.any: any unified kernel image not denied"}
}

// ukiWhat names a UKI in signedBy's messages.
const ukiWhat = "unified kernel image"

// check validates a pool's tpm.uki: the stages, rules and sets a UKI
// boot does not have are unset, digests are digests, sections are
// sections systemd-stub measures.
func (u *UKIRule) check(t *TPMPolicy) error {
	c := t.BootComponents
	for _, unset := range []struct {
		field string
		set   bool
	}{
		{"bootComponents.bootloader", !emptyStage(c.Bootloader)},
		{"bootComponents.kernel", !emptyStage(c.Kernel)},
		{"kernelCmdline", t.KernelCmdline != nil},
		{"grub", t.Grub != nil},
		{"referenceSets", len(t.ReferenceSets) > 0},
		{"minimumKernel", t.MinimumKernel != nil},
	} {
		if unset.set {
			return fmt.Errorf("tpm.uki and tpm.%s: a UKI boot has no GRUB and no separate kernel stage; the UKI's signer (tpm.uki.signedBy) covers its kernel, initramfs and command line, and tpm.uki.sections pins them", unset.field)
		}
	}
	for _, l := range [][]string{u.Allow, u.Deny} {
		for _, d := range l {
			if err := checkHex(d); err != nil {
				return fmt.Errorf("tpm.uki: %w", err)
			}
		}
	}
	if _, err := fingerprints("tpm.uki.signedBy", u.SignedBy); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(u.Sections)) {
		if !slices.Contains(ukiSectionNames, name) {
			return fmt.Errorf("tpm.uki.sections: %q is not a section systemd-stub measures (%s)", name, strings.Join(ukiSectionNames, ", "))
		}
		if len(u.Sections[name]) == 0 {
			return fmt.Errorf("tpm.uki.sections[%s] is empty: list its digests, or leave the section out (an empty list does not mean any)", name)
		}
		for _, d := range u.Sections[name] {
			if err := checkHex(d); err != nil {
				return fmt.Errorf("tpm.uki.sections[%s]: %w", name, err)
			}
		}
	}
	return nil
}

// ukiSectionNames are the sections systemd-stub measures into PCR 11
// (attest/tpm.UKISectionOrder; .pcrsig is never measured).
var ukiSectionNames = []string{".linux", ".osrel", ".cmdline", ".initrd", ".ucode", ".splash", ".dtb", ".uname", ".sbat", ".pcrpkey"}

func emptyStage(d DigestList) bool {
	return len(d.Allow) == 0 && len(d.SignedBy) == 0 && !d.Any && len(d.Deny) == 0
}

// ukiBoot judges a UKI boot (the pool has tpm.uki), in order:
//   - the boot chain's shape: one boot application, the UKI, which the
//     firmware ran; or two, a shim (judged by bootComponents.shim, which
//     must then say what it allows) and the UKI it ran. Any other count
//     is BootComponentNotAllowed (a boot loader between, or an image
//     appended after boot);
//   - the UKI by tpm.uki's allow, signedBy, any and deny, as a boot
//     stage (BootComponentDenied, BootComponentNotMeasured,
//     BootComponentNotAllowed, BootSignerUnknown, BootSignerAmbiguous,
//     BootSignerNotAllowed);
//   - PCR 11 established the UKI's sections (UKISectionNotAllowed), and
//     each section tpm.uki.sections pins was measured with a listed
//     digest (UKISectionNotAllowed);
//   - PCRs 12 and 13 quoted at their reset value (all zeros): nothing the
//     UKI's signature does not cover — a command line the boot loader
//     passed, credentials, system extensions — was measured
//     (UKIExtraMeasurements).
//
// Each is the rule "uki" (tpm.audit may name it). The pool's other rules
// (Secure Boot, denied digests and signers, dbx, the 2023 CAs, PCRs)
// judge a UKI boot as any; minimumSBAT and machineOwnerKeys only a boot a
// shim ran (a UKI the firmware ran has no shim to apply them).
func ukiBoot(in string, t *TPMPolicy, c *attest.TPMClaims, e *evaluation) error {
	return e.rule(RuleUKI, checkUKI(in, t, c))
}

func checkUKI(in string, t *TPMPolicy, c *attest.TPMClaims) error {
	b := &c.Boot
	u := t.UKI
	at := in + "uki."
	apps := b.BootApplications
	ukiAt := len(apps) - 1
	switch len(apps) {
	case 0:
		return attest.DenySetting(attest.ReasonPolicyBootMissing, at+"signedBy", "no boot application was measured into PCR 4, and %s judges the unified kernel image the firmware ran", strings.TrimSuffix(at, "."))
	case 1:
	case 2:
		if err := checkStage(in+"bootComponents.shim.", chainStages[0], t.BootComponents.Shim, b); err != nil {
			return err
		}
	default:
		return attest.DenySetting(attest.ReasonPolicyBootNotAllowed, strings.TrimSuffix(at, "."), "the boot ran %d applications; a pool with %s boots the unified kernel image from the firmware (one application) or from a shim (two)", len(apps), strings.TrimSuffix(at, "."))
	}
	if err := checkUKIImage(at, u, b, ukiAt); err != nil {
		return err
	}
	if !b.UKISectionsKnown {
		return attest.DenySetting(attest.ReasonPolicyUKISections, strings.TrimSuffix(at, "."), "PCR 11 does not establish the unified kernel image's sections (it did not replay, or is not systemd-stub's measurements of a UKI's sections in order, each once, .linux among them)")
	}
	for _, name := range slices.Sorted(maps.Keys(u.Sections)) {
		got, ok := b.UKISection(name)
		switch {
		case !ok:
			return attest.DenySetting(attest.ReasonPolicyUKISections, at+"sections", "the unified kernel image has no %s section measured, which %ssections[%s] pins", name, at, name)
		case !containsHex(u.Sections[name], got):
			return attest.DenySetting(attest.ReasonPolicyUKISections, at+"sections", "the unified kernel image's %s is %s, which %ssections[%s] does not list", name, got, at, name)
		}
	}
	for _, i := range []int{12, 13} {
		v, ok := c.PCRs[i]
		if !ok || strings.Trim(v, "0") != "" {
			what := map[int]string{12: "a command line the boot loader passed, or credentials", 13: "system extensions"}[i]
			return attest.DenySetting(attest.ReasonPolicyUKIExtended, strings.TrimSuffix(at, "."), "PCR %d is %q, not its reset value: %s measured beside the unified kernel image, which its signature does not cover", i, v, what)
		}
	}
	return nil
}

// checkUKIImage judges boot application i, the UKI, by u's stage rules.
func checkUKIImage(at string, u *UKIRule, b *attest.BootState, i int) error {
	digest := b.BootApplications[i]
	if containsHex(u.Deny, digest) {
		return attest.DenySetting(attest.ReasonPolicyBootDenied, at+"deny", "unified kernel image %s is in %sdeny", digest, at)
	}
	if u.Any {
		return nil
	}
	if len(u.Allow) == 0 && len(u.SignedBy) == 0 {
		return attest.DenySetting(attest.ReasonPolicyBootNotAllowed, at+"allow", "the pool allows no unified kernel image: %sallow and signedBy are empty (an empty list allows none; any: true allows any)", at)
	}
	if len(u.Allow) > 0 && !containsHex(u.Allow, digest) {
		return attest.DenySetting(attest.ReasonPolicyBootNotAllowed, at+"allow", "unified kernel image %s (boot application %d) is not in %sallow", digest, i, at)
	}
	if len(u.SignedBy) > 0 {
		return signedBy(at+"signedBy", ukiWhat, u.SignedBy, b, i)
	}
	return nil
}
