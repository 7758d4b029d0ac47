package azuretpm

import "github.com/nodeproof/nodeproof/attest/tpm"

// The wire format of Azure vTPM evidence: JSON, binary fields base64, the
// same envelope as the other kinds. Azure certifies the AK, so there is no
// credential to activate: the challenge is a nonce, and the answer is the
// AK, its certificate, a quote over the binding and the IMDS attested
// document asked for with a nonce derived from the same binding.

// ChallengeRequest is the node's first message. It is empty: the AK, its
// certificate and the document travel with the quote, and the nonce must
// exist before both (the shape every vouched-for AK's kind shares).
type ChallengeRequest = tpm.EmptyRequest

// Challenge is the server's answer: the nonce the quote and the document
// bind.
type Challenge = tpm.NonceChallenge

// Evidence is the node's second message.
type Evidence struct {
	// AKPublic is the AK's TPMT_PUBLIC (bare or TPM2B), as read from the
	// persistent handle 0x81000003.
	AKPublic []byte `json:"akPublic"`
	// AKCertificate is the AK certificate, DER, as read from NV
	// 0x01C101D0.
	AKCertificate []byte `json:"akCertificate"`
	// Intermediates are DER certificates between the AK certificate and
	// Azure's root, when the node has them. Untrusted: they only help
	// build a chain to the pinned root.
	Intermediates [][]byte `json:"intermediates,omitempty"`
	// Document is the IMDS attested document's "signature": base64 of a
	// DER PKCS#7 SignedData whose content is the document's JSON.
	Document string `json:"document"`
	// Quote is the quote by the AK over the binding, with the PCR values
	// and the event log.
	Quote tpm.QuoteEvidence `json:"quote"`
}

// Bounds on what a node may send, checked before any parsing.
const (
	// MaxCertificateSize bounds the AK certificate and each intermediate
	// (Azure's AK certificates are 1-2 KiB).
	MaxCertificateSize = 8 << 10
	// MaxIntermediates bounds Evidence.Intermediates.
	MaxIntermediates = 4
	// MaxDocumentSize bounds Evidence.Document, base64 (IMDS's carry the
	// signer's certificate: about 4 KiB).
	MaxDocumentSize = 32 << 10
	// MaxContentSize bounds the document's signed JSON (IMDS's are about
	// 400 bytes).
	MaxContentSize = 4 << 10
)
