package policy

import (
	"bytes"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
)

// TPMPolicy is what TPM evidence must show. Every requirement that reads
// the boot state refuses claims in which the event log did not establish
// that field: an empty or partial log never satisfies it.
type TPMPolicy struct {
	// EKTrust lists what may have vouched for the EK ("ca:<name>",
	// "inventory"); required in a pool that takes TPM evidence unless
	// AnyEKTrust.
	EKTrust []string `yaml:"ekTrust"`
	// AnyEKTrust accepts an EK that any trust of the policy's trust:
	// section vouched for (its roots and inventory). Logged at start.
	AnyEKTrust bool `yaml:"anyEKTrust"`
	// EK is the one kind of endorsement key the pool accepts (EKKinds;
	// default EKRSA2048, the TCG's RSA EK with its certificate at NV
	// 0x01c00002). A TPM holds more than one EK (vendors certify an RSA
	// and an ECC one): a pool that took both would make one TPM two
	// identities, each with its own bans, enrolment and cap. Every pool of
	// a policy that takes TPM evidence names the same kind.
	EK string `yaml:"ek"`
	// AllowSHA1 accepts quotes of the SHA-1 PCR bank. Off: a machine must
	// quote SHA-256 (SHA-1 PCRs can be forged by collision).
	AllowSHA1 bool `yaml:"allowSHA1"`
	// RequireSecureBoot refuses machines that booted without UEFI Secure
	// Boot, or whose log does not say.
	RequireSecureBoot bool `yaml:"requireSecureBoot"`
	// BootComponents constrain the boot chain the event log establishes:
	// the shim, the boot loader, the kernel. Each stage of a pool that
	// takes TPM evidence lists its allowed digests or signers, or says
	// any: true.
	BootComponents BootComponents `yaml:"bootComponents"`
	// ReferenceSets are further boot chains accepted beside
	// BootComponents, each named, each optionally until a date: a
	// rollout's old and new releases at once (boot.go).
	ReferenceSets []ReferenceSet `yaml:"referenceSets"`
	// MinimumSBAT requires the SbatLevel the shim measured to revoke at
	// least these generations, by component ("shim": 4, "grub": 5).
	MinimumSBAT map[string]int `yaml:"minimumSBAT"`
	// MachineOwnerKeys, when set, refuses boot applications the shim
	// verified with a machine-owner key it does not list.
	MachineOwnerKeys *MachineOwnerKeys `yaml:"machineOwnerKeys"`
	// Audit lists rules (AuditRules) whose refusals admit the machine
	// and are reported instead (Pool.Audit: all of them).
	Audit []string `yaml:"audit"`
	// DeniedDigests are refused wherever they appear among the boot
	// applications (revoked shims, vulnerable GRUBs).
	DeniedDigests []string `yaml:"deniedDigests"`
	// DeniedSigners are certificates (PEM, or SHA-256 fingerprints) that
	// are refused wherever the log shows one verified something: a
	// Secure Boot authority (db's, the shim's vendor certificate, a MOK)
	// the firmware or the shim measured (revoked signers, as a dbx update
	// revokes them).
	DeniedSigners []string `yaml:"deniedSigners"`
	// MinimumDBX requires a dbx at least this current.
	MinimumDBX *MinimumDBX `yaml:"minimumDBX"`
	// PCRs are reference values (hex, in the quoted bank) that quoted PCRs
	// must equal.
	PCRs map[string]string `yaml:"pcrs"`
	// KernelCmdline judges the kernel command line GRUB measured: its
	// exact value (with the arguments that may vary), or words it must and
	// must not hold, or any: true (afterkernel.go). Required in a pool
	// that takes TPM evidence.
	KernelCmdline *KernelCmdline `yaml:"kernelCmdline"`
	// Grub judges what GRUB ran and read after the boot loader: the
	// commands it measured (PCR 8) and the files it read (PCR 9: grub.cfg,
	// the kernel, the initramfs), or any: true (afterkernel.go). Required
	// in a pool that takes TPM evidence.
	Grub *GrubRules `yaml:"grub"`
	// MinimumKernel refuses kernels older than a version, read from the
	// kernel images by `policy learn --efi` and mapped from their
	// digests (kernelfloor.go): a rollback under a signer rule that
	// admits every kernel its signer ever signed.
	MinimumKernel *MinimumKernel `yaml:"minimumKernel"`
	// MicrosoftCA2023, when set, requires the machine to have moved off
	// Microsoft's 2011 Secure Boot CAs, which expired in 2026, as its
	// PCR 7 shows (cacheck.go).
	MicrosoftCA2023 *MicrosoftCA2023 `yaml:"microsoftCA2023"`
	// UKI, when set, judges a boot from a unified kernel image in place
	// of GRUB's stages (uki.go).
	UKI *UKIRule `yaml:"uki"`
}

// BootComponents are the rules of each boot stage.
type BootComponents struct {
	Shim       DigestList `yaml:"shim"`
	Bootloader DigestList `yaml:"bootloader"`
	Kernel     DigestList `yaml:"kernel"`
}

// DigestList is one boot stage's rules. Allow requires the stage measured
// and its digest listed; SignedBy requires it measured and verified by a
// listed signer (a certificate, PEM, or its SHA-256 fingerprint, hex);
// with both, both must hold. Any accepts whatever was (or was not)
// measured there, unless denied. Without Allow, SignedBy or Any a stage
// refuses: empty never means any.
type DigestList struct {
	Allow    []string `yaml:"allow"`
	SignedBy []string `yaml:"signedBy"`
	Any      bool     `yaml:"any"`
	Deny     []string `yaml:"deny"`
}

// MinimumDBX says how current the UEFI revocation list must be.
type MinimumDBX struct {
	// Entries is the least number of dbx entries.
	Entries int `yaml:"entries"`
	// Contains are SHA-256 hashes (hex) the dbx must revoke.
	Contains []string `yaml:"contains"`
}

// needsLog reports whether a TPM pool has a rule only an event log can
// satisfy: Secure Boot, a boot component's allow list, a dbx minimum, the
// command line, GRUB's files and commands, a kernel floor. (Denied
// digests and PCR values need none: no log denies nothing, and PCRs are
// quoted.)
func needsLog(t *TPMPolicy) bool {
	c := t.BootComponents
	if t.UKI != nil {
		return true // the UKI's sections are read from the log
	}
	return t.RequireSecureBoot || !c.Shim.Any || !c.Bootloader.Any || !c.Kernel.Any || t.MinimumDBX != nil ||
		len(t.MinimumSBAT) > 0 || t.MachineOwnerKeys != nil || t.MinimumKernel != nil || t.MicrosoftCA2023 != nil ||
		t.KernelCmdline == nil || !t.KernelCmdline.Any || t.Grub == nil || !t.Grub.Any
}

// EKKind is the one kind of EK the pool accepts (tpm.ek; default
// attest.EKKindRSA2048).
func (t TPMPolicy) EKKind() string {
	if t.EK == "" {
		return attest.EKKindRSA2048
	}
	return t.EK
}

// evaluateTPM checks, in order: the PCR bank (SHA1BankNotAllowed), the EK
// trust (EKTrustNotAllowed), the EK's kind (EKKindNotAccepted: one TPM is
// one identity), that an event log was sent when a rule below needs one
// (EventLogMissing) — these four are never audited — then the boot rules,
// each of which e may audit (AuditRules): Secure Boot
// (SecureBootStateUnknown, SecureBootDisabled), denied digests anywhere in
// the log (BootComponentDenied), denied signers among the authorities it
// measured (BootSignerDenied), the whole boot against the pool's rules
// and the reference sets (or, in a pool with tpm.uki, the unified kernel
// image: ukiBoot, UKISectionNotAllowed, UKIExtraMeasurements and the stage
// reasons below) (bootChain: the chain's stages
// BootComponentDenied, BootComponentNotMeasured, BootComponentNotAllowed,
// BootSignerUnknown, BootSignerAmbiguous, BootSignerNotAllowed; the
// command line KernelCmdlineNotAllowed; GRUB's files GrubFileNotAllowed
// and commands GrubCommandNotAllowed; ReferenceSetExpired), the kernel's
// version (KernelBelowMinimum), the shim's SBAT level
// (SBATLevelOutdated), machine-owner keys (MachineOwnerKeyNotAllowed), the
// dbx (DBXOutdated), the move to Microsoft's 2023 Secure Boot CAs
// (SecureBootCAOutdated; before its from date, reported as an audit
// whatever the pool audits) and PCR reference values (PCRValueMismatch). Each
// refusal names the setting (in, e.g. "pools.worker.tpm.").
func evaluateTPM(in string, t *TPMPolicy, c *attest.TPMClaims, e *evaluation) error {
	if c.PCRBank != "sha256" && !(c.PCRBank == "sha1" && t.AllowSHA1) {
		return attest.DenySetting(attest.ReasonPolicySHA1, in+"allowSHA1", "quote is of the %s bank; this pool requires sha256 unless %sallowSHA1", c.PCRBank, in)
	}
	if !t.EKTrustList().Allows(c.EKTrust) {
		return attest.DenySetting(attest.ReasonPolicyEKTrust, in+"ekTrust", "EK vouched for by %s; %sekTrust accepts %v", c.EKTrust, in, t.EKTrust)
	}
	if want := t.EKKind(); c.EKKind != want {
		got := "its " + c.EKKind + " endorsement key"
		if c.EKKind == "" {
			got = "an endorsement key of no recorded kind"
		}
		return attest.DenySetting(attest.ReasonPolicyEKKind, in+"ek", "the TPM attested with %s; %sek accepts %s only: a TPM's other EK is not another identity", got, in, want)
	}
	return evaluateBoot(in, t, c, e)
}

// evaluateBoot is evaluateTPM's checks of the boot, from the event log on:
// the same for every kind whose quote and log attest/tpm verified (bare
// metal, and the cloud vTPMs, whose AK the cloud vouches for).
func evaluateBoot(in string, t *TPMPolicy, c *attest.TPMClaims, e *evaluation) error {
	b := &c.Boot
	if b.LogMissing && needsLog(t) {
		return attest.Deny(attest.ReasonEventLogMissing, "the machine sent no event log, and this pool's boot rules need one: the firmware's log did not reach its kernel (with Secure Boot off, GRUB's linux command boots the kernel without its EFI stub; linuxefi keeps the log)")
	}
	if t.RequireSecureBoot {
		if err := e.rule(RuleSecureBoot, secureBoot(in, b)); err != nil {
			return err
		}
	}
	if err := e.rule(RuleDeniedDigests, deniedDigests(in, t, b)); err != nil {
		return err
	}
	if err := e.rule(RuleDeniedSigners, deniedSigners(in, t, b)); err != nil {
		return err
	}
	if t.UKI != nil {
		if err := ukiBoot(in, t, c, e); err != nil {
			return err
		}
	} else if err := bootChain(in, t, b, e); err != nil {
		return err
	}
	if t.MinimumKernel != nil {
		if err := e.rule(RuleMinimumKernel, checkMinimumKernel(in, t.MinimumKernel, b)); err != nil {
			return err
		}
	}
	// A UKI the firmware ran has no shim to apply an SbatLevel: the rule
	// judges the boots a shim ran (uki.go).
	if len(t.MinimumSBAT) > 0 && !(t.UKI != nil && len(b.BootApplications) == 1) {
		if err := e.rule(RuleMinimumSBAT, minimumSBAT(in, t.MinimumSBAT, b)); err != nil {
			return err
		}
	}
	if t.MachineOwnerKeys != nil {
		if err := e.rule(RuleMachineOwnerKeys, machineOwnerKeys(in, t.MachineOwnerKeys, b)); err != nil {
			return err
		}
	}
	if t.MinimumDBX != nil {
		if err := e.rule(RuleMinimumDBX, minimumDBX(in, t.MinimumDBX, b)); err != nil {
			return err
		}
	}
	if m := t.MicrosoftCA2023; m != nil {
		err := microsoftCA2023(in, m, e.cas, b)
		if err != nil && m.From != nil && e.now.Before(*m.From) {
			e.audit(RuleMicrosoftCA2023, err) // not in force yet: reported
		} else if err := e.rule(RuleMicrosoftCA2023, err); err != nil {
			return err
		}
	}
	return e.rule(RulePCRs, pcrValues(in, t.PCRs, c.PCRs))
}

func secureBoot(in string, b *attest.BootState) error {
	if !b.SecureBootKnown {
		return attest.DenySetting(attest.ReasonPolicySecureBootUnk, in+"requireSecureBoot", "the event log does not establish the Secure Boot state, which %srequireSecureBoot needs", in)
	}
	if !b.SecureBoot {
		return attest.DenySetting(attest.ReasonPolicySecureBootOff, in+"requireSecureBoot", "the machine booted with Secure Boot off; %srequireSecureBoot is set", in)
	}
	return nil
}

// deniedDigests refuses a denied digest wherever the log shows it: in
// the boot chain, among PCR 2's and PCR 4's other images, among the files
// GRUB read.
func deniedDigests(in string, t *TPMPolicy, b *attest.BootState) error {
	for _, d := range images(b) {
		if containsHex(t.DeniedDigests, d) {
			return attest.DenySetting(attest.ReasonPolicyBootDenied, in+"deniedDigests", "%s, measured in this boot, is in %sdeniedDigests", d, in)
		}
	}
	return nil
}

// deniedSigners refuses a boot in which a denied certificate verified
// something: any Secure Boot authority the log measured (by the firmware
// or the shim, before the separator or after) whose fingerprint is
// listed. An authority is measured when it is used, so a listed one
// verified a boot application, a driver or an option ROM of this boot.
// Hash entries are deniedDigests' (they name images, not signers).
func deniedSigners(in string, t *TPMPolicy, b *attest.BootState) error {
	for _, a := range b.Authorities {
		if !a.Hash && containsHex(t.DeniedSigners, a.SHA256) {
			return attest.DenySetting(attest.ReasonPolicyBootSignerDenied, in+"deniedSigners", "%s verified part of this boot (measured by the %s), and %sdeniedSigners lists it", signerName(a, a.SHA256, true), a.By, in)
		}
	}
	return nil
}

func minimumDBX(in string, m *MinimumDBX, b *attest.BootState) error {
	if !b.DBXKnown {
		return attest.DenySetting(attest.ReasonPolicyDBX, in+"minimumDBX", "the event log does not establish the dbx, which %sminimumDBX needs", in)
	}
	if b.DBXEntries < m.Entries {
		return attest.DenySetting(attest.ReasonPolicyDBX, in+"minimumDBX", "dbx has %d entries; %sminimumDBX.entries requires %d", b.DBXEntries, in, m.Entries)
	}
	for _, h := range m.Contains {
		if !dbxRevokes(b.DBXSHA256s, h) {
			return attest.DenySetting(attest.ReasonPolicyDBX, in+"minimumDBX", "dbx does not revoke %s, which %sminimumDBX.contains requires", h, in)
		}
	}
	return nil
}

func pcrValues(in string, want map[string]string, got map[int]string) error {
	for _, idx := range sortedPCRKeys(want) {
		i, _ := strconv.Atoi(idx)
		g, ok := got[i]
		if !ok || !strings.EqualFold(g, want[idx]) {
			return attest.DenySetting(attest.ReasonPolicyPCRValue, in+"pcrs", "PCR %d is %s; %spcrs wants %s", i, g, in, want[idx])
		}
	}
	return nil
}

func containsHex(list []string, digest string) bool {
	return slices.ContainsFunc(list, func(s string) bool { return strings.EqualFold(s, digest) })
}

// dbxRevokes reports whether the concatenated 32-byte dbx hashes hold the
// hex SHA-256 want.
func dbxRevokes(hashes []byte, want string) bool {
	w, err := hex.DecodeString(want)
	if err != nil || len(w) != 32 {
		return false
	}
	for i := 0; i+32 <= len(hashes); i += 32 {
		if bytes.Equal(hashes[i:i+32], w) {
			return true
		}
	}
	return false
}

func sortedPCRKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return x - y
	})
	return keys
}

// EKTrustList is tpm.ekTrust with tpm.anyEKTrust.
func (t TPMPolicy) EKTrustList() AllowList {
	return AllowList{Field: ekTrustField, AnyField: "tpm.anyEKTrust", What: "EK trusts",
		Items: t.EKTrust, Any: t.AnyEKTrust, Open: "tpm.anyEKTrust: an EK any configured trust vouched for may attest"}
}

// allowList is a boot stage's allow and signedBy with its any (stage as
// the YAML names it, what as a message does): either list is a rule.
func (d DigestList) allowList(stage, what string) AllowList {
	return AllowList{Field: "tpm.bootComponents." + stage + ".allow", AnyField: "tpm.bootComponents." + stage + ".any",
		What: what + "s (their digests here, or their signers in signedBy)", Items: slices.Concat(d.Allow, d.SignedBy), Any: d.Any, Open: "tpm.bootComponents." + stage + ".any: any " + what + " not denied"}
}
