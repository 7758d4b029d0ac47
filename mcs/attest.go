package mcs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/strictjson"
)

const sessionPurpose = "attest-session"

// sealedSession is what the session box holds.
type sealedSession struct {
	Session  attest.Session `json:"session"`
	NodeName string         `json:"nodeName,omitempty"`
	// KubeletPublicKey (PKIX DER) checks the node's proof that it holds
	// the kubelet key (attest.VerifyKeyProof).
	KubeletPublicKey []byte `json:"kubeletPublicKey,omitempty"`
}

// openSession opens a sealed session this server (or a replica sharing
// its keys) issued: SessionInvalid when it does not open or decode.
func (s *Server) openSession(sealed string) (*sealedSession, error) {
	raw, err := s.o.Keys.Open(sessionPurpose, sealed)
	if err != nil {
		return nil, deny(attest.ReasonSessionInvalid, "session does not open")
	}
	var ss sealedSession
	if err := json.Unmarshal(raw, &ss); err != nil {
		return nil, deny(attest.ReasonSessionInvalid, "session does not decode")
	}
	return &ss, nil
}

// decodeBody reads a JSON body strictly: bounded, one value, no member
// named twice at any depth, exactly or in another case (strictjson: as
// encoding/json would match it to a field, merging the two), no unknown
// fields. The body is held once as read (encoding/json's decoder buffers
// a whole value before it decodes it anyway) and decoded from there.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return deny(attest.ReasonMalformedRequest, "Content-Type must be application/json")
	}
	if r.ContentLength > limit {
		return deny(attest.ReasonBodyTooLarge, "body exceeds %d bytes", limit)
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + 1) // one read past it sees the end
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	body := buf.Bytes()
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return deny(attest.ReasonBodyTooLarge, "body exceeds %d bytes", limit)
	} else if err != nil {
		return deny(attest.ReasonMalformedRequest, "body: %v", err)
	}
	if err := strictjson.CheckNames(body); err != nil {
		return deny(attest.ReasonMalformedRequest, "body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if err == nil {
		// Only white space may follow the object.
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("body holds more than one JSON value")
			if terr != nil {
				err = terr
			}
		}
	}
	if err != nil {
		return deny(attest.ReasonMalformedRequest, "body: %v", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, d *decision, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // our own types always marshal
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", fmt.Sprint(len(b)))
	w.WriteHeader(http.StatusOK)
	w.Write(b)
	d.status = http.StatusOK
}

// challenge answers POST /attest/v1/challenge.
//
// Checks before any cryptography: the body (bounded, strict JSON), the pool
// is in the policy (PoolNotInPolicy) and takes this kind of evidence
// (EvidenceKindNotAllowed), a verifier for the kind is configured, the
// kubelet key parses, the requested node name (if any) is a DNS name. Then
// the kind's verifier checks the identity (attest/tpm: EK and AK) and makes
// the challenge; the session is sealed, so nothing is stored.
func (s *Server) challenge(w http.ResponseWriter, r *http.Request, d *decision) {
	v := s.verifiers() // one policy's verifiers for the whole request
	var req api.ChallengeRequest
	if err := decodeBody(w, r, api.MaxChallengeBody, &req); err != nil {
		s.refuse(w, d, err)
		return
	}
	d.pool = req.Pool
	pp, ok := s.pol().Pools[req.Pool]
	if !ok {
		s.refuse(w, d, deny(attest.ReasonPolicyUnknownPool, "pool %q is not in the policy", req.Pool))
		return
	}
	if !slices.Contains(pp.Evidence, req.Kind) {
		s.refuse(w, d, deny(attest.ReasonPolicyKindNotAllowed, "pool %s does not accept %q evidence", req.Pool, req.Kind))
		return
	}
	if req.NodeName != "" && !attest.ValidNodeName(req.NodeName) {
		s.refuse(w, d, deny(attest.ReasonMalformedRequest, "nodeName is not a DNS name"))
		return
	}
	switch req.Purpose {
	case "", attest.PurposeEnrol:
	case attest.PurposeReattest:
		if req.NodeName == "" {
			s.refuse(w, d, deny(attest.ReasonMalformedRequest, "a re-attestation names its node (nodeName)"))
			return
		}
	default:
		s.refuse(w, d, deny(attest.ReasonMalformedRequest, "purpose %q is not enrol or reattest", req.Purpose))
		return
	}
	keySHA, err := attest.KeySHA256(req.KubeletPublicKey)
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	kind, ok := v.Verifiers[req.Kind]
	if !ok {
		s.refuse(w, d, deny(attest.ReasonPolicyKindNotAllowed, "this server verifies no %q evidence", req.Kind))
		return
	}
	ch, sess, err := kind.Challenge(r.Context(), attest.ChallengeInput{
		Pool: req.Pool, KubeletKeySHA256: keySHA, Request: req.Request,
		// An identity the request only claims (a TPM's EK), before any
		// cryptography is spent on it.
		Admit: func(claimed string) error {
			if ok, wait := s.o.Limits.PerIdentity.Allow(claimed); !ok {
				return later(wait, deny(attest.ReasonRateLimited, "too many attestations for this machine; retry later"))
			}
			return nil
		},
	})
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	if sess.Kind != req.Kind {
		s.refuse(w, d, fmt.Errorf("mcs: the %s verifier made a %s session", req.Kind, sess.Kind))
		return
	}
	sess.Purpose = req.Purpose
	b, err := json.Marshal(sealedSession{Session: *sess, NodeName: req.NodeName, KubeletPublicKey: req.KubeletPublicKey})
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	resp := api.ChallengeResponse{Expires: sess.Expires, Kind: req.Kind, Challenge: api.Message(ch)}
	if resp.Session, err = s.o.Keys.Seal(sessionPurpose, b); err != nil {
		s.refuse(w, d, err)
		return
	}
	writeJSON(w, d, &resp)
}

// verify answers POST /attest/v1/verify.
//
// Checks: the body; the session opens (SessionInvalid: forged, tampered, or
// sealed by keys this server no longer has); the proof of possession of
// the session's kubelet key, when sent (KubeletKeyProofInvalid); the
// kind's verifier (every check in its doc comment; expiry included);
// policy for the session's pool; a node name (from the evidence, or
// requested when the pool allows it: NodeNameNotEstablished); the
// identity's rate (RateLimited); a requested name is not that of a Node
// nodeproof never owned (NodeNotAdopted, cluster mode: claimable). In
// cluster mode the node's bootstrap
// token is issued next. Then, in one durable store write (store.Enrol),
// the NodeAttestation record is written (its name, derived from the
// session's nonce, marks the session used), and the node name bound to
// the identity; enrol gives the rules of who may enrol
// (NodeNameTaken, IdentityAlreadyEnrolled). Only then is the config token
// returned. No refusal writes anything.
//
// The record's ID and the config token's single-use ID are derived from
// the session's nonce, so the same session answered again — the node
// retrying after the first answer was lost to a crash or a dropped
// connection, when the record was already written — gets a token for that
// same record with that same single-use ID, as long as that config has not
// been delivered: a session still yields at most one config. Once it was
// delivered, the session answered again is refused (SessionReused).
func (s *Server) verify(w http.ResponseWriter, r *http.Request, d *decision) {
	v := s.verifiers() // one policy's verifiers for the whole request
	req, evidence, err := v.body.decode(w, r)
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	ss, err := s.openSession(req.Session)
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	sess := &ss.Session
	d.pool = sess.Pool
	d.kind, d.purpose = string(sess.Kind), "enrol"
	if sess.Reattest() {
		d.purpose = "reattest"
	}
	// A proof that the requester holds the kubelet key the session bound
	// (the agent always sends one): when present it must verify.
	proven := false
	if len(req.KubeletKeyProof) > 0 {
		if err := attest.VerifyKeyProof(ss.KubeletPublicKey, req.Session, req.KubeletKeyProof); err != nil {
			s.refuse(w, d, err)
			return
		}
		proven = true
	}
	var claims *attest.Claims
	switch kind, ok := v.Verifiers[sess.Kind]; {
	case !ok:
		err = deny(attest.ReasonSessionInvalid, "this server verifies no %q evidence (any more)", sess.Kind)
	case req.Kind != sess.Kind:
		err = deny(attest.ReasonMalformed, "a %s session needs %s evidence", sess.Kind, sess.Kind)
	default:
		claims, err = kind.Verify(r.Context(), sess, evidence)
	}
	if sess.Reattest() {
		s.reattest(w, r.Context(), d, ss, claims, err)
		return
	}
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	dec, err := s.pol().Decide(sess.Pool, claims, policy.Options{Now: s.o.Clock()})
	if err != nil {
		s.policyRefused(sess.Pool, claims, ss.NodeName, err)
		s.refuse(w, d, err)
		return
	}
	node := s.nodeName(sess.Pool, claims, ss.NodeName)
	if node == "" {
		s.refuse(w, d, s.noNodeName(sess.Pool, claims))
		return
	}
	d.node = node
	if ok, wait := s.o.Limits.PerIdentity.Allow(identityKey(claims)); !ok {
		s.refuse(w, d, later(wait, deny(attest.ReasonRateLimited, "too many attestations for this identity; retry later")))
		return
	}
	if s.nodeName(sess.Pool, claims, "") == "" { // a requested name
		if err := s.claimable(r.Context(), node, claims.Identity); err != nil {
			s.refuse(w, d, err)
			return
		}
	}
	now := s.o.Clock()
	id := derivedID(recordLabel, sess.Nonce)
	rec := &store.Record{
		ID: id, NodeName: node, Pool: sess.Pool, Kind: claims.Kind, Identity: claims.Identity,
		KubeletKeySHA256: claims.KubeletKeySHA256, Addresses: claims.Addresses,
		Summary: summarize(claims) + auditSummary(dec.Audits), CreatedAt: now, Expires: now.Add(s.o.RecordTTL),
	}
	if s.o.Bootstrap != nil {
		if err := s.o.Bootstrap.Issue(r.Context(), rec); err != nil {
			s.refuse(w, d, err)
			return
		}
	}
	// The record's name, derived from the session's nonce, is the
	// session's single-use marker: a second record of the same session
	// cannot be created (no marker object of its own: one write less).
	tokenID := derivedID(configTokenLabel, sess.Nonce)
	if rec, err = s.enrol(r.Context(), rec, tokenID, proven); err != nil {
		s.refuse(w, d, err)
		return
	}
	d.record = rec.ID
	if len(dec.Audits) > 0 {
		s.o.Metrics.audited(sess.Pool, dec.Audits)
		s.auditEvent(sess.Pool, claims.Identity, node, "enrolled", dec.Audits)
	}
	exp := now.Add(s.o.ConfigTokenTTL)
	tok, err := tokens.IssueConfigToken(s.o.Keys, tokens.ConfigToken{
		ID: tokenID, RecordID: rec.ID, NodeName: node, Pool: sess.Pool, Expires: exp, Bootstrap: rec.BootstrapTokenSecret,
		Identity: rec.Identity, BootstrapTokenID: rec.BootstrapTokenID, RecordExpires: rec.Expires,
	})
	if err != nil {
		s.refuse(w, d, err)
		return
	}
	writeJSON(w, d, &api.VerifyResponse{ConfigToken: tok, Expires: exp, NodeName: node, Pool: sess.Pool, Record: id})
}

// claimable refuses a requested node name that belongs to a Node nodeproof
// never owned (Options.Nodes): a Node exists with that name, no identity
// holds it, and the name has no history — never released, never adopted
// (NodeNotAdopted). Such a Node predates nodeproof (or was made by
// something else); letting the first machine that asks for its name bind
// it would taint a running node and hand its name to a stranger. An
// operator adopts it first (nodeproof adopt NODE). Costs nothing when no
// such Node exists (the Nodes come from a watch; the binding and the
// history too, in cluster mode).
func (s *Server) claimable(ctx context.Context, node, identity string) error {
	if s.o.Nodes == nil {
		return nil
	}
	exists, err := s.o.Nodes.Exists(node)
	if err != nil {
		return later(time.Second, deny(attest.ReasonUnavailable, "the cluster's Nodes are not known yet: %v", err))
	}
	if !exists {
		return nil
	}
	switch _, err := s.o.Store.Binding(ctx, node); {
	case err == nil:
		return nil // bound: the enrolment rules decide (NodeNameTaken, enrolling again)
	case !errors.Is(err, store.ErrNotFound):
		return err
	}
	switch _, err := s.o.Store.History(ctx, node); {
	case err == nil:
		return nil // nodeproof's before (released) or adopted
	case !errors.Is(err, store.ErrNotFound):
		return err
	}
	s.eventAbout(identity, node, true, attest.ReasonNodeNotAdopted, fmt.Sprintf("%s asked for node %s, a Node that nodeproof never owned (it existed before); refused. If that machine should take the name, adopt it first: nodeproof adopt %s",
		identity, node, node))
	return deny(attest.ReasonNodeNotAdopted, "a Node named %s exists that nodeproof never owned; an operator adopts it first: nodeproof adopt %s", node, node)
}

// policyRefused records an enrolment the policy refused (authentic
// evidence, a boot state or an identity pool does not allow) as an Event
// on the node name it would have had, within the identity's rate
// (Limits.PerIdentity: an identity that fails over and over spends its
// own budget, not the Event path's). With no name, the log line is the
// record.
func (s *Server) policyRefused(pool string, claims *attest.Claims, requested string, refusal error) {
	node := s.nodeName(pool, claims, requested)
	if node == "" {
		return
	}
	if ok, _ := s.o.Limits.PerIdentity.Allow(identityKey(claims)); !ok {
		return
	}
	reason, ok := attest.ReasonOf(refusal)
	if !ok {
		reason = attest.ReasonPolicyRefused
	}
	s.eventAbout(claims.Identity, node, true, reason, fmt.Sprintf("%s (%s evidence) asked to enrol as node %s in pool %s; refused by policy: %v",
		claims.Identity, claims.Kind, node, pool, refusal))
}

// auditEvent publishes a PolicyAuditRefusal Event about node (within the
// identity's Event budget): it was admitted, and rules in audit mode
// would have refused it. what says what the machine did ("enrolled",
// "re-attested").
func (s *Server) auditEvent(pool, identity, node, what string, audits []policy.Audit) {
	s.eventAbout(identity, node, true, attest.ReasonPolicyAudit, fmt.Sprintf("node %s %s in pool %s, admitted by rules in audit mode that would have refused it:\n%s",
		node, what, pool, policy.FormatAudits(audits, 1024)))
}

// auditSummary is audits for a record's summary: " audit: rule=Reason…".
func auditSummary(audits []policy.Audit) string {
	if len(audits) == 0 {
		return ""
	}
	parts := make([]string, len(audits))
	for i, a := range audits {
		parts[i] = a.Rule + "=" + string(a.Reason)
	}
	return " audit: " + strings.Join(parts, ",")
}

// nodeName is the node name an attestation for pool establishes: the
// evidence's (the TPM inventory's, the cloud instance's; for AWS per the
// pool's aws.nodeName), else the requested one when the pool takes
// requested names; "" when there is none.
func (s *Server) nodeName(pool string, claims *attest.Claims, requested string) string {
	node := s.pol().EvidenceNodeName(pool, claims)
	if node == "" && s.pol().ServeFor(pool).NodeNames == "requested" {
		node = requested
	}
	return node
}

// noNodeName is the refusal of evidence that establishes no node name
// under pool's settings, naming the settings that would (NodeNameNotEstablished).
func (s *Server) noNodeName(pool string, claims *attest.Claims) error {
	at := "pools." + pool + ".serve.nodeNames"
	if claims.Kind == attest.KindTPM {
		return attest.DenySetting(attest.ReasonPolicyNodeNameMissing, at,
			"the evidence names no node: a TPM names one only through an EK inventory entry with a nodeName (trust.ekInventory), and pool %s takes no requested names; set %s: requested to enrol the name the agent asks for (--node-name; first come owns it), or list this EK (%s) with its nodeName in the inventory",
			pool, at, claims.Identity)
	}
	return attest.DenySetting(attest.ReasonPolicyNodeNameMissing, at,
		"the evidence names no node and pool %s takes no requested names; set %s: requested to enrol the name the agent asks for (--node-name)", pool, at)
}

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
	err := s.o.Store.Enrol(ctx, rec, store.EnrolOptions{})
	if errors.Is(err, store.ErrUsed) || errors.Is(err, store.ErrExists) || errors.Is(err, store.ErrIdentityEnrolled) {
		prev, ok, perr := s.answeredBefore(ctx, rec, tokenID)
		switch {
		case perr != nil:
			err = perr
		case ok:
			// This session's record was written and its answer lost: keep
			// that record; this try's token was only drawn.
			s.o.Log.Info("verify answered again for the same session (the first answer was lost)", "node", rec.NodeName, "record", prev.ID)
			return prev, nil
		case errors.Is(err, store.ErrIdentityEnrolled):
			err = s.enrolAgain(ctx, rec, proven)
		}
	}
	if err == nil {
		return rec, nil
	}
	switch {
	case errors.Is(err, store.ErrNameTaken):
		owner := "another identity"
		if b, berr := s.o.Store.Binding(ctx, rec.NodeName); berr == nil {
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

// enrolAgain decides whether rec's identity, already enrolled, may enrol
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
//     and a machine must not mint them without bound.
func (s *Server) enrolAgain(ctx context.Context, rec *store.Record, proven bool) error {
	b, err := s.o.Store.BindingOf(ctx, rec.Identity)
	if errors.Is(err, store.ErrNotFound) {
		// Released, or an enrolment still completing: the machine retries.
		return later(time.Second, deny(attest.ReasonUnavailable, "this identity's enrolment changed meanwhile; retry"))
	} else if err != nil {
		return err
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
	if err := s.liveEnrolments(ctx, b, rec); err != nil {
		return err
	}
	if err := s.o.Store.Enrol(ctx, rec, o); err != nil {
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

// liveEnrolments refuses rec (EnrolmentCapReached) when its identity
// already holds its pool's cap of unexpired records for its node name. A
// store read of the name's records, on this path only. The refusal is
// final, not a 503: the agent's retries could only spend its time until
// the oldest record expires (an hour), so it stops at once and says why
// and what an operator can do.
func (s *Server) liveEnrolments(ctx context.Context, b *store.Binding, rec *store.Record) error {
	limit := s.o.MaxLiveEnrolments
	if pp, ok := s.pol().Pools[rec.Pool]; ok && pp.Serve.MaxLiveEnrolments > 0 {
		limit = pp.Serve.MaxLiveEnrolments
	}
	recs, err := s.o.Store.RecordsForNode(ctx, b.NodeName)
	if err != nil {
		return err
	}
	now := s.o.Clock()
	var live []time.Time
	for _, r := range recs {
		if r.Identity == rec.Identity && r.Expires.After(now) {
			live = append(live, r.Expires)
		}
	}
	if len(live) < limit {
		return nil
	}
	slices.SortFunc(live, func(a, b time.Time) int { return a.Compare(b) })
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
// wrote, if the config that answer's token could fetch was never
// delivered, and the record is for the same node, pool, evidence and
// kubelet key as rec (the only way it can be: the session fixes pool and
// key, the evidence the node). An error is the store's.
func (s *Server) answeredBefore(ctx context.Context, rec *store.Record, tokenID string) (*store.Record, bool, error) {
	prev, err := s.o.Store.GetRecord(ctx, rec.ID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, nil
	} else if err != nil {
		return nil, false, err
	}
	same := prev.NodeName == rec.NodeName && prev.Pool == rec.Pool && prev.Kind == rec.Kind &&
		prev.Identity == rec.Identity && attest.Equal(prev.KubeletKeySHA256, rec.KubeletKeySHA256)
	if !same {
		return nil, false, nil
	}
	var delivered bool
	if s.o.Bootstrap != nil && prev.BootstrapTokenID != "" {
		delivered, err = s.o.Bootstrap.Delivered(ctx, prev)
	} else {
		delivered, err = s.o.Store.IsUsed(ctx, configTokenOnce(tokenID))
	}
	if err != nil {
		return nil, false, err
	}
	return prev, !delivered, nil
}

// Labels of the IDs derived from a session's nonce.
const (
	recordLabel      = "nodeproof/v1 record id"
	configTokenLabel = "nodeproof/v1 config token id"
)

// derivedID is the ID for label of the session with nonce: 24 hex
// characters of SHA-256(label ‖ 0 ‖ nonce). The nonce is 32 random bytes,
// so IDs are as unique as random ones, and the same session always gets
// the same ones.
func derivedID(label string, nonce []byte) string {
	h := sha256.New()
	h.Write([]byte(label))
	h.Write([]byte{0})
	h.Write(nonce)
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// identityKey is the per-identity rate limit's key for verified claims.
func identityKey(c *attest.Claims) string { return string(c.Kind) + "/" + c.Identity }

// summarize describes claims in one line for records and logs (no
// secrets: claims hold none): the instance a cloud names, then the boot a
// TPM's quote and log tell (a cloud vTPM has both).
func summarize(c *attest.Claims) string {
	var parts []string
	switch i := c.Instance; {
	case i != nil:
		in := fmt.Sprintf("%s %s account=%s location=%s instance=%s", c.Kind, i.Cloud, i.Account, i.Location, i.ID)
		if i.Name != "" {
			in += " (" + i.Name + ")"
		}
		if i.LiveChecked {
			in += " live"
		}
		parts = append(parts, in)
	case c.TPM == nil:
		return string(c.Kind) + " " + c.Identity
	}
	if c.TPM != nil {
		b := c.TPM.Boot
		sb := "unknown"
		if b.SecureBootKnown {
			sb = map[bool]string{true: "on", false: "off"}[b.SecureBoot]
		}
		if c.Instance == nil {
			parts = append(parts, fmt.Sprintf("%s ek=%.16s… (%s)", c.Kind, c.TPM.EKSHA256, c.TPM.EKKind))
		}
		kernel := ""
		if k := b.Kernels(); len(k) > 0 {
			kernel = k[0]
		}
		parts = append(parts, fmt.Sprintf("trust=%s bank=%s secureBoot=%s kernel=%.16s pcr8=%.16s pcr9=%.16s", c.TPM.EKTrust, c.TPM.PCRBank, sb, kernel, c.TPM.PCRs[8], c.TPM.PCRs[9]))
	}
	return strings.Join(parts, " ")
}
