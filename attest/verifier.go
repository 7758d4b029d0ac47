package attest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
)

// Verifier is the one seam between the server and a kind of evidence: the
// server opens an attestation with Challenge and finishes it with Verify,
// and never looks inside either message. Each kind's package (attest/tpm,
// identity/gcp, identity/aws, identity/gcevtpm, identity/nitrotpm) makes
// one from its own verifier (their Seam methods); a Registry holds the
// kinds a server takes. Adding a kind touches its own package, the policy
// (attest/policy) and the docs, and nothing in the server.
//
// The challenge request is JSON as it travels (mcs/api puts each kind's
// message under the kind's name), which Challenge decodes strictly
// (DecodeEvidence); the evidence, the large message (an event log), the
// server decodes in the same strict pass as its envelope, into what
// NewEvidence returns.
type Verifier interface {
	// Kind is the evidence kind this verifier checks.
	Kind() Kind
	// Challenge is step one: it checks the node's request (every check the
	// kind's Challenge doc comment lists) and returns the challenge to
	// send back and the session for the caller to seal.
	Challenge(ctx context.Context, in ChallengeInput) (challenge any, sess *Session, err error)
	// NewEvidence returns a new zero value of the kind's evidence (a
	// pointer), to decode the node's answer into.
	NewEvidence() any
	// Verify is step two: it checks the node's evidence (what NewEvidence
	// returned, decoded; anything else is MalformedEvidence) against the
	// session the caller unsealed (every check the kind's Verify doc
	// comment lists) and, only if all pass, returns the Claims.
	Verify(ctx context.Context, sess *Session, evidence any) (*Claims, error)
}

// ChallengeInput is what a server hands a Verifier's Challenge.
type ChallengeInput struct {
	Pool string
	// KubeletKeySHA256 is the hash of the kubelet public key the evidence
	// will bind (already parsed by the server).
	KubeletKeySHA256 []byte
	// Request is the kind's challenge request as sent (JSON; nil when the
	// node sent none).
	Request json.RawMessage
	// Admit, when set, is asked before any cryptography is spent on an
	// identity the request only claims (a TPM's EK): a kind that reads one
	// calls it with a key naming that identity and returns its error.
	Admit func(claimed string) error
	// Ticket is what this kind's verifier handed the node at an earlier
	// attestation (Claims.Ticket), brought back by the node and opened by
	// the server, which sealed it: authentic, but possibly old or another
	// machine's, so the kind checks it names this request's identity. Nil
	// when the node sent none or it did not open (sealed by keys the
	// server no longer has, or forged): a kind then does what it does for
	// a node that never had one.
	Ticket []byte
}

// AdmitClaimed calls in.Admit for claimed, when set.
func (in ChallengeInput) AdmitClaimed(claimed string) error {
	if in.Admit == nil {
		return nil
	}
	return in.Admit(claimed)
}

// Registry is the verifiers a server takes, by kind. A kind absent from
// it is refused (EvidenceKindNotAllowed).
type Registry map[Kind]Verifier

// NewRegistry returns a Registry of vs, refusing a kind given twice. Nil
// entries (a kind the policy does not take) are left out.
func NewRegistry(vs ...Verifier) (Registry, error) {
	r := Registry{}
	for _, v := range vs {
		if v == nil {
			continue
		}
		if _, dup := r[v.Kind()]; dup {
			return nil, fmt.Errorf("attest: two verifiers for %q evidence", v.Kind())
		}
		r[v.Kind()] = v
	}
	return r, nil
}

// Kinds lists the registry's kinds, sorted.
func (r Registry) Kinds() []Kind {
	ks := make([]Kind, 0, len(r))
	for k := range r {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

// DecodeEvidence decodes one kind's message strictly into v: one JSON
// object, no unknown fields, nothing after it. Empty or null raw is
// MalformedEvidence naming what is missing.
func DecodeEvidence(raw json.RawMessage, what string, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return Deny(ReasonMalformed, "no %s", what)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Deny(ReasonMalformed, "%s: %v", what, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Deny(ReasonMalformed, "%s: more than one JSON value", what)
	}
	return nil
}

// Seam makes a Verifier of kind from a kind's typed steps: challenge gets
// the request decoded strictly into a Req (DecodeEvidence; an absent
// message is MalformedEvidence), verify the evidence as an *Ev.
func Seam[Req, Ev any](kind Kind, challenge func(in ChallengeInput, req *Req) (any, *Session, error), verify func(ctx context.Context, sess *Session, ev *Ev) (*Claims, error)) Verifier {
	return seam[Req, Ev]{kind, challenge, verify}
}

type seam[Req, Ev any] struct {
	kind      Kind
	challenge func(ChallengeInput, *Req) (any, *Session, error)
	verify    func(context.Context, *Session, *Ev) (*Claims, error)
}

func (s seam[Req, Ev]) Kind() Kind { return s.kind }

func (s seam[Req, Ev]) Challenge(_ context.Context, in ChallengeInput) (any, *Session, error) {
	var req Req
	if err := DecodeEvidence(in.Request, string(s.kind)+" request", &req); err != nil {
		return nil, nil, err
	}
	return s.challenge(in, &req)
}

func (s seam[Req, Ev]) NewEvidence() any { return new(Ev) }

func (s seam[Req, Ev]) Verify(ctx context.Context, sess *Session, evidence any) (*Claims, error) {
	ev, ok := evidence.(*Ev)
	if !ok || ev == nil {
		return nil, Deny(ReasonMalformed, "no %s evidence", s.kind)
	}
	return s.verify(ctx, sess, ev)
}
