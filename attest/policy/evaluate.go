package policy

import (
	"slices"

	"github.com/nodeproof/nodeproof/attest"
)

// Evaluate decides whether claims may have pool. It returns nil or an error
// wrapping an *attest.Denial with the first failed requirement's reason.
//
// Requirements, in order:
//   - the pool is in the policy (PoolNotInPolicy) and accepts the claims'
//     kind (EvidenceKindNotAllowed);
//   - for TPM claims, see evaluateTPM.
func (p *Policy) Evaluate(pool string, c *attest.Claims) error { return p.evaluate(pool, c, true) }

// EvaluateReattestation is Evaluate for a node attesting again after its
// enrolment: every requirement but the first-boot window of cloud
// evidence (GCP maxInstanceAge), which a running node is past by design.
func (p *Policy) EvaluateReattestation(pool string, c *attest.Claims) error {
	return p.evaluate(pool, c, false)
}

func (p *Policy) evaluate(pool string, c *attest.Claims, firstBoot bool) error {
	pp, ok := p.Pools[pool]
	if !ok {
		return attest.DenySetting(attest.ReasonPolicyUnknownPool, "pools."+pool, "pool %q is not in the policy: add pools.%s", pool, pool)
	}
	at := "pools." + pool + "." // where this pool's settings are
	if !slices.Contains(pp.Evidence, c.Kind) {
		return attest.DenySetting(attest.ReasonPolicyKindNotAllowed, at+"evidence", "pool %q does not accept %s evidence: %sevidence lists %v", pool, c.Kind, at, pp.Evidence)
	}
	switch c.Kind {
	case attest.KindTPM:
		if c.TPM == nil {
			return attest.Deny(attest.ReasonMalformed, "TPM claims without TPM facts")
		}
		return evaluateTPM(at+"tpm.", &pp.TPM, c.TPM)
	case attest.KindGCP:
		if c.GCP == nil {
			return attest.Deny(attest.ReasonMalformed, "GCP claims without GCP facts")
		}
		return evaluateGCP(at+"gcp.", &pp.GCP, c.GCP, c.VerifiedAt, firstBoot)
	case attest.KindAWS:
		if c.AWS == nil {
			return attest.Deny(attest.ReasonMalformed, "AWS claims without AWS facts")
		}
		return evaluateAWS(at+"aws.", &pp.AWS, c.AWS)
	}
	return attest.Deny(attest.ReasonPolicyKindNotAllowed, "unknown evidence kind %q", c.Kind)
}
