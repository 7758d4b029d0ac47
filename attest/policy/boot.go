package policy

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// ReferenceSet is a whole boot accepted beside the pool's own rules
// (bootComponents, kernelCmdline, grub): during a rollout, the release
// being replaced and the one replacing it — its boot chain, and the
// command line, grub.cfg and initramfs that go with it. Its stages read
// as bootComponents' do.
type ReferenceSet struct {
	// Name names the set in refusals and audit reports (a release, a
	// build). Required, unique in the pool.
	Name string `yaml:"name"`
	// NotAfter, when set, is when the set stops being accepted (RFC 3339):
	// a boot only it matches is then refused ReferenceSetExpired.
	NotAfter *time.Time `yaml:"notAfter"`
	// Shim, Bootloader and Kernel are the set's stage rules.
	Shim       DigestList `yaml:"shim"`
	Bootloader DigestList `yaml:"bootloader"`
	Kernel     DigestList `yaml:"kernel"`
	// KernelCmdline and Grub are the set's, when set; else the pool's.
	KernelCmdline *KernelCmdline `yaml:"kernelCmdline"`
	Grub          *GrubRules     `yaml:"grub"`
}

// MachineOwnerKeys is what machine-owner keys (MOKs: certificates an
// operator enrolled into the shim's MokList) may verify a boot
// application.
type MachineOwnerKeys struct {
	// Allow lists the MOKs (PEM certificates, or SHA-256 fingerprints)
	// that may verify a boot application. Empty refuses every boot the
	// shim verified with a MOK.
	Allow []string `yaml:"allow"`
}

// A boot chain's stages: the setting's name, what a message calls it, and
// the rules of a set.
type chainStage struct {
	key, what string
	list      func(BootComponents) DigestList
}

var chainStages = []chainStage{
	{"shim", "shim", func(c BootComponents) DigestList { return c.Shim }},
	{"bootloader", "boot loader", func(c BootComponents) DigestList { return c.Bootloader }},
	{"kernel", "kernel", func(c BootComponents) DigestList { return c.Kernel }},
}

// stageApps returns the indexes of BootApplications that are a stage,
// by position in the boot chain (PCR 2's and PCR 4's own sequences, which
// the quote proves): the shim the first, the boot loader the second, the
// kernel every later one (GRUB has the shim verify the kernel, then the
// firmware loads it: the same image twice; and root appending an image
// after boot only adds one the kernel's rule must accept).
func stageApps(b *attest.BootState, key string) []int {
	n := len(b.BootApplications)
	switch key {
	case "shim":
		if n > attest.StageShim {
			return []int{attest.StageShim}
		}
	case "bootloader":
		if n > attest.StageBootloader {
			return []int{attest.StageBootloader}
		}
	case "kernel":
		var idx []int
		for i := attest.StageKernel; i < n; i++ {
			idx = append(idx, i)
		}
		return idx
	}
	return nil
}

// images are every image digest the log shows (the boot chain, PCR 2's
// and PCR 4's other images), every file GRUB read and every section of a
// UKI systemd-stub measured: where a denied digest refuses.
func images(b *attest.BootState) []string {
	out := slices.Concat(b.BootApplications, b.OtherImages)
	for _, f := range slices.Concat(b.GrubFiles, b.UKISections) {
		out = append(out, f.Digest)
	}
	return out
}

// bootSet is one whole boot a pool accepts: bootComponents with the
// pool's kernelCmdline and grub, or a reference set.
type bootSet struct {
	name, at string // at: where its settings are (pools.p.tpm. or …referenceSets[i].)
	comps    BootComponents
	cmdline  *KernelCmdline
	cmdAt    string
	grub     *GrubRules
	grubAt   string
	expired  *time.Time
}

// setCheck is one rule of a set: its audit name and its check.
type setCheck struct {
	rule  string
	check func(s *bootSet, b *attest.BootState) error
}

// setChecks are a set's rules in the order they judge: the chain's
// stages, the command line, the files GRUB read, its commands.
var setChecks = func() []setCheck {
	var out []setCheck
	for _, st := range chainStages {
		st := st
		out = append(out, setCheck{RuleBootComponents + "." + st.key, func(s *bootSet, b *attest.BootState) error {
			return checkStage(s.at+st.key+".", st, st.list(s.comps), b)
		}})
	}
	return append(out,
		setCheck{RuleKernelCmdline, func(s *bootSet, b *attest.BootState) error { return checkKernelCmdline(s.cmdAt, s.cmdline, b) }},
		setCheck{RuleGrubFiles, func(s *bootSet, b *attest.BootState) error { return checkGrubFiles(s.grubAt, s.grub, b) }},
		setCheck{RuleGrubCommands, func(s *bootSet, b *attest.BootState) error { return checkGrubCommands(s.grubAt, s.grub, b) }},
	)
}()

// sets are the pool's whole boots: its own rules first, then each
// reference set (a set without a command line or grub rules of its own
// takes the pool's).
func sets(in string, t *TPMPolicy, now time.Time) []bootSet {
	out := []bootSet{{name: "bootComponents", at: in + "bootComponents.", comps: t.BootComponents,
		cmdline: t.KernelCmdline, cmdAt: in + "kernelCmdline", grub: t.Grub, grubAt: in + "grub"}}
	for i, r := range t.ReferenceSets {
		at := fmt.Sprintf("%sreferenceSets[%d].", in, i)
		s := bootSet{name: r.Name, at: at, comps: BootComponents{Shim: r.Shim, Bootloader: r.Bootloader, Kernel: r.Kernel},
			cmdline: t.KernelCmdline, cmdAt: in + "kernelCmdline", grub: t.Grub, grubAt: in + "grub"}
		if r.KernelCmdline != nil {
			s.cmdline, s.cmdAt = r.KernelCmdline, at+"kernelCmdline"
		}
		if r.Grub != nil {
			s.grub, s.grubAt = r.Grub, at+"grub"
		}
		if r.NotAfter != nil && (now.IsZero() || now.After(*r.NotAfter)) {
			s.expired = r.NotAfter
		}
		out = append(out, s)
	}
	return out
}

// bootChain checks the whole boot — the chain's stages, the kernel
// command line, the files GRUB read and its commands — against the pool's
// own rules and each reference set: it passes when one set matches
// entirely; a set whose notAfter has passed (at e.now) no longer counts.
// A rule audited (e) does not stop a set matching: when no set matches
// outright, the first set that matches but for audited rules admits the
// machine, and its rules' refusals are reported. Otherwise the refusal is
// the pool's own rules' first (ReferenceSetExpired when an expired set
// alone would have matched). A stage's denied digests refuse in every
// set, wherever the digest appears.
func bootChain(in string, t *TPMPolicy, b *attest.BootState, e *evaluation) error {
	all := images(b)
	// Denied digests of bootComponents refuse whatever set matches.
	for _, st := range chainStages {
		d := st.list(t.BootComponents)
		for _, digest := range all {
			if containsHex(d.Deny, digest) {
				rule := RuleBootComponents + "." + st.key
				stage := in + "bootComponents." + st.key + "."
				if err := e.rule(rule, attest.DenySetting(attest.ReasonPolicyBootDenied, stage+"deny", "%s %s is in %sdeny", st.what, digest, stage)); err != nil {
					return err
				}
			}
		}
	}
	type fail struct {
		rule string
		err  error
	}
	var first error
	var expired []string
	var audited []fail // the first set that matches but for audited rules
	for si, s := range sets(in, t, e.now) {
		var fails []fail
		var hard error
		for _, c := range setChecks {
			err := c.check(&s, b)
			if err == nil {
				continue
			}
			if !e.audited(c.rule) {
				hard = err
				if si == 0 {
					first = err // the refusal, unless a set matches
				}
				break
			}
			fails = append(fails, fail{c.rule, err})
		}
		switch {
		case hard != nil:
		case s.expired != nil:
			expired = append(expired, fmt.Sprintf("%s (until %s)", s.name, s.expired.UTC().Format(time.RFC3339)))
		case len(fails) == 0:
			return nil
		case audited == nil:
			audited = fails
		}
	}
	if audited != nil {
		for _, f := range audited {
			if err := e.rule(f.rule, f.err); err != nil {
				return err
			}
		}
		return nil
	}
	err := first // the pool's own rules failed outright (else they matched, above)
	if len(expired) > 0 {
		err = attest.DenySetting(attest.ReasonPolicyReferenceSetExpired, in+"referenceSets", "the boot matches only reference sets past their notAfter: %s", strings.Join(expired, ", "))
	}
	return e.rule(RuleBootComponents, err)
}

// checkStage checks one stage of one set (at: the stage's setting): each
// application in the stage is judged; a denied one refuses wherever it
// appears (bootChain).
func checkStage(at string, st chainStage, d DigestList, b *attest.BootState) error {
	apps := stageApps(b, st.key)
	for _, digest := range images(b) {
		if containsHex(d.Deny, digest) {
			return attest.DenySetting(attest.ReasonPolicyBootDenied, at+"deny", "%s %s is in %sdeny", st.what, digest, at)
		}
	}
	if d.Any {
		return nil
	}
	if len(d.Allow) == 0 && len(d.SignedBy) == 0 {
		return attest.DenySetting(attest.ReasonPolicyBootNotAllowed, at+"allow", "the pool allows no %s: %sallow and signedBy are empty (an empty list allows none; any: true allows any)", st.what, at)
	}
	if len(apps) == 0 {
		return attest.DenySetting(attest.ReasonPolicyBootMissing, at+"allow", "no %s was measured, and %s allows only listed ones", st.what, at)
	}
	for _, i := range apps {
		digest := b.BootApplications[i]
		if len(d.Allow) > 0 && !containsHex(d.Allow, digest) {
			return attest.DenySetting(attest.ReasonPolicyBootNotAllowed, at+"allow", "%s %s (boot application %d) is not in %sallow", st.what, digest, i, at)
		}
		if len(d.SignedBy) > 0 {
			if err := signedBy(at+"signedBy", st.what, d.SignedBy, b, i); err != nil {
				return err
			}
		}
	}
	return nil
}

// signedBy checks that every authority that may have verified boot
// application i is a certificate in allowed (fingerprints): one the log
// names (BootSignerNotAllowed when it is not listed), or several the
// verifier used when the log does not say which (each must be listed,
// else BootSignerAmbiguous). Nothing verified it, or no authority in the
// log: BootSignerUnknown.
func signedBy(at, what string, allowed []string, b *attest.BootState, i int) error {
	if i >= len(b.AppVerifications) {
		return attest.DenySetting(attest.ReasonBootSignerUnknown, at, "the log does not say who verified the %s (boot application %d)", what, i)
	}
	v := b.AppVerifications[i]
	if v.Verifier == "" || len(v.Signers) == 0 {
		_, err := b.Signer(i)
		return attest.DenySetting(attest.ReasonBootSignerUnknown, at, "%s: %v; %s requires a listed signer", what, err, at)
	}
	var listed, unlisted []string
	for _, s := range v.Signers {
		a, ok := authority(b, s, v.Verifier)
		if ok && !a.Hash && containsHex(allowed, s) {
			listed = append(listed, s)
		} else {
			unlisted = append(unlisted, signerName(a, s, ok))
		}
	}
	switch {
	case len(unlisted) == 0:
		return nil
	case len(listed) == 0:
		return attest.DenySetting(attest.ReasonPolicyBootSigner, at, "the %s was verified by %s, which %s does not list", what, strings.Join(unlisted, " or "), at)
	}
	return attest.DenySetting(attest.ReasonBootSignerAmbiguous, at, "the %s was verified by one of %d authorities the %s measured, and the log does not say which; %s does not list %s", what, len(v.Signers), v.Verifier, at, strings.Join(unlisted, ", "))
}

func authority(b *attest.BootState, sha, by string) (attest.SecureBootAuthority, bool) {
	for _, a := range b.Authorities {
		if a.SHA256 == sha && a.By == by {
			return a, true
		}
	}
	return attest.SecureBootAuthority{}, false
}

func signerName(a attest.SecureBootAuthority, sha string, ok bool) string {
	switch {
	case !ok:
		return sha
	case a.Hash:
		return fmt.Sprintf("the %s hash entry %s (signedBy lists certificates)", a.Variable, sha)
	case a.Subject != "":
		return fmt.Sprintf("%s %q (%s)", a.Variable, a.Subject, sha)
	}
	return a.Variable + " " + sha
}

// minimumSBAT checks the shim's SbatLevel: measured, and at least min's
// generation for each component (a component the level does not name is
// at generation 1).
func minimumSBAT(in string, min map[string]int, b *attest.BootState) error {
	st := b.ShimState
	if st == nil || !st.SBATLevelKnown {
		return attest.DenySetting(attest.ReasonPolicySBAT, in+"minimumSBAT", "the log shows no SbatLevel the shim measured, which %sminimumSBAT needs", in)
	}
	for _, comp := range slices.Sorted(mapKeys(min)) {
		got := st.SBAT[comp]
		if got == 0 {
			got = 1
		}
		if got < min[comp] {
			return attest.DenySetting(attest.ReasonPolicySBAT, in+"minimumSBAT", "the shim's SbatLevel (%s) revokes %s below generation %d; %sminimumSBAT.%s requires %d", st.SBATDate, comp, got, in, comp, min[comp])
		}
	}
	return nil
}

// machineOwnerKeys refuses a boot application the shim verified with a
// machine-owner key m does not list. The log separates the shim's vendor
// certificate from machine-owner keys only so far: an authority measured
// as "Shim" or "vendor_db" is built into the shim; one measured as
// "MokListRT" is the vendor certificate when MokList held it alone
// (ShimState.MokListOnly), and otherwise may be a MOK — listed or refused.
func machineOwnerKeys(in string, m *MachineOwnerKeys, b *attest.BootState) error {
	for i, v := range b.AppVerifications {
		if v.Verifier != attest.VerifierShim {
			continue
		}
		for _, s := range v.Signers {
			a, ok := authority(b, s, v.Verifier)
			if !ok || a.Variable != "MokListRT" {
				continue
			}
			if b.ShimState != nil && b.ShimState.MokListOnly == s {
				continue // the vendor certificate, mirrored: MokList holds nothing else
			}
			if !containsHex(m.Allow, s) {
				return attest.DenySetting(attest.ReasonPolicyMOK, in+"machineOwnerKeys.allow", "boot application %d was (or may have been) verified by %s from the shim's MokList, which %smachineOwnerKeys.allow does not list (an empty list refuses every MOK-verified boot; with keys enrolled the log cannot tell the vendor certificate from them, so list it too)", i, signerName(a, s, true), in)
			}
		}
	}
	return nil
}

func mapKeys(m map[string]int) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// fingerprints returns list with every PEM certificate replaced by its
// SHA-256 fingerprint (hex, lower case); a fingerprint must be 64 hex
// digits.
func fingerprints(field string, list []string) ([]string, error) {
	out := make([]string, 0, len(list))
	for _, s := range list {
		s = strings.TrimSpace(s)
		if strings.HasPrefix(s, "-----BEGIN") {
			blk, rest := pem.Decode([]byte(s))
			if blk == nil || blk.Type != "CERTIFICATE" || len(strings.TrimSpace(string(rest))) > 0 {
				return nil, fmt.Errorf("%s: an entry is not one PEM certificate", field)
			}
			if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
				return nil, fmt.Errorf("%s: %w", field, err)
			}
			sum := sha256.Sum256(blk.Bytes)
			s = hex.EncodeToString(sum[:])
		}
		if b, err := hex.DecodeString(s); err != nil || len(b) != 32 {
			return nil, fmt.Errorf("%s: %q is neither a PEM certificate nor a SHA-256 fingerprint (64 hex digits)", field, s)
		}
		out = append(out, strings.ToLower(s))
	}
	return out, nil
}

// ChainOutcome is what one kind of stage rule of a pool (digests, or
// signers) makes of a boot chain alone: Present when the pool has such a
// rule; Err nil when the chain passes them (bootComponents or a reference
// set), else the refusal.
type ChainOutcome struct {
	Present bool
	Err     error
}

// ChainOutcomes judges c's boot chain by pool's digest rules alone (every
// stage's allow; deny kept) and by its signer rules alone (signedBy),
// without audit mode, for `policy check --against-records`: a pool
// moving from digests to signers sees which nodes each would refuse.
// Nothing is judged for claims without TPM facts or a pool the policy
// does not name.
func (p *Policy) ChainOutcomes(pool string, c *attest.Claims, o Options) (digests, signers ChainOutcome) {
	pp, ok := p.Pools[pool]
	if !ok || c.TPM == nil {
		return
	}
	now := o.Now
	if now.IsZero() {
		now = c.VerifiedAt
	}
	only := func(keep func(*DigestList) bool, strip func(*DigestList)) ChainOutcome {
		t := pp.TPM
		t.ReferenceSets = slices.Clone(t.ReferenceSets)
		// The chain's stages alone: what runs after it is not judged here.
		t.KernelCmdline, t.Grub = &KernelCmdline{Any: true}, &GrubRules{Any: true}
		for i := range t.ReferenceSets {
			t.ReferenceSets[i].KernelCmdline, t.ReferenceSets[i].Grub = nil, nil
		}
		var out ChainOutcome
		for _, st := range t.stageRules() {
			d := *st.d
			if keep(&d) {
				out.Present = true
			} else if !d.Any {
				d.Any = true // no rule of this kind: the stage is not judged by it
			}
			strip(&d)
			*st.d = d
		}
		if out.Present {
			out.Err = bootChain("pools."+pool+".tpm.", &t, &c.TPM.Boot, &evaluation{now: now})
		}
		return out
	}
	digests = only(func(d *DigestList) bool { return len(d.Allow) > 0 }, func(d *DigestList) { d.SignedBy = nil })
	signers = only(func(d *DigestList) bool { return len(d.SignedBy) > 0 }, func(d *DigestList) { d.Allow = nil })
	return
}
