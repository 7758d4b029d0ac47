package attest

import "time"

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
