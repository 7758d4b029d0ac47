package mcs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/store"
)

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
	writeJSON(w, d, &api.VerifyResponse{ConfigToken: tok, Expires: exp, NodeName: node, Pool: sess.Pool, Record: id, Ticket: s.sealTicket(claims)})
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
