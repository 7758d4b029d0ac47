package mcs

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/api"
)

const sessionPurpose = "attest-session"

// ticketPurpose seals what a verifier hands a node to bring back
// (attest.Claims.Ticket): a box sealed for it opens as nothing else.
const ticketPurpose = "attest-ticket"

// openTicket opens a ticket the node brought back; nil when there is none
// or it does not open (sealed by keys this server no longer has, another
// purpose's box, forged): the kind then treats the node as one without.
func (s *Server) openTicket(sealed string) []byte {
	if sealed == "" {
		return nil
	}
	raw, err := s.o.Keys.Open(ticketPurpose, sealed)
	if err != nil {
		return nil
	}
	return raw
}

// sealTicket seals the ticket a verifier handed out for claims; "" when it
// handed out none (or sealing failed: the node then keeps the one it has,
// and its next attestation is a full one).
func (s *Server) sealTicket(claims *attest.Claims) string {
	if claims == nil || len(claims.Ticket) == 0 {
		return ""
	}
	box, err := s.o.Keys.Seal(ticketPurpose, claims.Ticket)
	if err != nil {
		return ""
	}
	return box
}

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

// challenge answers POST /attest/v1/challenge.
//
// Checks before any cryptography: the body (bounded, strict JSON), the pool
// is in the policy (PoolNotInPolicy) and takes this kind of evidence
// (EvidenceKindNotAllowed), a verifier for the kind is configured, the
// kubelet key parses, the requested node name (if any) is a DNS name. Then
// the kind's verifier checks the identity (attest/tpm: EK and AK) and makes
// the challenge; the session is sealed, so nothing is stored. A ticket the
// node brought back (api.ChallengeRequest.Ticket) is opened and handed to
// the verifier (attest.ChallengeInput.Ticket), which checks what it says.
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
		Pool: req.Pool, KubeletKeySHA256: keySHA, Request: req.Request, Ticket: s.openTicket(req.Ticket),
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
