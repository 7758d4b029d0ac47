package attest

import (
	"bytes"
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
