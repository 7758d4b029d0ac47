package policy

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// Revocations are revocations read from the formats they are published in
// (`nodeproof policy revoke`): a dbx update's image hashes and
// certificates, shim's SbatLevel, and the hashes a node's own dbx must
// hold.
type Revocations struct {
	// DeniedDigests are revoked images' Authenticode digests (SHA-256,
	// hex): tpm.deniedDigests.
	DeniedDigests []string
	// DeniedSigners are revoked certificates' SHA-256 fingerprints (hex):
	// tpm.deniedSigners.
	DeniedSigners []string
	// MinimumSBAT are an SbatLevel's generations: tpm.minimumSBAT, raised
	// where they are higher, never lowered.
	MinimumSBAT map[string]int
	// RequireDBX are hashes (hex) the firmware's dbx must revoke:
	// tpm.minimumDBX.contains.
	RequireDBX []string
}

// AddRevocations adds r to pool in the policy document doc and returns
// the new document and notes: r's digests join tpm.deniedDigests, its
// signers tpm.deniedSigners and its required dbx hashes
// tpm.minimumDBX.contains (each once, lower case); minimumSBAT is raised
// to r's generations where they are higher and kept where they are not.
// A note says what each change refuses, and names every place of the
// pool that still lists a revoked digest (a stage's allow) or signer (a
// stage's signedBy, machineOwnerKeys.allow): the denial refuses first,
// and the operator decides what replaces it. The pool must exist and its
// TPM rules judge a boot. The result must parse. Comments of doc are not
// kept.
func AddRevocations(doc []byte, pool string, r Revocations) ([]byte, []string, error) {
	p, err := decodeDraft(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("policy revoke: the policy: %w", err)
	}
	pp, ok := p.Pools[pool]
	if !ok {
		return nil, nil, fmt.Errorf("policy revoke: pool %s is not in the policy", pool)
	}
	if !pp.takesTPMBoot() {
		return nil, nil, fmt.Errorf("policy revoke: pool %s takes no evidence whose boot the TPM rules judge (tpm, or a cloud vTPM): its revocations would judge nothing", pool)
	}
	for _, l := range []struct {
		field string
		vals  []string
	}{{"deniedDigests", r.DeniedDigests}, {"deniedSigners", r.DeniedSigners}, {"minimumDBX.contains", r.RequireDBX}} {
		for _, v := range l.vals {
			if b, err := hex.DecodeString(v); err != nil || len(b) != 32 {
				return nil, nil, fmt.Errorf("policy revoke: tpm.%s: %q is not a SHA-256 (64 hex digits)", l.field, v)
			}
		}
	}
	for comp, gen := range r.MinimumSBAT {
		if comp == "" || strings.ContainsAny(comp, ",\n") || gen < 1 {
			return nil, nil, fmt.Errorf("policy revoke: tpm.minimumSBAT: %q: %d: want a component name and a generation of at least 1", comp, gen)
		}
	}
	t := &pp.TPM
	at := "pools." + pool + ".tpm."
	var notes []string
	note := func(format string, args ...any) { notes = append(notes, at+fmt.Sprintf(format, args...)) }

	if n := addNew(&t.DeniedDigests, r.DeniedDigests); n > 0 {
		note("deniedDigests: %d revoked image digest(s) added (%d in all): a boot that measures one is refused BootComponentDenied", n, len(t.DeniedDigests))
	}
	if len(r.DeniedSigners) > 0 {
		cur, err := fingerprints("tpm.deniedSigners", t.DeniedSigners)
		if err != nil {
			return nil, nil, fmt.Errorf("policy revoke: pools.%s.%w", pool, err)
		}
		t.DeniedSigners = cur
		if n := addNew(&t.DeniedSigners, r.DeniedSigners); n > 0 {
			note("deniedSigners: %d revoked certificate(s) added (%d in all): a boot in which one verified an image is refused BootSignerDenied", n, len(t.DeniedSigners))
		}
	}
	if len(r.RequireDBX) > 0 {
		if t.MinimumDBX == nil {
			t.MinimumDBX = &MinimumDBX{}
		}
		if n := addNew(&t.MinimumDBX.Contains, r.RequireDBX); n > 0 {
			note("minimumDBX.contains: %d hash(es) added (%d in all): a node whose firmware dbx (PCR 7) lacks one is refused DBXOutdated until the update is applied to it", n, len(t.MinimumDBX.Contains))
		}
	}
	for _, c := range raiseSBAT(t, r.MinimumSBAT) {
		switch {
		case c.to > c.from:
			from := "unset"
			if c.from > 0 {
				from = fmt.Sprint(c.from)
			}
			note("minimumSBAT.%s: raised from %s to %d: a shim whose SbatLevel revokes less is refused SBATLevelOutdated", c.comp, from, c.to)
		case c.to < c.from:
			note("minimumSBAT.%s: %d kept (not lowered to %d)", c.comp, c.from, c.to)
		}
	}
	notes = append(notes, stillListed(t, at, r)...)
	p.Pools[pool] = pp
	out, err := Marshal(p)
	if err != nil {
		return nil, nil, fmt.Errorf("policy revoke: %w", err)
	}
	if _, err := Parse(out); err != nil {
		return nil, nil, fmt.Errorf("policy revoke: the policy with the revocations does not check: %w", err)
	}
	return out, notes, nil
}

// stillListed names each place of t that admits what r revokes: a
// stage's allow listing a revoked digest, a stage's signedBy or
// machineOwnerKeys.allow listing a revoked signer.
func stillListed(t *TPMPolicy, at string, r Revocations) []string {
	var out []string
	for _, st := range t.stageRules() {
		for _, d := range st.d.Allow {
			if containsHex(r.DeniedDigests, d) {
				out = append(out, fmt.Sprintf("%s%s.allow lists %s, now in deniedDigests: the denial refuses first; remove it when its replacement is listed", at, strings.TrimPrefix(st.at, "tpm."), strings.ToLower(d)))
			}
		}
		signers, _ := fingerprints(st.at+".signedBy", st.d.SignedBy)
		for _, s := range signers {
			if containsHex(r.DeniedSigners, s) {
				out = append(out, fmt.Sprintf("%s%s.signedBy lists %s, now in deniedSigners: the denial refuses first; list the replacement signer (a stage with no signer left refuses every boot)", at, strings.TrimPrefix(st.at, "tpm."), s))
			}
		}
	}
	if m := t.MachineOwnerKeys; m != nil {
		moks, _ := fingerprints("tpm.machineOwnerKeys.allow", m.Allow)
		for _, s := range moks {
			if containsHex(r.DeniedSigners, s) {
				out = append(out, fmt.Sprintf("%smachineOwnerKeys.allow lists %s, now in deniedSigners: the denial refuses first", at, s))
			}
		}
	}
	return out
}

// addNew appends each of vals (lower case) not already in *l (in any
// case) and returns how many it added.
func addNew(l *[]string, vals []string) int {
	n := 0
	for _, v := range vals {
		v = strings.ToLower(v)
		if !slices.ContainsFunc(*l, func(s string) bool { return strings.EqualFold(s, v) }) {
			*l = append(*l, v)
			n++
		}
	}
	return n
}

// sbatChange is what raiseSBAT did with one component: from its
// generation before (0: unset) to the one asked for (kept when lower).
type sbatChange struct {
	comp     string
	from, to int
}

// raiseSBAT raises t.MinimumSBAT to min's generations where they are
// higher, never lowering one, and says what it did with each component of
// min, in name order.
func raiseSBAT(t *TPMPolicy, min map[string]int) []sbatChange {
	if len(min) == 0 {
		return nil
	}
	if t.MinimumSBAT == nil {
		t.MinimumSBAT = map[string]int{}
	}
	var out []sbatChange
	for _, comp := range sortedKeys(min) {
		c := sbatChange{comp: comp, from: t.MinimumSBAT[comp], to: min[comp]}
		if c.to > c.from {
			t.MinimumSBAT[comp] = c.to
		}
		out = append(out, c)
	}
	return out
}
