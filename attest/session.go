package attest

import (
	"bytes"
	cryptorand "crypto/rand"
	"fmt"
	"io"
	"time"
)

// DefaultSessionTTL is how long a sealed attestation session lives when a
// verifier's SessionTTL is unset: the bound between challenge and answer.
const DefaultSessionTTL = 5 * time.Minute

// Session is what a server remembers between a challenge and its answer.
// Servers seal it (AEAD) and hand it to the node, so any replica can verify
// the answer; nothing in it may be trusted unless it came back sealed.
type Session struct {
	Kind Kind   `json:"kind"`
	Pool string `json:"pool"`
	// Purpose is what the attestation is for: PurposeEnrol (the default:
	// it releases a config) or PurposeReattest (a node that enrolled,
	// proving itself again: it releases nothing).
	Purpose Purpose `json:"purpose,omitempty"`
	// Nonce is the server's fresh random value for this session.
	Nonce []byte `json:"nonce"`
	// KubeletKeySHA256 is the hash of the kubelet public key the node bound.
	KubeletKeySHA256 []byte `json:"kubeletKeySHA256"`
	// IssuedAt and Expires bound the session's life.
	IssuedAt time.Time `json:"issuedAt"`
	Expires  time.Time `json:"expires"`
	// State is kind-specific (for TPM: the activation secret, the AK and
	// the EK facts already checked).
	State []byte `json:"state,omitempty"`
}

// Purpose is what an attestation is for.
type Purpose string

// Purposes.
const (
	// PurposeEnrol: the first attestation of an identity (or its
	// re-enrolment), which releases a config and leads to the node's first
	// kubelet certificate. The empty Purpose means it.
	PurposeEnrol Purpose = "enrol"
	// PurposeReattest: an enrolled node attesting again, at every boot and
	// on a timer; it releases nothing and updates the node's status.
	PurposeReattest Purpose = "reattest"
)

// Reattest reports whether s is a re-attestation.
func (s *Session) Reattest() bool { return s.Purpose == PurposeReattest }

// NewSession opens a session of kind for pool, as every kind's Challenge
// does: it refuses a kubelet key hash that is not 32 bytes
// (MalformedEvidence), draws a fresh NonceSize nonce from rand, and lives
// from now for ttl. The caller adds Purpose and State, and seals it.
func NewSession(kind Kind, pool string, kubeletKeySHA256 []byte, rand io.Reader, now time.Time, ttl time.Duration) (*Session, error) {
	if len(kubeletKeySHA256) != 32 {
		return nil, Deny(ReasonMalformed, "kubelet key hash must be 32 bytes")
	}
	nonce := make([]byte, NonceSize)
	if _, err := io.ReadFull(rand, nonce); err != nil {
		return nil, fmt.Errorf("%s: nonce: %w", kind, err)
	}
	return &Session{
		Kind: kind, Pool: pool, Nonce: nonce, KubeletKeySHA256: bytes.Clone(kubeletKeySHA256),
		IssuedAt: now, Expires: now.Add(ttl),
	}, nil
}

// CheckSession is every kind's first check at Verify: the session
// unsealed is one of kind, with a NonceSize nonce and a 32-byte kubelet
// key hash (SessionInvalid), and has not expired at now (SessionExpired).
func CheckSession(s *Session, kind Kind, now time.Time) error {
	if s == nil || s.Kind != kind {
		return Deny(ReasonSessionInvalid, "not a %s session", kind)
	}
	if len(s.Nonce) != NonceSize || len(s.KubeletKeySHA256) != 32 {
		return Deny(ReasonSessionInvalid, "the session's nonce or kubelet key hash has the wrong size")
	}
	if !now.Before(s.Expires) {
		return Deny(ReasonSessionExpired, "session expired at %s", s.Expires.UTC().Format(time.RFC3339))
	}
	return nil
}

// Sessions is a verifier's side of its kind's sessions, written once for
// every kind: how long a session lives, the clock and the randomness for
// nonces, from the kind's Options (NewSessions), and the two session steps
// of Challenge and Verify (Open, Check). A kind's Verifier holds one; it is
// safe for concurrent use.
type Sessions struct {
	kind  Kind
	ttl   time.Duration
	clock func() time.Time
	rand  io.Reader
}

// NewSessions checks and completes what a kind's Options say of its
// sessions, as every NewVerifier does: clock is required (no global
// clock); ttl zero means DefaultSessionTTL and negative is refused; rand
// nil means crypto/rand. The errors name pkg, the kind's package, and the
// Options field ("gcp: Options.Clock is required").
func NewSessions(kind Kind, pkg string, ttl time.Duration, clock func() time.Time, rand io.Reader) (*Sessions, error) {
	if clock == nil {
		return nil, fmt.Errorf("%s: Options.Clock is required", pkg)
	}
	if ttl < 0 {
		return nil, fmt.Errorf("%s: Options.SessionTTL %v is negative", pkg, ttl)
	}
	if ttl == 0 {
		ttl = DefaultSessionTTL
	}
	if rand == nil {
		rand = cryptorand.Reader
	}
	return &Sessions{kind: kind, ttl: ttl, clock: clock, rand: rand}, nil
}

// Now is the verifier's clock.
func (s *Sessions) Now() time.Time { return s.clock() }

// Rand is the verifier's randomness (for what a kind draws beside the
// nonce, e.g. TPM's activation secret).
func (s *Sessions) Rand() io.Reader { return s.rand }

// Open is Challenge's session: NewSession of the kind at the clock's now.
func (s *Sessions) Open(pool string, kubeletKeySHA256 []byte) (*Session, error) {
	return s.OpenAt(s.clock(), pool, kubeletKeySHA256)
}

// OpenAt is Open at now, for a Challenge that read the clock once for its
// own checks.
func (s *Sessions) OpenAt(now time.Time, pool string, kubeletKeySHA256 []byte) (*Session, error) {
	return NewSession(s.kind, pool, kubeletKeySHA256, s.rand, now, s.ttl)
}

// Check is Verify's first check: CheckSession of the kind at the clock's
// now (SessionInvalid, SessionExpired). It returns that now, the time the
// rest of Verify's checks use.
func (s *Sessions) Check(sess *Session) (time.Time, error) {
	now := s.clock()
	return now, CheckSession(sess, s.kind, now)
}
