// Package rejudge judges enrolled nodes' last verified claims by a policy,
// written once for its two users: `nodeproof policy check
// --against-records` (the dry run: what a policy would make of the fleet)
// and the server's pass when the policy in force changes (Run: every node
// judged at once, not at its next re-attestation; docs/lifetime.md, "When
// the policy changes").
//
// A node's last verified claims are the claims its binding's status
// records of its last attempt (store.AttestationStatus.Claims), while that
// attempt passed and came after the node's enrolment. Nothing else is
// kept: an enrolment records no claims (its record keeps a summary), so a
// node enrolled, or enrolled again, since its last re-attestation is not
// judgeable until it re-attests (at its first boot). A status keeps a
// dbx's entry count, not its entries: a refusal by
// tpm.minimumDBX.contains alone cannot be decided from records, and such a
// node is not judgeable either — never passed or failed on what was not
// recorded.
package rejudge

import (
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/store"
)

// Outcome is what a policy makes of a node's last verified claims.
type Outcome string

// Outcomes.
const (
	// Pass: the claims pass (Verdict.Audits: rules in audit mode that
	// would have refused them).
	Pass Outcome = "pass"
	// Fail: the policy refuses them (Verdict.Err, with the rule's reason).
	Fail Outcome = "fail"
	// NotJudged: nothing recorded can decide it (Verdict.Why).
	NotJudged Outcome = "not judged"
)

// Verdict is one node's judgement.
type Verdict struct {
	Outcome Outcome
	// Err is the refusal of a Fail (attest.ReasonOf gives its reason).
	Err error
	// Audits are, of a Pass, the refusals of rules in audit mode.
	Audits []policy.Audit
	// Why says why a node is not judged.
	Why string
	// Claims are the claims judged (nil when not judged).
	Claims *attest.Claims
}

// Reason is a Fail's reason ("" otherwise).
func (v Verdict) Reason() attest.Reason {
	if v.Err == nil {
		return ""
	}
	r, _ := attest.ReasonOf(v.Err)
	return r
}

// Judge decides what pol makes of b's last verified claims at now (the
// clock of the reference sets' dates), as a re-attestation presenting them
// would be judged (policy.Options.Reattestation). Checks, in order:
//   - claims are recorded (else not judged: enrolled, not re-attested
//     since);
//   - they are not older than the node's latest enrolment (else not
//     judged: the enrolment's claims are not recorded);
//   - they decode, and a TPM's name the EK's kind (else not judged:
//     recorded before nodeproof recorded it);
//   - pol's Decide on them for b's pool: pass (with the audits) or fail;
//     a failure that minimumDBX.contains alone makes (PolicyDBX, and the
//     pool without that rule passes them) is not judged: the dbx's
//     entries are not recorded.
//
// It does not look at the revocation or at whether the claims' attempt
// passed: Decide (the pass's rules) does.
func Judge(pol *policy.Policy, b *store.Binding, now time.Time) Verdict {
	st := &b.Status
	if len(st.Claims) == 0 {
		return Verdict{Outcome: NotJudged, Why: "no claims recorded yet (enrolled, not re-attested since; the first re-attestation, at its first boot, records them)"}
	}
	if st.LastAttempt.Before(b.EnrolledAt) {
		return Verdict{Outcome: NotJudged, Why: "enrolled again at " + b.EnrolledAt.UTC().Format(time.RFC3339) + ", after the claims recorded; an enrolment's claims are not recorded (its next re-attestation records them)"}
	}
	cl := new(attest.Claims)
	if err := json.Unmarshal(st.Claims, cl); err != nil {
		return Verdict{Outcome: NotJudged, Why: "its recorded claims do not decode"}
	}
	if cl.TPM != nil && cl.TPM.EKKind == "" && cl.Kind == attest.KindTPM {
		return Verdict{Outcome: NotJudged, Why: "its claims were recorded before nodeproof recorded the EK's kind (tpm.ek): judged at its next re-attestation"}
	}
	opts := policy.Options{Now: now, Reattestation: true}
	dec, err := pol.Decide(b.Pool, cl, opts)
	if err == nil {
		return Verdict{Outcome: Pass, Audits: dec.Audits, Claims: cl}
	}
	if r, _ := attest.ReasonOf(err); r == attest.ReasonPolicyDBX {
		if _, err2 := withoutDBXContents(pol, b.Pool).Decide(b.Pool, cl, opts); err2 == nil {
			return Verdict{Outcome: NotJudged, Why: "the dbx's entries are not recorded (only their count): " + err.Error(), Claims: cl}
		}
	}
	return Verdict{Outcome: Fail, Err: err, Claims: cl}
}

// withoutDBXContents is pol with pool's minimumDBX.contains dropped.
func withoutDBXContents(pol *policy.Policy, pool string) *policy.Policy {
	pp, ok := pol.Pools[pool]
	if !ok || pp.TPM.MinimumDBX == nil {
		return pol
	}
	cp := *pol
	cp.Pools = maps.Clone(pol.Pools)
	mm := *pp.TPM.MinimumDBX
	mm.Contains = nil
	pp.TPM.MinimumDBX = &mm
	cp.Pools[pool] = pp
	return &cp
}

// Change is what a re-judge writes to a node's status.
type Change string

// Changes.
const (
	// Keep: nothing (the state stays; no write).
	Keep Change = ""
	// Failed: a passing node fails (Passed false, the rule's reason,
	// Rejudged set): the approver taints it as after a failed
	// re-attestation.
	Failed Change = "failed"
	// Refailed: a node failed by an earlier re-judge fails by another rule
	// now (the reason and message change).
	Refailed Change = "refailed"
	// Cleared: a node failed only by a re-judge passes again (Passed true,
	// Rejudged cleared): the policy was reverted.
	Cleared Change = "cleared"
	// Audited: a passing node still passes, and what rules in audit mode
	// say of it changed (Audit).
	Audited Change = "audited"
)

// Decision is what a re-judge does with one node: its verdict and the
// change it writes.
type Decision struct {
	Verdict Verdict
	Change  Change
	// Skipped says why the node's state is not the re-judge's to change
	// ("" when it is): revoked, never attested since its enrolment, or
	// its last attempt failed.
	Skipped string
}

// Decide is what a re-judge by pol at now does with b: Judge, then the
// change. It never touches:
//   - a revoked node (the operator's revocation stands);
//   - a node whose last attempt failed (only a passing re-attestation
//     replaces a real failure);
//   - a node not judged (its state stays as it is).
//
// A passing node whose claims fail is Failed; a node failed by a re-judge
// (Status.Rejudged) whose claims pass is Cleared, or Refailed when another
// rule refuses them now; a passing node whose audits changed is Audited.
func Decide(pol *policy.Policy, b *store.Binding, now time.Time) Decision {
	st := &b.Status
	switch {
	case b.Revoked != nil:
		return Decision{Skipped: "revoked"}
	case st.LastAttempt.IsZero():
		return Decision{Verdict: Judge(pol, b, now), Skipped: "not re-attested since its enrolment"}
	case !st.Passed && st.Rejudged.IsZero():
		return Decision{Verdict: Judge(pol, b, now), Skipped: "its last attempt failed"}
	}
	v := Judge(pol, b, now)
	d := Decision{Verdict: v}
	switch v.Outcome {
	case Fail:
		switch {
		case st.Passed:
			d.Change = Failed
		case st.Reason != string(v.Reason()):
			d.Change = Refailed
		}
	case Pass:
		switch {
		case !st.Passed:
			d.Change = Cleared
		case st.Audit != policy.FormatAudits(v.Audits, store.MaxStatusAudit):
			d.Change = Audited
		}
	}
	return d
}

// apply writes d's change into b's status; version names the policy (its
// version), now is when.
func (d Decision) apply(b *store.Binding, version string, now time.Time) {
	st := &b.Status
	switch d.Change {
	case Failed, Refailed:
		st.Passed, st.Audit, st.Rejudged = false, "", now
		st.Reason, st.Message = string(d.Verdict.Reason()), store.StatusMessage(Message(b, version, d.Verdict.Err))
	case Cleared:
		st.Passed, st.Reason, st.Message, st.Rejudged = true, "", "", time.Time{}
		st.Audit = policy.FormatAudits(d.Verdict.Audits, store.MaxStatusAudit)
	case Audited:
		st.Audit = policy.FormatAudits(d.Verdict.Audits, store.MaxStatusAudit)
	}
}

// Message is the status message of a node whose last verified claims the
// policy of version refuses with err: that the policy changed, and which
// rule refused (the refusal's own message names the rule's setting).
func Message(b *store.Binding, version string, err error) string {
	v := ""
	if version != "" {
		v = " (version " + version + ")"
	}
	return fmt.Sprintf("the policy in force changed%s and refuses the claims of the node's last passing attestation (%s): %v",
		v, b.Status.LastAttempt.UTC().Format(time.RFC3339), err)
}
