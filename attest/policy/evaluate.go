package policy

import (
	"slices"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
)

// Evaluate decides whether claims may have pool. It returns nil or an error
// wrapping an *attest.Denial with the first failed requirement's reason.
// It is Decide without the audit reports and with the claims' VerifiedAt
// as the clock.
//
// Requirements, in order:
//   - the pool is in the policy (PoolNotInPolicy) and accepts the claims'
//     kind (EvidenceKindNotAllowed);
//   - then the kind's evaluation in the table of kinds (kinds.go): for
//     TPM claims, evaluateBareMetal (evaluateTPM); for a cloud identity
//     (gcp, aws), evaluateInstance (evaluateGCP, evaluateAWS); for a
//     cloud vTPM (gce-vtpm, aws-nitrotpm, azure-vtpm), evaluateVTPM.
func (p *Policy) Evaluate(pool string, c *attest.Claims) error {
	_, err := p.Decide(pool, c, Options{})
	return err
}

// EvaluateReattestation is Evaluate for a node attesting again after its
// enrolment (Options.Reattestation).
func (p *Policy) EvaluateReattestation(pool string, c *attest.Claims) error {
	_, err := p.Decide(pool, c, Options{Reattestation: true})
	return err
}

// Decide is Evaluate that also says, of a machine it admits, which rules
// in audit mode (Pool.Audit, tpm.audit) would have refused it and why.
func (p *Policy) Decide(pool string, c *attest.Claims, o Options) (*Decision, error) {
	pp, ok := p.Pools[pool]
	if !ok {
		return nil, attest.DenySetting(attest.ReasonPolicyUnknownPool, "pools."+pool, "pool %q is not in the policy: add pools.%s", pool, pool)
	}
	at := "pools." + pool + "." // where this pool's settings are
	if !slices.Contains(pp.Evidence, c.Kind) {
		return nil, attest.DenySetting(attest.ReasonPolicyKindNotAllowed, at+"evidence", "pool %q does not accept %s evidence: %sevidence lists %v", pool, c.Kind, at, pp.Evidence)
	}
	e := &evaluation{now: o.Now, all: pp.Audit, rules: pp.TPM.Audit, explain: o.Explain, cas: p.SecureBootCAs()}
	if e.now.IsZero() {
		e.now = c.VerifiedAt
	}
	r := kindOf(c.Kind)
	if r == nil {
		return nil, attest.Deny(attest.ReasonPolicyKindNotAllowed, "unknown evidence kind %q", c.Kind)
	}
	if err := r.evaluate(r, at, &pp, c, e, o); err != nil {
		return nil, err
	}
	if len(e.refusals) > 0 {
		return &Decision{Audits: e.audits, Refusals: e.refusals}, explained(e.refusals)
	}
	return &Decision{Audits: e.audits}, nil
}

// explained is the refusal of an Explain decision: the first rule's
// reason and setting, with every rule's refusal in its message.
func explained(audits []Audit) error {
	var lines []string
	for _, a := range audits {
		lines = append(lines, a.String())
	}
	first := audits[0]
	return attest.DenySetting(first.Reason, first.Setting, "%s", strings.Join(lines, "\n"))
}

// JudgeBoot judges a boot alone by pool's boot rules — what a quote of
// the bank tc.PCRBank whose PCRs are the log's own would get, from the
// bank on (evaluateBoot's rules, under tpm's) — with every rule explained
// (Options.Explain): `nodeproof policy check --event-log`. The EK, its
// trust and a cloud instance are not judged: a log has none of them.
func (p *Policy) JudgeBoot(pool string, tc *attest.TPMClaims, o Options) (*Decision, error) {
	pp, ok := p.Pools[pool]
	if !ok {
		return nil, attest.DenySetting(attest.ReasonPolicyUnknownPool, "pools."+pool, "pool %q is not in the policy: add pools.%s", pool, pool)
	}
	if !pp.takesTPMBoot() {
		return nil, attest.DenySetting(attest.ReasonPolicyKindNotAllowed, "pools."+pool+".evidence", "pool %q takes no evidence whose boot the tpm rules judge (%s)", pool, bootKinds())
	}
	at := "pools." + pool + ".tpm."
	e := &evaluation{now: o.Now, all: pp.Audit, rules: pp.TPM.Audit, explain: true}
	banks := map[string]bool{"sha256": true, "sha1": pp.TPM.AllowSHA1}
	for _, k := range pp.Evidence {
		if r := kindOf(k); r != nil && r.boot {
			banks[r.bank] = true
		}
	}
	if !banks[tc.PCRBank] {
		return nil, attest.DenySetting(attest.ReasonPolicySHA1, at+"allowSHA1", "a log of the %s bank; this pool takes sha256 (sha1 with %sallowSHA1, sha384 from a NitroTPM)", tc.PCRBank, at)
	}
	if err := evaluateBoot(at, &pp.TPM, tc, e); err != nil {
		return nil, err
	}
	d := &Decision{Audits: e.audits, Refusals: e.refusals}
	if len(e.refusals) > 0 {
		return d, explained(e.refusals)
	}
	return d, nil
}
