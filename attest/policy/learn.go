package policy

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"

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
}

// ErrNodeNamesUnset: the learned pool would refuse the machine
// NodeNameNotEstablished — its EK is trusted through a vendor CA, which
// names no node, and the pool takes no requested names — and Learned says
// nothing of node names: the operator must choose (serve.nodeNames:
// requested, or an EK inventory that names the machine's node).
var ErrNodeNamesUnset = errors.New("how this pool's machines get their node names is not set")

// Learn writes what l says into pool of the policy document doc (YAML;
// empty for a new document) and returns the new document and notes for
// the operator. Comments of doc are not kept.
//
// A new pool gets: evidence [tpm]; ekTrust [l.EKTrust]; requireSecureBoot
// when the machine booted with Secure Boot on; minimumDBX.entries, its
// dbx's entry count; minimumSBAT, the SbatLevel its shim measured (with
// Secure Boot on); for the shim, the boot loader and the kernel, a
// signedBy of the authorities that verified it (every one the log leaves
// possible, with a note when several), and with l.Digests (or where the
// log names no signer: Secure Boot off) an allow list of the digest the
// log established (a stage it did not establish gets any: true, and a
// note); allowSHA1 when the bank is SHA-1.
//
// An existing pool (merging a second machine): each stage's signers join
// its signedBy and (as above) its digest its allow list (a stage that
// says any stays so), its EK trust joins ekTrust; requireSecureBoot,
// minimumDBX and minimumSBAT stay as they are, with a note when this
// machine does not meet them.
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
	root := map[string]any{}
	if len(bytes.TrimSpace(doc)) > 0 {
		if err := yaml.Unmarshal(doc, &root); err != nil {
			return nil, nil, fmt.Errorf("policy learn: the policy to merge into: %w", err)
		}
	} else {
		root["apiVersion"], root["kind"] = APIVersion, Kind
	}
	pools := child(root, "pools")
	_, existed := pools[pool]
	p := child(pools, pool)
	tpm := child(p, "tpm")
	var notes []string
	b := l.Boot

	if !existed {
		p["evidence"] = []any{string(attest.KindTPM)}
		tpm["ekTrust"] = []any{l.EKTrust}
		if b.SecureBootKnown && b.SecureBoot {
			tpm["requireSecureBoot"] = true
		} else {
			notes = append(notes, fmt.Sprintf("pools.%s.tpm.requireSecureBoot: not set, the machine booted with Secure Boot %s", pool, onOff(b)))
		}
		if b.DBXKnown {
			tpm["minimumDBX"] = map[string]any{"entries": b.DBXEntries}
		} else {
			notes = append(notes, fmt.Sprintf("pools.%s.tpm.minimumDBX: not set, the log did not measure dbx", pool))
		}
		if l.Bank == "sha1" {
			tpm["allowSHA1"] = true
			notes = append(notes, fmt.Sprintf("pools.%s.tpm.allowSHA1: true, the log has only SHA-1 digests (forgeable by collision)", pool))
		}
		if b.KernelCmdlineKnown {
			notes = append(notes, fmt.Sprintf("pools.%s.tpm.kernelCmdline: not learned; the machine's was %q", pool, b.KernelCmdline))
		}
		if st := b.ShimState; st != nil && st.SBATLevelKnown && len(st.SBAT) > 0 && b.SecureBoot {
			m := map[string]any{}
			for comp, gen := range st.SBAT {
				m[comp] = gen
			}
			tpm["minimumSBAT"] = m
		}
	} else {
		p["evidence"] = addTo(p["evidence"], string(attest.KindTPM))
		if !truthy(tpm["anyEKTrust"]) {
			tpm["ekTrust"] = addTo(tpm["ekTrust"], l.EKTrust)
		}
	}
	if l.Root != nil || l.Inventory != "" {
		trust := child(root, "trust")
		if l.Root != nil {
			roots, _ := trust["ekRoots"].([]any)
			if !slices.ContainsFunc(roots, func(r any) bool { m, _ := r.(map[string]any); return m["name"] == l.Root.Name }) {
				trust["ekRoots"] = append(roots, map[string]any{"name": l.Root.Name, "dir": l.Root.Dir})
			}
		}
		if l.Inventory != "" {
			trust["ekInventory"] = l.Inventory
		}
	}

	// How node names are established: the learned pool must name the
	// machine it was learned from, or it refuses it NodeNameNotEstablished.
	switch l.NodeNames {
	case "":
		sv, _ := p["serve"].(map[string]any)
		cur, _ := sv["nodeNames"].(string)
		if cur != "requested" && l.EKTrust != "inventory" {
			return nil, nil, fmt.Errorf("policy learn: pools.%s.serve.nodeNames: %w: a TPM trusted through %s names no node (only an EK inventory's entries do), so the pool would refuse the machine NodeNameNotEstablished; choose serve.nodeNames: requested (the name the agent asks for; the first identity to enrol owns it) or EK trust through an inventory that names the node", pool, ErrNodeNamesUnset, l.EKTrust)
		}
	case "requested", "evidence":
		if l.NodeNames == "evidence" && l.EKTrust != "inventory" {
			return nil, nil, fmt.Errorf("policy learn: pools.%s.serve.nodeNames: evidence: a TPM trusted through %s names no node, so the pool would refuse the machine NodeNameNotEstablished; take requested names, or trust the EK through an inventory", pool, l.EKTrust)
		}
		sv := child(p, "serve")
		if cur, _ := sv["nodeNames"].(string); existed && cur != l.NodeNames && (cur != "" || l.NodeNames != "evidence") {
			notes = append(notes, fmt.Sprintf("pools.%s.serve.nodeNames: %s, was %q", pool, l.NodeNames, cur))
		}
		sv["nodeNames"] = l.NodeNames
	default:
		return nil, nil, fmt.Errorf("policy learn: node names %q: want requested or evidence", l.NodeNames)
	}

	comps := child(tpm, "bootComponents")
	for _, st := range chainStages {
		digest, apps := stageApps(&b, st.key)
		s := child(comps, st.key)
		signers, many := learnedSigners(&b, apps)
		switch {
		case truthy(s["any"]):
		case digest != "" && len(signers) > 0:
			for _, sg := range signers {
				s["signedBy"] = addTo(s["signedBy"], sg)
			}
			if many {
				notes = append(notes, fmt.Sprintf("pools.%s.tpm.bootComponents.%s.signedBy: the log leaves %d authorities that may have verified the %s, all listed: keep only those that sign your %ss", pool, st.key, len(signers), st.what, st.what))
			}
			if l.Digests {
				s["allow"] = addTo(s["allow"], digest)
			} else if _, had := s["allow"]; had {
				s["allow"] = addTo(s["allow"], digest) // a pool pinned by digest stays so
			}
		case digest != "" && !l.Digests:
			s["allow"] = addTo(s["allow"], digest)
			notes = append(notes, fmt.Sprintf("pools.%s.tpm.bootComponents.%s: the log names no signer of the %s (Secure Boot off?): pinned by its digest", pool, st.key, st.what))
		case digest == "":
			why := fmt.Sprintf("the log did not establish a %s", st.what)
			if st.key == "kernel" && kernelOnlyInPCR9(b) {
				why = "the kernel was measured only into PCR 9: with Secure Boot off, GRUB loads the kernel itself " +
					"(not through the shim and the firmware), so the log holds the SHA-256 of its file (PCR 9), not the " +
					"Authenticode digest of a boot application (PCR 4) that kernel lists pin; turn Secure Boot on to pin the kernel, " +
					"or pin PCR 9 under pcrs (it also covers grub.cfg and the initramfs)"
			}
			if existed {
				notes = append(notes, fmt.Sprintf("pools.%s.tpm.bootComponents.%s: unchanged, %s", pool, st.key, why))
				continue
			}
			s["any"] = true
			notes = append(notes, fmt.Sprintf("pools.%s.tpm.bootComponents.%s: any: true, %s; narrow it by hand", pool, st.key, why))
		default:
			s["allow"] = addTo(s["allow"], digest)
		}
	}

	out, err := yaml.Marshal(root)
	if err != nil {
		return nil, nil, fmt.Errorf("policy learn: %w", err)
	}
	pol, err := Parse(out)
	if err != nil {
		return nil, nil, fmt.Errorf("policy learn: the learned policy does not check: %w", err)
	}
	claims := &attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{EKTrust: l.EKTrust, PCRBank: l.Bank, Boot: b}}
	err = pol.Evaluate(pool, claims)
	if existed {
		// A kept minimum this machine is below: said, not refused, if
		// nothing else would refuse it (Evaluate stops at the first).
		pp := pol.Pools[pool]
		for _, kept := range []struct {
			reason attest.Reason
			drop   func()
			note   string
		}{
			{attest.ReasonPolicyDBX, func() { pp.TPM.MinimumDBX = nil }, fmt.Sprintf("pools.%s.tpm.minimumDBX: kept; this machine's dbx (%d entries) is older and is refused until it is updated", pool, b.DBXEntries)},
			{attest.ReasonPolicySBAT, func() { pp.TPM.MinimumSBAT = nil }, fmt.Sprintf("pools.%s.tpm.minimumSBAT: kept; this machine's shim enforces older SBAT revocations and is refused until it is updated", pool)},
		} {
			if r, _ := attest.ReasonOf(err); r == kept.reason {
				kept.drop()
				pol.Pools[pool] = pp
				if err = pol.Evaluate(pool, claims); err == nil {
					notes = append(notes, kept.note)
				}
			}
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("policy learn: pool %s would refuse the machine it was learned from: %w", pool, err)
	}
	return out, notes, nil
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
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out, many
}

// kernelOnlyInPCR9 reports a boot where GRUB booted a kernel (its
// command line is measured) and the boot completed (ExitBootServices),
// but no boot application followed GRUB's: GRUB loaded the kernel itself,
// as Debian's GRUB does with Secure Boot off, and measured only its file
// into PCR 9.
func kernelOnlyInPCR9(b attest.BootState) bool {
	return b.KernelCmdlineKnown && b.ExitBootServices && b.Kernel == "" && len(b.BootApplications) == 2
}

// child is m[key] as a map, made if absent (or not a map).
func child(m map[string]any, key string) map[string]any {
	if c, ok := m[key].(map[string]any); ok {
		return c
	}
	c := map[string]any{}
	m[key] = c
	return c
}

// addTo is the list v (a YAML sequence, or nothing) with s, once.
func addTo(v any, s string) []any {
	l, _ := v.([]any)
	if slices.ContainsFunc(l, func(x any) bool { return x == s }) {
		return l
	}
	return append(l, s)
}

func truthy(v any) bool { b, _ := v.(bool); return b }

func onOff(b attest.BootState) string {
	switch {
	case !b.SecureBootKnown:
		return "unknown (not measured)"
	case b.SecureBoot:
		return "on"
	}
	return "off"
}

// References are reference values read from boot files, not from a
// machine (`nodeproof policy learn --efi`): by stage ("shim",
// "bootloader", "kernel"), the certificates that may verify each
// (fingerprints) and its Authenticode digests; and the SbatLevel the shim
// applies.
type References struct {
	Signers     map[string][]string
	Digests     map[string][]string
	MinimumSBAT map[string]int
}

// AddReferences adds r to pool in the policy document doc and returns the
// new document and notes: each stage's signers join its signedBy and its
// digests its allow list (a stage that says any stays so, with a note);
// minimumSBAT is raised to r's generations where they are higher (never
// lowered). The pool must exist (its EK trust and Secure Boot rules come
// from a machine, or by hand). The result must parse. Comments of doc are
// not kept.
func AddReferences(doc []byte, pool string, r References) ([]byte, []string, error) {
	root := map[string]any{}
	if err := yaml.Unmarshal(doc, &root); err != nil {
		return nil, nil, fmt.Errorf("policy learn: the policy to merge into: %w", err)
	}
	pools, _ := root["pools"].(map[string]any)
	p, ok := pools[pool].(map[string]any)
	if !ok {
		return nil, nil, fmt.Errorf("policy learn: pool %s is not in the policy to merge into (learn it from a machine first, or write it)", pool)
	}
	for _, m := range []map[string][]string{r.Signers, r.Digests} {
		for stage := range m {
			if stage != "shim" && stage != "bootloader" && stage != "kernel" {
				return nil, nil, fmt.Errorf("policy learn: no boot stage %q (shim, bootloader, kernel)", stage)
			}
		}
	}
	tpm := child(p, "tpm")
	comps := child(tpm, "bootComponents")
	var notes []string
	for _, stage := range []string{"shim", "bootloader", "kernel"} {
		for _, kind := range []struct {
			key  string
			vals []string
		}{{"signedBy", r.Signers[stage]}, {"allow", r.Digests[stage]}} {
			if len(kind.vals) == 0 {
				continue
			}
			s := child(comps, stage)
			if truthy(s["any"]) {
				notes = append(notes, fmt.Sprintf("pools.%s.tpm.bootComponents.%s: any: true kept; the %d %s value(s) read are not added", pool, stage, len(kind.vals), kind.key))
				continue
			}
			for _, v := range kind.vals {
				s[kind.key] = addTo(s[kind.key], v)
			}
		}
	}
	if len(r.MinimumSBAT) > 0 {
		m := child(tpm, "minimumSBAT")
		for _, comp := range slices.Sorted(maps.Keys(r.MinimumSBAT)) {
			gen := r.MinimumSBAT[comp]
			cur, _ := m[comp].(int)
			switch {
			case cur == 0:
				m[comp] = gen
			case gen > cur:
				m[comp] = gen
				notes = append(notes, fmt.Sprintf("pools.%s.tpm.minimumSBAT.%s: raised from %d to %d: machines whose shim enforces less are refused SBATLevelOutdated", pool, comp, cur, gen))
			}
		}
	}
	out, err := yaml.Marshal(root)
	if err != nil {
		return nil, nil, fmt.Errorf("policy learn: %w", err)
	}
	if _, err := Parse(out); err != nil {
		return nil, nil, fmt.Errorf("policy learn: the policy with the files' reference values does not check: %w", err)
	}
	return out, notes, nil
}
