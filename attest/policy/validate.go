package policy

import (
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
)

// normalize replaces each PEM certificate of signedBy and
// machineOwnerKeys.allow with its SHA-256 fingerprint, which evaluation
// compares.
func (p *Policy) normalize() error {
	for name, pool := range p.Pools {
		t := &pool.TPM
		var err error
		for _, st := range t.stageRules() {
			if st.d.SignedBy, err = fingerprints(st.at+".signedBy", st.d.SignedBy); err != nil {
				return fmt.Errorf("pool %q: %w", name, err)
			}
		}
		if u := t.UKI; u != nil {
			if u.SignedBy, err = fingerprints("tpm.uki.signedBy", u.SignedBy); err != nil {
				return fmt.Errorf("pool %q: %w", name, err)
			}
		}
		if m := t.MachineOwnerKeys; m != nil {
			if m.Allow, err = fingerprints("tpm.machineOwnerKeys.allow", m.Allow); err != nil {
				return fmt.Errorf("pool %q: %w", name, err)
			}
		}
		if t.DeniedSigners, err = fingerprints("tpm.deniedSigners", t.DeniedSigners); err != nil {
			return fmt.Errorf("pool %q: %w", name, err)
		}
		p.Pools[name] = pool
	}
	return nil
}

// stageRef is one stage's rules of bootComponents or a reference set, and
// where they are (tpm.bootComponents.kernel).
type stageRef struct {
	at string
	d  *DigestList
}

// stageRules are the stage rules of bootComponents and of each reference
// set.
func (t *TPMPolicy) stageRules() []stageRef {
	c := &t.BootComponents
	out := []stageRef{{"tpm.bootComponents.shim", &c.Shim}, {"tpm.bootComponents.bootloader", &c.Bootloader}, {"tpm.bootComponents.kernel", &c.Kernel}}
	for i := range t.ReferenceSets {
		r := &t.ReferenceSets[i]
		at := fmt.Sprintf("tpm.referenceSets[%d].", i)
		out = append(out, stageRef{at + "shim", &r.Shim}, stageRef{at + "bootloader", &r.Bootloader}, stageRef{at + "kernel", &r.Kernel})
	}
	return out
}

func (p *Policy) validate() error {
	if p.APIVersion != APIVersion || p.Kind != Kind {
		return fmt.Errorf("apiVersion/kind must be %s/%s, not %s/%s", APIVersion, Kind, p.APIVersion, p.Kind)
	}
	if len(p.Pools) == 0 {
		return errors.New("no pools")
	}
	roots := map[string]bool{}
	for _, r := range p.Trust.EKRoots {
		if r.Name == "" || r.Dir == "" {
			return errors.New("trust.ekRoots: every entry needs a name and a dir")
		}
		if roots[r.Name] {
			return fmt.Errorf("trust.ekRoots: %q named twice", r.Name)
		}
		roots[r.Name] = true
	}
	if err := checkSecureBootCAs(p.Trust.SecureBootCAs); err != nil {
		return err
	}
	ekKind, ekPool := "", ""
	for _, name := range sortedPools(p) {
		pool := p.Pools[name]
		if err := pool.validate(roots, p.Trust.EKInventory != ""); err != nil {
			return fmt.Errorf("pool %q: %w", name, err)
		}
		if !pool.takes(attest.KindTPM) {
			continue
		}
		if k := pool.TPM.EKKind(); ekKind == "" {
			ekKind, ekPool = k, name
		} else if k != ekKind {
			return fmt.Errorf("pool %q: tpm.ek %s, but pool %q accepts %s: one TPM would be two identities (an identity is an EK, and a TPM holds one of each kind its vendor certified); every pool names the same kind", name, k, ekPool, ekKind)
		}
	}
	return nil
}

func (pool Pool) validate(roots map[string]bool, haveInventory bool) error {
	allow := pool.AllowLists()
	for _, k := range pool.Evidence {
		if kindOf(k) == nil {
			return fmt.Errorf("unknown evidence kind %q", k)
		}
		var errs []error
		for _, l := range allow {
			if l.judges(k) {
				errs = append(errs, l.check())
			}
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	switch pool.Serve.InsecurePort {
	case "", "public", "none", "all":
	default:
		return fmt.Errorf("serve.insecurePort %q is not public, none or all", pool.Serve.InsecurePort)
	}
	switch pool.AWS.NodeName {
	case "", AWSNodeNamePrivateDNS, AWSNodeNameInstanceID:
	default:
		return fmt.Errorf("aws.nodeName %q is not %s or %s", pool.AWS.NodeName, AWSNodeNamePrivateDNS, AWSNodeNameInstanceID)
	}
	if l := pool.Lifetime; l.StaleAfter.Duration > 0 {
		iv := l.Interval.Duration
		if iv == 0 {
			iv = DefaultReattestInterval
		}
		if l.StaleAfter.Duration < iv {
			return fmt.Errorf("lifetime.staleAfter %s is shorter than the interval %s", l.StaleAfter.Duration, iv)
		}
	}
	switch pool.Lifetime.TaintEffect {
	case "", TaintNoSchedule, TaintNoExecute:
	default:
		return fmt.Errorf("lifetime.taintEffect %q is not %s or %s", pool.Lifetime.TaintEffect, TaintNoSchedule, TaintNoExecute)
	}
	switch pool.Reenrol {
	case "", ReenrolAfterRelease, ReenrolAlways:
	default:
		return fmt.Errorf("reenrol %q is not %s or %s", pool.Reenrol, ReenrolAfterRelease, ReenrolAlways)
	}
	switch pool.Serve.NodeNames {
	case "", "evidence", "requested":
	default:
		return fmt.Errorf("serve.nodeNames %q is not evidence or requested", pool.Serve.NodeNames)
	}
	if m := pool.Serve.MaxLiveEnrolments; m < 0 || m > MaxLiveEnrolmentsCap {
		return fmt.Errorf("serve.maxLiveEnrolments %d is not 0 (the server's default) to %d", m, MaxLiveEnrolmentsCap)
	}
	t := pool.TPM
	if t.EK != "" && !slices.Contains(attest.EKKinds, t.EK) {
		return fmt.Errorf("tpm.ek %q is not a kind of EK (%s)", t.EK, strings.Join(attest.EKKinds, ", "))
	}
	if m := t.MinimumKernel; m != nil {
		if err := m.check(); err != nil {
			return err
		}
	}
	if m := t.MicrosoftCA2023; m != nil {
		if err := m.check("tpm."); err != nil {
			return err
		}
	}
	if err := checkAfterKernel("tpm.", t.KernelCmdline, t.Grub); err != nil {
		return err
	}
	if t.UKI != nil {
		if err := t.UKI.check(&t); err != nil {
			return err
		}
	}
	for _, tr := range t.EKTrust {
		switch {
		case tr == "inventory":
			if !haveInventory {
				return errors.New("tpm.ekTrust names inventory but trust.ekInventory is empty")
			}
		case strings.HasPrefix(tr, "ca:") && roots[strings.TrimPrefix(tr, "ca:")]:
		default:
			return fmt.Errorf("tpm.ekTrust %q is neither inventory nor ca:<a trust.ekRoots name>", tr)
		}
	}
	lists := map[string][]string{
		"bootComponents.shim.allow": t.BootComponents.Shim.Allow, "bootComponents.shim.deny": t.BootComponents.Shim.Deny,
		"bootComponents.bootloader.allow": t.BootComponents.Bootloader.Allow, "bootComponents.bootloader.deny": t.BootComponents.Bootloader.Deny,
		"bootComponents.kernel.allow": t.BootComponents.Kernel.Allow, "bootComponents.kernel.deny": t.BootComponents.Kernel.Deny,
		"deniedDigests": t.DeniedDigests,
	}
	if t.MinimumDBX != nil {
		lists["minimumDBX.contains"] = t.MinimumDBX.Contains
		if t.MinimumDBX.Entries < 0 {
			return errors.New("tpm.minimumDBX.entries is negative")
		}
	}
	for field, l := range lists {
		for _, d := range l {
			if err := checkHex(d); err != nil {
				return fmt.Errorf("tpm.%s: %w", field, err)
			}
		}
	}
	if err := checkAudit(t.Audit); err != nil {
		return err
	}
	names := map[string]bool{}
	for i, r := range t.ReferenceSets {
		if r.Name == "" || names[r.Name] {
			return fmt.Errorf("tpm.referenceSets[%d]: every set needs a name of its own (%q)", i, r.Name)
		}
		names[r.Name] = true
		at := fmt.Sprintf("tpm.referenceSets[%d].", i)
		if err := checkAfterKernel(at, r.KernelCmdline, r.Grub); err != nil {
			return err
		}
		for _, l := range []AllowList{{Field: at + "kernelCmdline", AnyField: at + "kernelCmdline.any", What: "kernel command lines", Items: cmdlineItems(r.KernelCmdline), Any: r.KernelCmdline != nil && r.KernelCmdline.Any},
			{Field: at + "grub", AnyField: at + "grub.any", What: "files GRUB read and commands it ran", Items: grubItems(r.Grub), Any: r.Grub != nil && r.Grub.Any}} {
			if (l.Field == at+"kernelCmdline" && r.KernelCmdline == nil) || (l.Field == at+"grub" && r.Grub == nil) {
				continue // the pool's
			}
			if err := l.check(); err != nil {
				return err
			}
		}
	}
	for _, st := range t.stageRules() {
		if strings.HasPrefix(st.at, "tpm.referenceSets") && !st.d.Any && len(st.d.Allow) == 0 && len(st.d.SignedBy) == 0 {
			return fmt.Errorf("%s: allow, signedBy or any: true is required (an empty stage allows none)", st.at)
		}
		for _, l := range [][]string{st.d.Allow, st.d.Deny} {
			for _, d := range l {
				if err := checkHex(d); err != nil {
					return fmt.Errorf("%s: %w", st.at, err)
				}
			}
		}
		if _, err := fingerprints(st.at+".signedBy", st.d.SignedBy); err != nil {
			return err
		}
	}
	if m := t.MachineOwnerKeys; m != nil {
		if _, err := fingerprints("tpm.machineOwnerKeys.allow", m.Allow); err != nil {
			return err
		}
	}
	if _, err := fingerprints("tpm.deniedSigners", t.DeniedSigners); err != nil {
		return err
	}
	for comp, gen := range t.MinimumSBAT {
		if comp == "" || strings.ContainsAny(comp, ",\n") || gen < 1 {
			return fmt.Errorf("tpm.minimumSBAT: %q: %d: want a component name and a generation of at least 1", comp, gen)
		}
	}
	for idx, v := range t.PCRs {
		i, err := strconv.Atoi(idx)
		if err != nil || i < 0 || i > 23 {
			return fmt.Errorf("tpm.pcrs: %q is not a PCR index 0-23", idx)
		}
		if err := checkHex(v); err != nil {
			return fmt.Errorf("tpm.pcrs[%s]: %w", idx, err)
		}
	}
	return nil
}

// checkAfterKernel checks a command-line rule and GRUB rules (at: where
// they are): patterns that are patterns, variable only with exact, digests
// that are digests.
func checkAfterKernel(at string, k *KernelCmdline, g *GrubRules) error {
	if k != nil {
		if len(k.Variable) > 0 && len(k.Exact) == 0 {
			return fmt.Errorf("%skernelCmdline.variable: only with exact (it says which words of an exact command line may differ)", at)
		}
		for _, pat := range k.Variable {
			if _, err := path.Match(pat, ""); err != nil || strings.TrimSpace(pat) == "" || strings.ContainsAny(pat, " \t") {
				return fmt.Errorf("%skernelCmdline.variable: %q is not a pattern of one word", at, pat)
			}
		}
		for _, e := range k.Exact {
			if len(cmdlineWords(e)) == 0 {
				return fmt.Errorf("%skernelCmdline.exact: an empty command line", at)
			}
		}
	}
	if g != nil {
		for i, f := range g.Files {
			if err := checkHex(f.Digest); err != nil {
				return fmt.Errorf("%sgrub.files[%d].digest: %w", at, i, err)
			}
		}
	}
	return nil
}

func cmdlineItems(k *KernelCmdline) []string {
	if k == nil {
		return nil
	}
	return slices.Concat(k.Exact, k.Require, k.Forbid)
}

func grubItems(g *GrubRules) []string {
	if g == nil {
		return nil
	}
	out := slices.Clone(g.Commands)
	for _, f := range g.Files {
		out = append(out, f.Digest)
	}
	return out
}

func checkHex(s string) error {
	b, err := hex.DecodeString(s)
	if err != nil || (len(b) != 20 && len(b) != 32 && len(b) != 48) {
		return fmt.Errorf("%q is not a hex SHA-1/256/384 digest", s)
	}
	return nil
}
