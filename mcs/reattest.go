package mcs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/store"
)

// errReplayed stops a status update for a replayed session.
var errReplayed = errors.New("replayed session")

// reattest answers the verify of a re-attestation: an enrolled node
// proving itself again, at every boot and on a timer. It releases nothing:
// no config token, no record. verr is the verifier's outcome.
//
// What it checks, in order:
//   - the evidence is authentic: the verifier's refusal is the answer and
//     nothing is recorded, unless the refusal came after the identity was
//     proven (attest.Identified: a TPM whose event log was refused), which
//     is recorded as that identity's failure;
//   - the identity's rate (RateLimited);
//   - a node name the evidence establishes, if any, is the one the node
//     names (NodeNameTaken);
//   - the node name is bound to this identity (NotEnrolled when unbound,
//     Revoked when unbound and the identity is banned; NodeNameTaken when
//     bound to another, e.g. a swapped TPM);
//   - the binding is not revoked (Revoked);
//   - the claims pass the policy of the binding's pool — the pool the
//     node enrolled in, whatever pool the session named — without the
//     first-boot window of cloud evidence (EvaluateReattestation);
//   - the session was issued after the last attempt's (SessionReused: a
//     captured answer replayed, or an old session answered late; nothing
//     is written);
//   - a TPM's reset count did not go back (TPMClockRollback).
//
// Every outcome past the binding check is written to the binding's status
// in one write (store.UpdateStatus): last attempt, last success, outcome,
// boots (a TPM's reset count changed), the clock counters, the claims.
// A refusal changes nothing else.
func (s *Server) reattest(w http.ResponseWriter, ctx context.Context, d *decision, ss *sealedSession, claims *attest.Claims, verr error) {
	sess := &ss.Session
	identity := ""
	if verr != nil {
		var id *attest.Identified
		if !errors.As(verr, &id) {
			s.refuse(w, d, verr)
			return
		}
		identity = id.Identity
	} else {
		identity = claims.Identity
	}
	if ok, wait := s.o.Limits.PerIdentity.Allow(identity); !ok {
		s.refuse(w, d, later(wait, deny(attest.ReasonRateLimited, "too many attestations for this identity; retry later")))
		return
	}
	node := ss.NodeName
	d.node = node
	if claims != nil {
		if named := s.nodeName(sess.Pool, claims, ""); named != "" && named != node {
			s.refuse(w, d, deny(attest.ReasonNodeNameTaken, "the evidence names node %s, not %s", named, node))
			return
		}
	}
	now := s.o.Clock()
	var refusal error
	wasPassing := true
	var summary string
	var claimsJSON []byte
	if claims != nil {
		summary = summarize(claims)
		claimsJSON, _ = json.Marshal(recorded(claims))
	}
	replayed := false
	var audits []policy.Audit
	var prevAudit string
	b, err := s.o.Store.UpdateStatus(ctx, node, identity, func(b *store.Binding) error {
		refusal, audits = verr, nil
		// Sessions are answered in the order they were issued: an older
		// one, or the same one again, is a replay. It changes nothing.
		if !sess.IssuedAt.After(b.Status.SessionIssuedAt) {
			replayed = true
			return errReplayed
		}
		switch {
		case b.Revoked != nil:
			refusal = deny(attest.ReasonRevoked, "node %s was revoked by an operator at %s", node, b.Revoked.At.UTC().Format(time.RFC3339))
		case refusal == nil:
			var dec *policy.Decision
			if dec, refusal = s.pol().Decide(b.Pool, claims, policy.Options{Now: now, Reattestation: true}); refusal == nil {
				audits = dec.Audits
			}
		}
		st := &b.Status
		prevAudit = st.Audit
		wasPassing = st.LastAttempt.IsZero() || st.Passed
		if refusal == nil && claims.TPM != nil && !st.LastAttempt.IsZero() && int64(claims.TPM.ResetCount) < st.ResetCount {
			refusal = deny(attest.ReasonTPMClockRollback, "the TPM's reset count went back from %d to %d since the last attestation (a TPM2_Clear?): release and re-enrol the node if that was you", st.ResetCount, claims.TPM.ResetCount)
		}
		if claims != nil && claims.TPM != nil {
			if st.LastAttempt.IsZero() || int64(claims.TPM.ResetCount) != st.ResetCount {
				st.Boots++
			}
			st.ResetCount, st.RestartCount = int64(claims.TPM.ResetCount), int64(claims.TPM.RestartCount)
		}
		st.LastAttempt, st.Summary, st.Claims, st.SessionIssuedAt = now, summary, claimsJSON, sess.IssuedAt
		// An attempt replaces a re-judge's verdict (mcs/rejudge), whatever
		// its outcome.
		st.Passed, st.Reason, st.Message, st.Audit, st.Rejudged = refusal == nil, "", "", "", time.Time{}
		if refusal == nil {
			st.LastSuccess, st.Audit = now, policy.FormatAudits(audits, store.MaxStatusAudit)
		} else {
			r, _ := attest.ReasonOf(refusal)
			st.Reason, st.Message = string(r), store.StatusMessage(refusal.Error())
		}
		return nil
	})
	switch {
	case replayed:
		s.refuse(w, d, deny(attest.ReasonSessionReused, "this session, or a later one, was already answered"))
		return
	case errors.Is(err, store.ErrNotFound):
		if ban, berr := s.o.Store.BanOf(ctx, identity); berr == nil {
			s.eventAbout(identity, node, true, attest.ReasonRevoked, fmt.Sprintf("%s, which an operator revoked, re-attested as node %s; refused", identity, node))
			s.refuse(w, d, deny(attest.ReasonRevoked, "this machine was revoked by an operator at %s", ban.At.UTC().Format(time.RFC3339)))
			return
		}
		s.refuse(w, d, deny(attest.ReasonNotEnrolled, "node %s is bound to no machine: enrol first", node))
		return
	case errors.Is(err, store.ErrNameTaken):
		s.eventAbout(identity, node, true, attest.ReasonNodeNameTaken, fmt.Sprintf("%s re-attested as node %s, which another identity owns (a swapped TPM or another machine); refused", identity, node))
		s.refuse(w, d, deny(attest.ReasonNodeNameTaken, "node %s belongs to another identity; a new TPM is a new machine: release the node and enrol it", node))
		return
	case err != nil:
		s.refuse(w, d, err)
		return
	}
	if refusal != nil {
		if wasPassing {
			s.event(node, true, attest.ReasonAttestationFailed, fmt.Sprintf("re-attestation of node %s refused: %v", node, refusal))
		}
		s.refuse(w, d, refusal)
		return
	}
	if len(audits) > 0 {
		// Counted each time; an Event when what the audit says changes.
		s.o.Metrics.audited(b.Pool, audits)
		if b.Status.Audit != prevAudit {
			s.auditEvent(b.Pool, identity, node, "re-attested", audits)
		}
	}
	if !wasPassing {
		s.event(node, false, "AttestationPassed", fmt.Sprintf("node %s passed its re-attestation again (%s)", node, summary))
	}
	life := s.pol().LifetimeOf(b.Pool)
	writeJSON(w, d, &api.VerifyResponse{NodeName: node, Pool: b.Pool, Ticket: s.sealTicket(claims), Reattest: &api.ReattestResult{
		Boots: b.Status.Boots, IntervalSeconds: int64(life.Interval.Duration / time.Second)}})
}

// recorded is claims as a binding's status keeps them: without the dbx's
// hash entries (hundreds of 32-byte hashes per node; their count stays),
// so that a status stays a few kilobytes.
func recorded(c *attest.Claims) *attest.Claims {
	if c.TPM == nil || len(c.TPM.Boot.DBXSHA256s) == 0 {
		return c
	}
	cp, tp := *c, *c.TPM
	tp.Boot.DBXSHA256s = nil
	cp.TPM = &tp
	return &cp
}
