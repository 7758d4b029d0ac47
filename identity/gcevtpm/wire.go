package gcevtpm

import "github.com/nodeproof/nodeproof/attest/tpm"

// The wire format of GCE vTPM evidence: JSON, binary fields base64, the
// same envelope as the other kinds. Google certifies the AK, so there is no
// credential to activate: the challenge is a nonce, and the answer is the
// AK, its certificate and a quote over the binding.

// ChallengeRequest is the node's first message. It is empty: the AK and
// its certificate travel with the quote, and the nonce must exist before
// the quote (the shape every vouched-for AK's kind shares).
type ChallengeRequest = tpm.EmptyRequest

// Challenge is the server's answer: the nonce the quote binds.
type Challenge = tpm.NonceChallenge

// Evidence is the node's second message.
type Evidence struct {
	// AKPublic is the AK's TPMT_PUBLIC (bare or TPM2B), as the TPM made it
	// from Google's template in NV (0x01c10001 RSA, 0x01c10003 ECC).
	AKPublic []byte `json:"akPublic"`
	// AKCertificate is the AK certificate, DER, as read from NV
	// (0x01c10000 RSA, 0x01c10002 ECC).
	AKCertificate []byte `json:"akCertificate"`
	// Intermediates are DER certificates between the AK certificate and a
	// Google root, when the node has them (fetched over AIA). Untrusted:
	// they only help build a chain to a pinned root.
	Intermediates [][]byte `json:"intermediates,omitempty"`
	// Quote is the quote by the AK over the binding, with the PCR values
	// and the event log.
	Quote tpm.QuoteEvidence `json:"quote"`
}

// Bounds on what a node may send, checked before any parsing.
const (
	// MaxCertificateSize bounds the AK certificate and each intermediate.
	// Google's are about 2 KiB.
	MaxCertificateSize = 8 << 10
	// MaxIntermediates bounds Evidence.Intermediates (go-tpm-tools' client
	// fetches a chain of at most 4).
	MaxIntermediates = 4
)
