package mcs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
)

// enrol writes rec as an enrolment of its
// identity under its node name (store.Enrol) and returns the record the
// answer names: rec, or the record an earlier answer to the same session
// wrote (answeredBefore). The rules, in one place (docs/protocol.md,
// "Who owns a node name"):
//   - a node name is owned by the first identity that enrolled with it:
//     another identity is refused NodeNameTaken until an operator releases
//     the name (nodeproof release NODE);
//   - an identity enrols once, under one name: enrolling again is allowed
//     only with a proof of possession of the kubelet key its enrolment
//     bound (the machine itself, after a crash or a lost answer cost it
//     its config), or with any key in a pool that re-enrols always
//     (policy reenrol: always); otherwise IdentityAlreadyEnrolled, and
//     under another name always IdentityAlreadyEnrolled;
//   - a banned identity (nodeproof revoke) enrols under no name, in no
//     pool (Revoked), released or not;
//   - a refusal writes nothing (but an Event for the operator). The
//     bootstrap token Issue drew for rec exists only in rec until a config
//     is delivered (Activate), so a refusal has none to undo.
func (s *Server) enrol(ctx context.Context, rec *store.Record, tokenID string, proven bool) (*store.Record, error) {
	// One write decides: a refusal (*store.EnrolConflict) carries what
	// conflicts as the store saw it, so nothing is read again to learn why.
	var o store.EnrolOptions
	if s.o.Bootstrap == nil {
		// Without bootstrap tokens a config is delivered when its token's
		// marker is spent: a refusal says whether it is. With them, every
		// record carries its token (Issue), whose Secret says.
		o.Delivered = configTokenOnce(tokenID)
	}
	err := s.o.Store.Enrol(ctx, rec, o)
	if c := conflictOf(err); c != nil && c.Answerable() {
		prev, ok, perr := s.answeredBefore(ctx, rec, c)
		switch {
		case perr != nil:
			err = perr
		case ok:
			// This session's record was written and its answer lost: keep
			// that record; this try's token was only drawn.
			s.o.Log.Info("verify answered again for the same session (the first answer was lost)", "node", rec.NodeName, "record", prev.ID)
			return prev, nil
		case c.Reason == store.ConflictIdentityBound:
			err = s.enrolAgain(ctx, rec, c.Binding, proven)
		}
	}
	if err == nil {
		return rec, nil
	}
	switch {
	case errors.Is(err, store.ErrNameTaken):
		owner := "another identity"
		if c := conflictOf(err); c != nil && c.Binding != nil {
			b := c.Binding
			owner = fmt.Sprintf("%s (%s evidence, enrolled %s)", b.Identity, b.Kind, b.CreatedAt.UTC().Format(time.RFC3339))
		}
		s.eventAbout(rec.Identity, rec.NodeName, true, attest.ReasonNodeNameTaken, fmt.Sprintf("%s asked for node %s, which is bound to %s; refused. Release the name to give it to another machine: nodeproof release %s",
			rec.Identity, rec.NodeName, owner, rec.NodeName))
		return nil, deny(attest.ReasonNodeNameTaken, "node %s belongs to another machine (the identity that enrolled with it first); an operator can release it: nodeproof release %s", rec.NodeName, rec.NodeName)
	case errors.Is(err, store.ErrUsed) || errors.Is(err, store.ErrExists):
		return nil, deny(attest.ReasonSessionReused, "this session was already answered")
	case errors.Is(err, store.ErrRevoked):
		s.eventAbout(rec.Identity, rec.NodeName, true, attest.ReasonRevoked, fmt.Sprintf("%s, which an operator revoked, attested for node %s (pool %s); refused", rec.Identity, rec.NodeName, rec.Pool))
		return nil, deny(attest.ReasonRevoked, "this machine was revoked by an operator; it enrols under no name until the ban is lifted (nodeproof unban)")
	case errors.Is(err, store.ErrPoolFixed):
		return nil, deny(attest.ReasonEnrolledInAnotherPool, "this machine is enrolled in another pool; moving it is an operator's act: nodeproof release %s, then enrol", rec.NodeName)
	}
	return nil, err
}

// conflictOf is err's *store.EnrolConflict, nil when it is none.
func conflictOf(err error) *store.EnrolConflict {
	var c *store.EnrolConflict
	if errors.As(err, &c) {
		return c
	}
	return nil
}

// enrolAgain decides whether rec's identity, already enrolled (its binding
// b, as the refused first write saw it; nil when it held none), may enrol
// again (see enrol) and, if so, writes it. A refusal is a Denial; it
// writes nothing but an Event. Beyond the enrolment rules:
//   - the binding is not revoked (Revoked);
//   - the pool is the binding's (EnrolledInAnotherPool): a node's pool is
//     fixed by its enrolment, so the attestation just verified was judged
//     by the policy of the pool the node is enrolled in;
//   - the node's latest attestation did not fail (AttestationFailed): only
//     a passing re-attestation replaces a failed one (with its checks: a
//     TPM's reset count, the order of sessions), so a failing node cannot
//     launder its failure by enrolling again;
//   - the identity holds fewer unexpired records for the name than its
//     pool's serve.maxLiveEnrolments, else MaxLiveEnrolments
//     (EnrolmentCapReached, final, saying when the oldest expires and
//     what an operator can do): each enrolment mints a bootstrap token,
//     and a machine must not mint them without bound. The store counts
//     them in the write that enrols (EnrolOptions.MaxLive).
func (s *Server) enrolAgain(ctx context.Context, rec *store.Record, b *store.Binding, proven bool) error {
	if b == nil {
		// Released, or an enrolment still completing: the machine retries.
		return later(time.Second, deny(attest.ReasonUnavailable, "this identity's enrolment changed meanwhile; retry"))
	}
	if b.Revoked != nil {
		s.eventAbout(rec.Identity, b.NodeName, true, attest.ReasonRevoked, fmt.Sprintf("%s, enrolled as node %s and revoked at %s (%s), attested again for node %s; refused",
			rec.Identity, b.NodeName, b.Revoked.At.UTC().Format(time.RFC3339), b.Revoked.Reason, rec.NodeName))
		// The operator's reason stays with operators (the Event above,
		// the binding, inspect): the machine is told the code and when.
		return deny(attest.ReasonRevoked, "node %s (this machine) was revoked by an operator at %s", b.NodeName, b.Revoked.At.UTC().Format(time.RFC3339))
	}
	// refuse says why; setting, when not empty, is the policy setting
	// that would have allowed it.
	refuse := func(why, setting string) error {
		s.eventAbout(rec.Identity, b.NodeName, true, attest.ReasonIdentityEnrolled, fmt.Sprintf("%s, enrolled as node %s since %s, attested again for node %s with %s; refused: %s. If the machine was reinstalled, release its node first: nodeproof release %s",
			rec.Identity, b.NodeName, b.CreatedAt.UTC().Format(time.RFC3339), rec.NodeName, keyState(b, rec, proven), why, b.NodeName))
		if setting != "" {
			return attest.DenySetting(attest.ReasonIdentityEnrolled, setting, "this machine already enrolled as node %s; %s. An operator can release it (nodeproof release %s), or set %s: always", b.NodeName, why, b.NodeName, setting)
		}
		return deny(attest.ReasonIdentityEnrolled, "this machine already enrolled as node %s; %s. An operator can release it: nodeproof release %s", b.NodeName, why, b.NodeName)
	}
	var o store.EnrolOptions
	switch {
	case b.NodeName != rec.NodeName:
		return refuse("an identity enrols under one node name", "")
	case b.Pool != rec.Pool:
		s.eventAbout(rec.Identity, b.NodeName, true, attest.ReasonEnrolledInAnotherPool, fmt.Sprintf("%s, enrolled as node %s in pool %s, attested again for pool %s; refused: a node's pool is fixed by its enrolment. To move it: nodeproof release %s, then let it enrol",
			rec.Identity, b.NodeName, b.Pool, rec.Pool, b.NodeName))
		return deny(attest.ReasonEnrolledInAnotherPool, "node %s is enrolled in pool %s, not %s; moving a node is an operator's act: nodeproof release %s, then enrol", b.NodeName, b.Pool, rec.Pool, b.NodeName)
	case proven && attest.Equal(b.KubeletKeySHA256, rec.KubeletKeySHA256):
		o = store.EnrolOptions{Again: true}
	case s.pol().ReenrolsAlways(rec.Pool):
		o = store.EnrolOptions{Again: true, ReplaceKey: true}
	case attest.Equal(b.KubeletKeySHA256, rec.KubeletKeySHA256):
		return refuse("enrolling again needs a proof of possession of the kubelet key the enrolment bound", "")
	default:
		// The one case a setting lifts: a reinstalled machine re-enrols
		// by itself where the pool says so.
		return refuse("enrolling again with a new kubelet key needs a release (the pool does not re-enrol always)", "pools."+rec.Pool+".reenrol")
	}
	if ok, why, at := b.Attested(s.o.Clock(), time.Duration(1<<63-1)); !ok && why == attest.ReasonAttestationFailed {
		s.eventAbout(rec.Identity, b.NodeName, true, attest.ReasonAttestationFailed, fmt.Sprintf("%s, node %s, whose re-attestation at %s was refused (%s), tried to enrol again; refused: only a passing re-attestation replaces a failed one",
			rec.Identity, b.NodeName, at.UTC().Format(time.RFC3339), b.Status.Reason))
		return deny(attest.ReasonAttestationFailed, "node %s's latest attestation (%s) was refused: %s; only a passing re-attestation replaces it", b.NodeName, at.UTC().Format(time.RFC3339), b.Status.Reason)
	}
	o.MaxLive = s.maxLive(rec.Pool)
	if err := s.o.Store.Enrol(ctx, rec, o); err != nil {
		if c := conflictOf(err); c != nil && c.Reason == store.ConflictLiveCap {
			return s.liveCap(b, rec, o.MaxLive, c.Live)
		}
		return err
	}
	msg := fmt.Sprintf("%s enrolled again as node %s with the kubelet key its enrolment bound (possession proven), record %s", rec.Identity, rec.NodeName, rec.ID)
	if o.ReplaceKey {
		msg = fmt.Sprintf("%s enrolled again as node %s with a new kubelet key (the pool re-enrols always), record %s", rec.Identity, rec.NodeName, rec.ID)
	}
	s.event(rec.NodeName, false, "Reenrolled", msg)
	s.o.Log.Info(msg, "node", rec.NodeName, "record", rec.ID)
	return nil
}

// maxLive is the cap of unexpired records an identity holds for its node
// name in pool (the store refuses enrolling again at it:
// EnrolOptions.MaxLive): the pool's serve.maxLiveEnrolments, else
// MaxLiveEnrolments.
func (s *Server) maxLive(pool string) int {
	if pp, ok := s.pol().Pools[pool]; ok && pp.Serve.MaxLiveEnrolments > 0 {
		return pp.Serve.MaxLiveEnrolments
	}
	return s.o.MaxLiveEnrolments
}

// liveCap is the refusal of rec (EnrolmentCapReached) when its identity
// already holds its pool's cap (limit) of unexpired records for its node
// name, whose expiries are live (soonest first), as the store's refusing
// write saw them. The refusal is final, not a 503: the agent's retries
// could only spend its time until the oldest record expires (an hour), so
// it stops at once and says why and what an operator can do.
func (s *Server) liveCap(b *store.Binding, rec *store.Record, limit int, live []time.Time) error {
	now := s.o.Clock()
	free := live[len(live)-limit]
	s.eventAbout(rec.Identity, b.NodeName, true, attest.ReasonEnrolmentCap, fmt.Sprintf("%s, node %s, enrolled again past its pool's cap of %d unexpired enrolments (each with its own bootstrap token); refused until %s. A machine rebooting through provisioning: nodeproof release %s, or raise pools.%s.serve.maxLiveEnrolments",
		rec.Identity, b.NodeName, limit, free.UTC().Format(time.RFC3339), b.NodeName, rec.Pool))
	return deny(attest.ReasonEnrolmentCap, "node %s already holds %d unexpired enrolments, its pool's cap (each carries a bootstrap token); stop retrying: the next is possible at %s (in %s), or when an operator releases the node (nodeproof release %s) or raises pools.%s.serve.maxLiveEnrolments",
		b.NodeName, len(live), free.UTC().Format(time.RFC3339), free.Sub(now).Round(time.Second), b.NodeName, rec.Pool)
}

// keyState describes the kubelet key of an enrolment attempt for an Event.
func keyState(b *store.Binding, rec *store.Record, proven bool) string {
	switch {
	case !attest.Equal(b.KubeletKeySHA256, rec.KubeletKeySHA256):
		return "a new kubelet key"
	case proven:
		return "the enrolled kubelet key, proven"
	}
	return "the enrolled kubelet key's hash and no proof of possession"
}

// event publishes an enrolment decision about nodeName (Options.Events).
func (s *Server) event(nodeName string, warning bool, reason attest.Reason, msg string) {
	s.eventAbout("", nodeName, warning, reason, msg)
}

// eventAbout publishes a decision about nodeName concerning identity: its
// Events have a budget of their own (Options.Events).
func (s *Server) eventAbout(identity, nodeName string, warning bool, reason attest.Reason, msg string) {
	if s.o.Events != nil {
		s.o.Events.Decision(identity, nodeName, warning, string(reason), msg)
	}
}

// answeredBefore returns the record an earlier answer to the same session
// wrote, as the refusal c saw it, if the config that answer's token could
// fetch was never delivered (c.Delivered; in cluster mode, the record's
// bootstrap token says), and the record is for the same node, pool,
// evidence and kubelet key as rec (the only way it can be: the session
// fixes pool and key, the evidence the node). An error is the store's.
func (s *Server) answeredBefore(ctx context.Context, rec *store.Record, c *store.EnrolConflict) (*store.Record, bool, error) {
	prev := c.Record
	if prev == nil {
		return nil, false, nil
	}
	same := prev.NodeName == rec.NodeName && prev.Pool == rec.Pool && prev.Kind == rec.Kind &&
		prev.Identity == rec.Identity && attest.Equal(prev.KubeletKeySHA256, rec.KubeletKeySHA256)
	if !same {
		return nil, false, nil
	}
	delivered := c.Delivered
	if s.o.Bootstrap != nil && prev.BootstrapTokenID != "" {
		var err error
		if delivered, err = s.o.Bootstrap.Delivered(ctx, prev); err != nil {
			return nil, false, err
		}
	}
	return prev, !delivered, nil
}
