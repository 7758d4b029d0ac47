package nitrotpm

import (
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/identity/aws"
)

// The wire format of NitroTPM evidence: JSON, binary fields base64, the
// same envelope as the other kinds. The node asks the Nitro hypervisor
// for an attestation document carrying the server's nonce and its AK's
// public key, quotes with that AK, and sends both with the instance
// identity document (which names the account and Region the attestation
// document does not).

// ChallengeRequest is the node's first message (empty: the shape every
// vouched-for AK's kind shares).
type ChallengeRequest = tpm.EmptyRequest

// Challenge is the server's answer: the nonce the attestation document
// carries and the quote binds.
type Challenge = tpm.NonceChallenge

// Evidence is the node's second message.
type Evidence struct {
	// Document is the NitroTPM attestation document, the COSE_Sign1 bytes
	// as the hypervisor returned them, requested with nonce = the
	// challenge's nonce and public_key = the AK's public key as PKIX DER
	// (SubjectPublicKeyInfo: the encoding nitro-tpm-attest --public-key
	// and AWS KMS take).
	Document []byte `json:"document"`
	// AKPublic is the AK's TPMT_PUBLIC (bare or TPM2B).
	AKPublic []byte `json:"akPublic"`
	// Quote is the quote by the AK over the binding, selecting the SHA-384
	// bank (the bank the document's PCRs are), with the PCR values and the
	// event log.
	Quote tpm.QuoteEvidence `json:"quote"`
	// Identity is the instance identity document, as identity/aws takes
	// it.
	Identity aws.Evidence `json:"identity"`
}
