package policy

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/nodeproof/nodeproof/attest"
)

// Learned is what one machine the operator trusts booted: its EK's trust
// and the boot state of its event log (attest/tpm LogBootState, or the
// claims its last attestation recorded).
type Learned struct {
	// EKTrust is what vouched for its EK: "ca:<trust.ekRoots name>" or
	// "inventory".
	EKTrust string
	// EKKind is its EK's kind (attest.EKKinds); empty: the default
	// (attest.EKKindRSA2048). A new pool accepts this kind only.
	EKKind string
	// Bank is the PCR bank of Boot's digests: "sha256" or "sha1".
	Bank string
	Boot attest.BootState
	// Root, when set, is the trust.ekRoots entry EKTrust names (added to
	// the document if it lacks it); Inventory, the trust.ekInventory file.
	// A new document needs the one its EKTrust names.
	Root      *EKRoot
	Inventory string
	// NodeNames is how the pool's machines get their node names
	// (serve.nodeNames): "requested" or "evidence"; empty keeps the pool's
	// (ErrNodeNamesUnset when that cannot name this machine).
	NodeNames string
	// Digests pins each stage's digest (allow) as well as its signer.
	// Off: signer rules alone, which keep admitting the machine's
	// updates; a stage whose signer the log does not establish is pinned
	// by digest all the same (with a note).
	Digests bool
	// PCRs are the machine's PCR values, hex by index: quoted, or those
	// its log implies (attest/tpm LogPCRs). A UKI pool reads PCRs 12 and
	// 13 (tpm.uki); the learned pool must admit the machine with them.
	PCRs map[int]string
}

// ErrNodeNamesUnset: the learned pool would refuse the machine
// NodeNameNotEstablished — its EK is trusted through a vendor CA, which
// names no node, and the pool takes no requested names — and Learned says
// nothing of node names: the operator must choose (serve.nodeNames:
// requested, or an EK inventory that names the machine's node).
var ErrNodeNamesUnset = errors.New("how this pool's machines get their node names is not set")

// Learn writes what l says into pool of the policy document doc (YAML;
// empty for a new document) and returns the new document and notes for
// the operator: what the policy leaves open, and what it could not learn.
// Comments of doc are not kept.
//
// A new pool gets: evidence [tpm]; ekTrust [l.EKTrust] and ek, the
// machine's EK kind; requireSecureBoot when the machine booted with
// Secure Boot on; minimumDBX.entries, its dbx's entry count;
// minimumSBAT, the SbatLevel its shim measured (with Secure Boot on); for
// the shim, the boot loader and the kernel, a signedBy of the authorities
// that verified it (every one the log leaves possible, with a note when
// several), and with l.Digests (or where the log names no signer: Secure
// Boot off) an allow list of the digests the log established (a stage it
// did not establish gets any: true, and a note); what ran after the boot
// loader, exactly as it ran: kernelCmdline.exact, the command line GRUB
// measured; grub.files, every file GRUB read (grub.cfg, the kernel, the
// initramfs) by digest; grub.commands, every command GRUB ran (where the
// log establishes none of these: any: true, and a note); allowSHA1 when
// the bank is SHA-1.
//
// An existing pool (merging a second machine): each stage's signers join
// its signedBy and (as above) its digest its allow list (a stage that
// says any stays so), its EK trust joins ekTrust; a machine whose command
// line, GRUB files or commands the pool does not accept gets a reference
// set of its own (named learned-<n>, the pool's stage rules, its command
// line and GRUB's); requireSecureBoot, minimumDBX and minimumSBAT stay as
// they are, with a note when this machine does not meet them.
//
// How the machine gets its node name: l.NodeNames sets the pool's
// serve.nodeNames; without it the pool must already take requested names
// or trust the machine's EK through an inventory (which names nodes), else
// Learn refuses with ErrNodeNamesUnset rather than write a policy that
// refuses the machine NodeNameNotEstablished.
//
// The result must parse (errors name the pool and the field) and must
// admit the machine it was learned from (Evaluate); otherwise Learn
// returns an error saying why.
func Learn(doc []byte, pool string, l Learned) ([]byte, []string, error) {
	if pool == "" {
		return nil, nil, errors.New("policy learn: a pool name is required")
	}
	if l.Bank != "sha256" && l.Bank != "sha1" {
		return nil, nil, fmt.Errorf("policy learn: bank %q: want sha256 or sha1", l.Bank)
	}
	if l.EKTrust == "" {
		return nil, nil, errors.New("policy learn: the machine's EK trust (ca:<name> or inventory) is required")
	}
	p, err := decodeDraft(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("policy learn: the policy to merge into: %w", err)
	}
	lr := &learning{p: p, pool: pool, l: l}
	pp, existed := p.Pools[pool]
	lr.existed = existed
	steps := []func(*Pool) error{lr.identity, lr.trust, lr.nodeNames, lr.chain, lr.afterKernel}
	for _, step := range steps {
		if err := step(&pp); err != nil {
			return nil, nil, err
		}
	}
	p.Pools[pool] = pp
	return lr.finish()
}

// learning is one Learn: the draft policy, the pool, what the machine
// booted and the notes so far. Each phase edits the pool.
type learning struct {
	p       *Policy
	pool    string
	l       Learned
	existed bool
	notes   []string
}

func (lr *learning) note(format string, args ...any) {
	lr.notes = append(lr.notes, fmt.Sprintf("pools.%s.", lr.pool)+fmt.Sprintf(format, args...))
}

// identity: the evidence kind, the EK (trust and kind), and for a new
// pool the boot's Secure Boot, dbx, SBAT and bank.
func (lr *learning) identity(pp *Pool) error {
	b, t := &lr.l.Boot, &pp.TPM
	if !slices.Contains(pp.Evidence, attest.KindTPM) {
		pp.Evidence = append(pp.Evidence, attest.KindTPM)
	}
	if !t.AnyEKTrust && !slices.Contains(t.EKTrust, lr.l.EKTrust) {
		t.EKTrust = append(t.EKTrust, lr.l.EKTrust)
	}
	kind := lr.l.EKKind
	if kind == "" {
		kind = attest.EKKindRSA2048
	}
	switch {
	case !lr.existed && kind != attest.EKKindRSA2048:
		t.EK = kind
	case lr.existed && t.EKKind() != kind:
		return fmt.Errorf("policy learn: pools.%s.tpm.ek is %s, and this machine attests with its %s EK: a pool accepts one kind of EK (one TPM, one identity)", lr.pool, t.EKKind(), kind)
	}
	if lr.existed {
		return nil
	}
	if b.SecureBootKnown && b.SecureBoot {
		t.RequireSecureBoot = true
	} else {
		lr.note("tpm.requireSecureBoot: not set, the machine booted with Secure Boot %s", onOff(*b))
	}
	if b.DBXKnown {
		t.MinimumDBX = &MinimumDBX{Entries: b.DBXEntries}
	} else {
		lr.note("tpm.minimumDBX: not set, the log did not measure dbx")
	}
	if lr.l.Bank == "sha1" {
		t.AllowSHA1 = true
		lr.note("tpm.allowSHA1: true, the log has only SHA-1 digests (forgeable by collision)")
	}
	if st := b.ShimState; st != nil && st.SBATLevelKnown && len(st.SBAT) > 0 && b.SecureBoot {
		t.MinimumSBAT = map[string]int{}
		for comp, gen := range st.SBAT {
			t.MinimumSBAT[comp] = gen
		}
	}
	return nil
}

// trust: the EK root or inventory the machine's trust names.
func (lr *learning) trust(*Pool) error {
	tr := &lr.p.Trust
	if r := lr.l.Root; r != nil && !slices.ContainsFunc(tr.EKRoots, func(x EKRoot) bool { return x.Name == r.Name }) {
		tr.EKRoots = append(tr.EKRoots, *r)
	}
	if lr.l.Inventory != "" {
		tr.EKInventory = lr.l.Inventory
	}
	return nil
}

// nodeNames: the learned pool must name the machine it was learned from,
// or it refuses it NodeNameNotEstablished.
func (lr *learning) nodeNames(pp *Pool) error {
	l := lr.l
	switch l.NodeNames {
	case "":
		if pp.Serve.NodeNames != "requested" && l.EKTrust != "inventory" {
			return fmt.Errorf("policy learn: pools.%s.serve.nodeNames: %w: a TPM trusted through %s names no node (only an EK inventory's entries do), so the pool would refuse the machine NodeNameNotEstablished; choose serve.nodeNames: requested (the name the agent asks for; the first identity to enrol owns it) or EK trust through an inventory that names the node", lr.pool, ErrNodeNamesUnset, l.EKTrust)
		}
	case "requested", "evidence":
		if l.NodeNames == "evidence" && l.EKTrust != "inventory" {
			return fmt.Errorf("policy learn: pools.%s.serve.nodeNames: evidence: a TPM trusted through %s names no node, so the pool would refuse the machine NodeNameNotEstablished; take requested names, or trust the EK through an inventory", lr.pool, l.EKTrust)
		}
		if cur := pp.Serve.NodeNames; lr.existed && cur != l.NodeNames && (cur != "" || l.NodeNames != "evidence") {
			lr.note("serve.nodeNames: %s, was %q", l.NodeNames, cur)
		}
		pp.Serve.NodeNames = l.NodeNames
	default:
		return fmt.Errorf("policy learn: node names %q: want requested or evidence", l.NodeNames)
	}
	return nil
}

// chain: each stage's signers (and digests with Digests, or where the log
// names no signer). A machine that booted a unified kernel image
// (systemd-stub's sections in PCR 11) is learned as one (learnUKI).
func (lr *learning) chain(pp *Pool) error {
	b := &lr.l.Boot
	uki := b.UKISectionsKnown && (len(b.BootApplications) == 1 || len(b.BootApplications) == 2)
	switch {
	case uki && lr.existed && pp.TPM.UKI == nil:
		return fmt.Errorf("policy learn: pools.%s judges GRUB's boot chain, and this machine booted a unified kernel image: learn it into a pool of its own", lr.pool)
	case !uki && pp.TPM.UKI != nil:
		return fmt.Errorf("policy learn: pools.%s judges unified kernel images (tpm.uki), and this machine's log shows none (no systemd-stub sections in PCR 11, or a chain of %d applications): learn it into a pool of its own", lr.pool, len(b.BootApplications))
	case uki:
		return lr.learnUKI(pp)
	}
	for _, st := range chainStages {
		s := stageOf(&pp.TPM.BootComponents, st.key)
		apps := stageApps(b, st.key)
		var digests []string
		for _, i := range apps {
			digests = appendNew(digests, b.BootApplications[i])
		}
		signers, many := learnedSigners(b, apps)
		switch {
		case s.Any:
		case len(digests) > 0 && len(signers) > 0:
			for _, sg := range signers {
				s.SignedBy = appendNew(s.SignedBy, sg)
			}
			if many {
				lr.note("tpm.bootComponents.%s.signedBy: the log leaves %d authorities that may have verified the %s, all listed: keep only those that sign your %ss", st.key, len(signers), st.what, st.what)
			}
			if lr.l.Digests || len(s.Allow) > 0 { // a pool pinned by digest stays so
				for _, d := range digests {
					s.Allow = appendNew(s.Allow, d)
				}
			} else if st.key == "kernel" && len(b.GrubFiles) > 0 {
				lr.note("tpm.bootComponents.kernel.signedBy: admits every kernel its signer ever signed, older ones included; grub.files pins this one's file, and `policy learn --efi VMLINUZ --minimum-kernel VERSION` sets a version floor that survives updates")
			}
		case len(digests) > 0:
			for _, d := range digests {
				s.Allow = appendNew(s.Allow, d)
			}
			lr.note("tpm.bootComponents.%s: the log names no signer of the %s (Secure Boot off?): pinned by its digest", st.key, st.what)
		default:
			why := fmt.Sprintf("the log did not establish a %s", st.what)
			if st.key == "kernel" && kernelOnlyInPCR9(*b) {
				why = "the kernel was measured only into PCR 9: with Secure Boot off, GRUB loads the kernel itself " +
					"(not through the shim and the firmware), so the log holds the SHA-256 of its file (PCR 9, which grub.files pins), not the " +
					"Authenticode digest of a boot application (PCR 4) that kernel lists pin"
			}
			if lr.existed {
				lr.note("tpm.bootComponents.%s: unchanged, %s", st.key, why)
				continue
			}
			s.Any = true
			lr.note("tpm.bootComponents.%s: any: true, %s; narrow it by hand", st.key, why)
		}
	}
	return nil
}

// learnUKI learns a UKI boot: tpm.uki's signedBy, the authorities that
// verified the UKI (its digest too with Digests, or where the log names
// no signer); with a shim before it, the shim's stage as chain learns
// it. No GRUB rules: the UKI's signature covers its command line and
// initramfs.
func (lr *learning) learnUKI(pp *Pool) error {
	b, t := &lr.l.Boot, &pp.TPM
	if t.UKI == nil {
		t.UKI = &UKIRule{}
	}
	u := t.UKI
	i := len(b.BootApplications) - 1
	if i == 1 {
		s := &t.BootComponents.Shim
		signers, _ := learnedSigners(b, []int{0})
		for _, sg := range signers {
			s.SignedBy = appendNew(s.SignedBy, sg)
		}
		if len(signers) == 0 || lr.l.Digests || len(s.Allow) > 0 {
			s.Allow = appendNew(s.Allow, b.BootApplications[0])
		}
	}
	if u.Any {
		return nil
	}
	signers, many := learnedSigners(b, []int{i})
	for _, sg := range signers {
		u.SignedBy = appendNew(u.SignedBy, sg)
	}
	switch {
	case len(signers) == 0:
		u.Allow = appendNew(u.Allow, b.BootApplications[i])
		lr.note("tpm.uki: the log names no signer of the unified kernel image (Secure Boot off?): pinned by its digest")
	case lr.l.Digests || len(u.Allow) > 0:
		u.Allow = appendNew(u.Allow, b.BootApplications[i])
	default:
		lr.note("tpm.uki.signedBy: admits every unified kernel image its signer signs — a new kernel, initramfs or command line included, and older releases: deny those (tpm.uki.deny) or pin sections (tpm.uki.sections)")
	}
	if many {
		lr.note("tpm.uki.signedBy: the log leaves %d authorities that may have verified the unified kernel image, all listed: keep only those that sign your UKIs", len(signers))
	}
	return nil
}

// afterKernel: the command line, GRUB's files and commands, exactly as
// the machine ran them; in an existing pool that does not accept them, a
// reference set of their own. Not for a UKI pool: its sections are the
// UKI's.
func (lr *learning) afterKernel(pp *Pool) error {
	b := &lr.l.Boot
	t := &pp.TPM
	if t.UKI != nil {
		return nil
	}
	cmd := &KernelCmdline{Any: true}
	if b.KernelCmdlineKnown {
		cmd = &KernelCmdline{Exact: []string{b.KernelCmdline}}
	}
	grub := &GrubRules{Any: true}
	if len(b.GrubFiles) > 0 || b.GrubCommandsKnown {
		grub = &GrubRules{Commands: slices.Clone(b.GrubCommands)}
		for _, f := range b.GrubFiles {
			grub.Files = append(grub.Files, GrubFile{Path: f.Path, Digest: f.Digest})
		}
	}
	if !lr.existed || (t.KernelCmdline == nil && t.Grub == nil) {
		t.KernelCmdline, t.Grub = cmd, grub
		if cmd.Any {
			lr.note("tpm.kernelCmdline: any: true, the log does not establish a kernel command line (GRUB measured none): any command line is admitted")
		}
		if grub.Any {
			lr.note("tpm.grub: any: true, GRUB measured no commands and read no files: the initramfs and the boot loader's configuration are not judged")
		} else if b.GrubCommandsKnown {
			lr.note("tpm.grub and tpm.kernelCmdline: the %d files GRUB read (grub.cfg, the kernel, the initramfs) and its %d commands are pinned exactly: a new initramfs, grub.cfg or command line needs `policy learn` again (from a machine, or from the files: --initrd, --grub-cfg, --kernel-cmdline)", len(grub.Files), len(grub.Commands))
		}
		return nil
	}
	probe := bootSet{comps: BootComponents{Shim: DigestList{Any: true}, Bootloader: DigestList{Any: true}, Kernel: DigestList{Any: true}},
		cmdline: t.KernelCmdline, grub: t.Grub}
	for _, r := range t.ReferenceSets {
		if r.KernelCmdline == nil && r.Grub == nil {
			continue
		}
		s := probe
		if r.KernelCmdline != nil {
			s.cmdline = r.KernelCmdline
		}
		if r.Grub != nil {
			s.grub = r.Grub
		}
		if afterKernelMatches(&s, b) {
			return nil
		}
	}
	if afterKernelMatches(&probe, b) {
		return nil
	}
	name := fmt.Sprintf("learned-%d", len(t.ReferenceSets)+1)
	t.ReferenceSets = append(t.ReferenceSets, ReferenceSet{Name: name, Shim: t.BootComponents.Shim, Bootloader: t.BootComponents.Bootloader, Kernel: t.BootComponents.Kernel,
		KernelCmdline: cmd, Grub: grub})
	lr.note("tpm.referenceSets %s: this machine's command line, GRUB files and commands differ from the pool's: a reference set of their own, with the pool's stage rules (add a notAfter when it is a rollout)", name)
	return nil
}

// afterKernelMatches reports whether s's command line and GRUB rules
// accept b.
func afterKernelMatches(s *bootSet, b *attest.BootState) bool {
	return checkKernelCmdline("", s.cmdline, b) == nil && checkGrubFiles("", s.grub, b) == nil && checkGrubCommands("", s.grub, b) == nil
}

// finish renders the draft, checks it parses and admits the machine.
func (lr *learning) finish() ([]byte, []string, error) {
	out, err := Marshal(lr.p)
	if err != nil {
		return nil, nil, fmt.Errorf("policy learn: %w", err)
	}
	pol, err := Parse(out)
	if err != nil {
		return nil, nil, fmt.Errorf("policy learn: the learned policy does not check: %w", err)
	}
	l, pool := lr.l, lr.pool
	claims := &attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{EKTrust: l.EKTrust, EKKind: pol.Pools[pool].TPM.EKKind(), PCRBank: l.Bank, PCRs: l.PCRs, Boot: l.Boot}}
	err = pol.Evaluate(pool, claims)
	if lr.existed {
		// A kept minimum this machine is below: said, not refused, if
		// nothing else would refuse it (Evaluate stops at the first).
		pp := pol.Pools[pool]
		for _, kept := range []struct {
			reason attest.Reason
			drop   func()
			note   string
		}{
			{attest.ReasonPolicyDBX, func() { pp.TPM.MinimumDBX = nil }, fmt.Sprintf("pools.%s.tpm.minimumDBX: kept; this machine's dbx (%d entries) is older and is refused until it is updated", pool, l.Boot.DBXEntries)},
			{attest.ReasonPolicySBAT, func() { pp.TPM.MinimumSBAT = nil }, fmt.Sprintf("pools.%s.tpm.minimumSBAT: kept; this machine's shim enforces older SBAT revocations and is refused until it is updated", pool)},
			{attest.ReasonPolicyKernelVersion, func() { pp.TPM.MinimumKernel = nil }, fmt.Sprintf("pools.%s.tpm.minimumKernel: kept; this machine's kernel is older or not listed and is refused until it is updated", pool)},
		} {
			if r, _ := attest.ReasonOf(err); r == kept.reason {
				kept.drop()
				pol.Pools[pool] = pp
				if err = pol.Evaluate(pool, claims); err == nil {
					lr.notes = append(lr.notes, kept.note)
				}
			}
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("policy learn: pool %s would refuse the machine it was learned from: %w", pool, err)
	}
	return out, append(lr.notes, openRules(pol, pool)...), nil
}

// learnedSigners are the certificates that may have verified every boot
// application of apps (each application's possible signers: the stage's
// signedBy must list them all), and whether the log left several for
// one; none when the log names no certificate for one of them.
func learnedSigners(b *attest.BootState, apps []int) ([]string, bool) {
	var out []string
	many := false
	for _, i := range apps {
		if i >= len(b.AppVerifications) {
			return nil, false
		}
		v := b.AppVerifications[i]
		if v.Verifier == "" || len(v.Signers) == 0 {
			return nil, false
		}
		many = many || len(v.Signers) > 1
		for _, s := range v.Signers {
			if a, ok := authority(b, s, v.Verifier); !ok || a.Hash {
				return nil, false
			}
			out = appendNew(out, s)
		}
	}
	return out, many
}

// kernelOnlyInPCR9 reports a boot where GRUB booted a kernel (its
// command line is measured) but no boot application followed GRUB's:
// GRUB loaded the kernel itself, as Debian's GRUB does with Secure Boot
// off, and measured only its file into PCR 9.
func kernelOnlyInPCR9(b attest.BootState) bool {
	return b.KernelCmdlineKnown && len(b.BootApplications) == 2
}

// stageOf is the stage rule key of c.
func stageOf(c *BootComponents, key string) *DigestList {
	switch key {
	case "shim":
		return &c.Shim
	case "bootloader":
		return &c.Bootloader
	}
	return &c.Kernel
}

// appendNew is l with s, once.
func appendNew(l []string, s string) []string {
	if slices.Contains(l, s) {
		return l
	}
	return append(l, s)
}

func onOff(b attest.BootState) string {
	switch {
	case !b.SecureBootKnown:
		return "unknown (not measured)"
	case b.SecureBoot:
		return "on"
	}
	return "off"
}

// decodeDraft reads a policy document strictly (an unknown field is an
// error) without validating it: a draft Learn completes; empty is a new
// document.
func decodeDraft(doc []byte) (*Policy, error) {
	p := &Policy{APIVersion: APIVersion, Kind: Kind}
	if len(bytes.TrimSpace(doc)) > 0 {
		dec := yaml.NewDecoder(bytes.NewReader(doc))
		dec.KnownFields(true)
		if err := dec.Decode(p); err != nil {
			return nil, err
		}
	}
	if p.Pools == nil {
		p.Pools = map[string]Pool{}
	}
	return p, nil
}

// openRules are the notes on what pool leaves open: what a security team
// should know before it relies on the policy (`policy learn` prints them;
// `policy check` warns of them).
func openRules(p *Policy, pool string) []string {
	pp, ok := p.Pools[pool]
	if !ok || !pp.takesTPMBoot() {
		return nil
	}
	var out []string
	at := "pools." + pool + ".tpm."
	t := pp.TPM
	switch k := t.KernelCmdline; {
	case k == nil || k.Any:
		out = append(out, at+"kernelCmdline: open: any kernel command line is admitted (init=/bin/sh, rd.break included)")
	case len(k.Exact) == 0:
		out = append(out, at+"kernelCmdline: only the words require and forbid list are judged: any other (rd.break=pre-mount, init=…) is admitted; exact judges the whole command line")
	}
	switch g := t.Grub; {
	case g == nil || g.Any:
		out = append(out, at+"grub: open: any initramfs, grub.cfg and GRUB command is admitted (the initramfs is not signed: it runs with the full config)")
	case len(g.Files) == 0:
		out = append(out, at+"grub.files: not set: any initramfs and grub.cfg is admitted")
	case len(g.Commands) == 0:
		out = append(out, at+"grub.commands: not set: commands typed at GRUB's prompt are not judged (their effects on the files and the command line are)")
	}
	if !t.RequireSecureBoot {
		out = append(out, at+"requireSecureBoot: off: a kernel GRUB loads itself is measured only into PCR 9, and root on the machine can append an allowed kernel's digest to PCR 4 after boot; grub.files still judges the kernel's file")
	}
	if t.MinimumKernel == nil && len(t.BootComponents.Kernel.SignedBy) > 0 {
		k := t.BootComponents.Kernel
		if len(k.Allow) == 0 {
			out = append(out, at+"minimumKernel: not set: a kernel signer rule admits older kernels of the same signer (a rollback) wherever grub.files does not pin the kernel's file")
		}
	}
	return out
}

// takesTPMBoot reports whether the pool takes evidence the TPM boot rules
// judge (tpm, or a cloud vTPM).
func (pp Pool) takesTPMBoot() bool {
	for _, k := range pp.Evidence {
		if k == attest.KindTPM || cloudOf(k) != "" {
			return true
		}
	}
	return false
}

// OpenRules lists, for each pool, what its boot rules leave open (the
// initramfs, the command line, a rollback): `policy check` prints them as
// warnings.
func (p *Policy) OpenRules() []string {
	var out []string
	for _, name := range sortedPools(p) {
		out = append(out, openRules(p, name)...)
	}
	return out
}

func sortedPools(p *Policy) []string {
	names := make([]string, 0, len(p.Pools))
	for n := range p.Pools {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// References are reference values read from boot files, not from a
// machine (`nodeproof policy learn --efi`): by stage ("shim",
// "bootloader", "kernel"), the certificates that may verify each
// (fingerprints) and its Authenticode digests; the SbatLevel the shim
// applies; each kernel's version by digest; and, to predict what GRUB
// will measure (PredictGrub), what runs after the boot loader.
type References struct {
	Signers     map[string][]string
	Digests     map[string][]string
	MinimumSBAT map[string]int
	// KernelVersions maps each kernel file's Authenticode digest to the
	// version it names (minimumKernel.versions).
	KernelVersions map[string]string
	// MinimumKernel, when set, raises (never lowers) minimumKernel.version.
	MinimumKernel string
	// After, when set, is what GRUB will measure for these files
	// (PredictGrub): the set it goes in gets its grub and kernelCmdline.
	After *Predicted
	// ReferenceSet, when set, puts the stage rules and After into the
	// pool's reference set of that name (made if absent: a rollout's new
	// release), with NotAfter when given; else they join the pool's own
	// rules.
	ReferenceSet string
	NotAfter     string
	// UKIPool, with a "uki" stage, lets a pool that judges GRUB's chain
	// become one that judges unified kernel images: its boot loader and
	// kernel stages, kernelCmdline, grub, referenceSets and minimumKernel
	// are removed (each said in a note).
	UKIPool bool
}

// addUKIReferences adds r's UKI signers and digests to t.UKI, making the
// pool a UKI pool first when r.UKIPool says so (and only then).
func addUKIReferences(t *TPMPolicy, pool string, r References, note func(string, ...any)) error {
	if r.ReferenceSet != "" || r.After != nil || r.MinimumKernel != "" || len(r.KernelVersions) > 0 {
		return errors.New("policy learn: a unified kernel image takes no reference set, GRUB prediction or kernel floor: its signer rule covers its kernel, initramfs and command line")
	}
	if t.UKI == nil {
		if !r.UKIPool {
			return fmt.Errorf("policy learn: pools.%s judges GRUB's boot chain; to judge unified kernel images instead, give --uki-pool (its boot loader and kernel stages, kernelCmdline, grub, referenceSets and minimumKernel are removed)", pool)
		}
		removed := []string{}
		for _, f := range []struct {
			name string
			set  bool
			drop func()
		}{
			{"bootComponents.bootloader", !emptyStage(t.BootComponents.Bootloader), func() { t.BootComponents.Bootloader = DigestList{} }},
			{"bootComponents.kernel", !emptyStage(t.BootComponents.Kernel), func() { t.BootComponents.Kernel = DigestList{} }},
			{"kernelCmdline", t.KernelCmdline != nil, func() { t.KernelCmdline = nil }},
			{"grub", t.Grub != nil, func() { t.Grub = nil }},
			{"referenceSets", len(t.ReferenceSets) > 0, func() { t.ReferenceSets = nil }},
			{"minimumKernel", t.MinimumKernel != nil, func() { t.MinimumKernel = nil }},
		} {
			if f.set {
				f.drop()
				removed = append(removed, f.name)
			}
		}
		t.UKI = &UKIRule{}
		note("tpm.uki: the pool now judges unified kernel images; removed: %s", strings.Join(removed, ", "))
	}
	u := t.UKI
	if u.Any {
		note("tpm.uki: any: true kept; the UKI's signers and digests read are not added")
		return nil
	}
	for _, v := range r.Signers["uki"] {
		u.SignedBy = appendNew(u.SignedBy, v)
	}
	for _, v := range r.Digests["uki"] {
		u.Allow = appendNew(u.Allow, v)
	}
	return nil
}

// AddReferences adds r to pool in the policy document doc and returns the
// new document and notes: each stage's signers join its signedBy and its
// digests its allow list (a stage that says any stays so, with a note) —
// in the pool's own rules, or in r.ReferenceSet's (a new set starts from
// the pool's stage rules); r.After becomes that set's grub and
// kernelCmdline; minimumSBAT and minimumKernel.version are raised to r's
// where they are higher (never lowered), and kernel versions join
// minimumKernel.versions. A "uki" stage's signers and digests go into
// tpm.uki (addUKIReferences: a GRUB pool becomes a UKI pool only with
// r.UKIPool). The pool must exist (its EK trust and Secure Boot rules
// come from a machine, or by hand). The result must parse.
// Comments of doc are not kept.
func AddReferences(doc []byte, pool string, r References) ([]byte, []string, error) {
	p, err := decodeDraft(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("policy learn: the policy to merge into: %w", err)
	}
	pp, ok := p.Pools[pool]
	if !ok {
		return nil, nil, fmt.Errorf("policy learn: pool %s is not in the policy to merge into (learn it from a machine first, or write it)", pool)
	}
	uki := false
	for _, m := range []map[string][]string{r.Signers, r.Digests} {
		for stage := range m {
			switch stage {
			case "shim":
			case "bootloader", "kernel":
				if pp.TPM.UKI != nil && len(m[stage]) > 0 {
					return nil, nil, fmt.Errorf("policy learn: pools.%s judges unified kernel images (tpm.uki): a %s file has no stage there", pool, stage)
				}
			case "uki":
				uki = uki || len(m[stage]) > 0
			default:
				return nil, nil, fmt.Errorf("policy learn: no boot stage %q (shim, bootloader, kernel, uki)", stage)
			}
		}
	}
	t := &pp.TPM
	var notes []string
	note := func(format string, args ...any) {
		notes = append(notes, fmt.Sprintf("pools.%s.", pool)+fmt.Sprintf(format, args...))
	}
	if uki {
		if err := addUKIReferences(t, pool, r, note); err != nil {
			return nil, nil, err
		}
	}
	comps, where := &t.BootComponents, "tpm.bootComponents"
	var set *ReferenceSet
	if r.ReferenceSet != "" {
		i := slices.IndexFunc(t.ReferenceSets, func(s ReferenceSet) bool { return s.Name == r.ReferenceSet })
		if i < 0 {
			t.ReferenceSets = append(t.ReferenceSets, ReferenceSet{Name: r.ReferenceSet, Shim: cloneList(t.BootComponents.Shim),
				Bootloader: cloneList(t.BootComponents.Bootloader), Kernel: cloneList(t.BootComponents.Kernel)})
			i = len(t.ReferenceSets) - 1
			note("tpm.referenceSets %s: new, from the pool's stage rules", r.ReferenceSet)
		}
		set = &t.ReferenceSets[i]
		comps = &BootComponents{Shim: set.Shim, Bootloader: set.Bootloader, Kernel: set.Kernel}
		where = fmt.Sprintf("tpm.referenceSets[%d]", i)
		if r.NotAfter != "" {
			na, err := parseTime(r.NotAfter)
			if err != nil {
				return nil, nil, fmt.Errorf("policy learn: --not-after %q: %w", r.NotAfter, err)
			}
			set.NotAfter = &na
		}
	}
	for _, stage := range []string{"shim", "bootloader", "kernel"} {
		s := stageOf(comps, stage)
		for _, kind := range []struct {
			key  string
			vals []string
			list *[]string
		}{{"signedBy", r.Signers[stage], &s.SignedBy}, {"allow", r.Digests[stage], &s.Allow}} {
			if len(kind.vals) == 0 {
				continue
			}
			if s.Any {
				note("%s.%s: any: true kept; the %d %s value(s) read are not added", where, stage, len(kind.vals), kind.key)
				continue
			}
			for _, v := range kind.vals {
				*kind.list = appendNew(*kind.list, v)
			}
		}
	}
	if set != nil {
		set.Shim, set.Bootloader, set.Kernel = comps.Shim, comps.Bootloader, comps.Kernel
	}
	if a := r.After; a != nil {
		cmd := &KernelCmdline{Exact: []string{a.KernelCmdline}}
		var grub *GrubRules
		if len(a.Files) > 0 || len(a.Commands) > 0 {
			grub = &GrubRules{Files: a.Files, Commands: a.Commands}
		}
		switch {
		case set != nil:
			if t.KernelCmdline != nil {
				cmd.Variable = t.KernelCmdline.Variable
			}
			set.KernelCmdline = cmd
			if grub != nil {
				set.Grub = grub
			}
		default:
			if t.KernelCmdline != nil && !t.KernelCmdline.Any {
				if !slices.Contains(t.KernelCmdline.Exact, a.KernelCmdline) {
					t.KernelCmdline.Exact = append(t.KernelCmdline.Exact, a.KernelCmdline)
				}
			} else {
				t.KernelCmdline = cmd
			}
			if grub != nil {
				t.Grub = grub
				note("tpm.grub: replaced by what GRUB will measure for these files (no reference set given: the pool's machines on the old files are refused at their next attestation; --reference-set keeps both through a rollout)")
			}
		}
	}
	for _, c := range raiseSBAT(t, r.MinimumSBAT) {
		if c.from > 0 && c.to > c.from {
			note("tpm.minimumSBAT.%s: raised from %d to %d: machines whose shim enforces less are refused SBATLevelOutdated", c.comp, c.from, c.to)
		}
	}
	if len(r.KernelVersions) > 0 || r.MinimumKernel != "" {
		if t.MinimumKernel == nil {
			t.MinimumKernel = &MinimumKernel{}
		}
		m := t.MinimumKernel
		if m.Versions == nil {
			m.Versions = map[string]string{}
		}
		for d, v := range r.KernelVersions {
			m.Versions[strings.ToLower(d)] = v
		}
		switch {
		case r.MinimumKernel == "":
		case m.Version == "" || CompareVersions(r.MinimumKernel, m.Version) > 0:
			if m.Version != "" {
				note("tpm.minimumKernel.version: raised from %s to %s: machines on older kernels are refused KernelBelowMinimum", m.Version, r.MinimumKernel)
			}
			m.Version = r.MinimumKernel
		default:
			note("tpm.minimumKernel.version: %s kept (not lowered to %s)", m.Version, r.MinimumKernel)
		}
		if m.Version == "" {
			oldest := ""
			for _, v := range m.Versions {
				if oldest == "" || CompareVersions(v, oldest) < 0 {
					oldest = v
				}
			}
			m.Version = oldest
			note("tpm.minimumKernel.version: %s, the oldest kernel the policy knows (raise it with --minimum-kernel when a rollout is done)", oldest)
		}
	}
	p.Pools[pool] = pp
	out, err := Marshal(p)
	if err != nil {
		return nil, nil, fmt.Errorf("policy learn: %w", err)
	}
	pol, err := Parse(out)
	if err != nil {
		return nil, nil, fmt.Errorf("policy learn: the policy with the files' reference values does not check: %w", err)
	}
	return out, append(notes, openRules(pol, pool)...), nil
}

func cloneList(d DigestList) DigestList {
	return DigestList{Allow: slices.Clone(d.Allow), SignedBy: slices.Clone(d.SignedBy), Any: d.Any, Deny: slices.Clone(d.Deny)}
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
