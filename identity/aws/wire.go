package aws

// The wire format of AWS evidence: JSON, the same envelope as the other
// kinds. The instance identity document carries no nonce, so the challenge
// is empty and the evidence is what the instance metadata service returns,
// unchanged.

// ChallengeRequest is the node's first message. AWS evidence needs nothing
// from the node before the challenge (the kubelet key hash travels in the
// common envelope); the type exists so every kind has the same two steps.
type ChallengeRequest struct{}

// Challenge is the server's answer. It is empty: AWS signs the instance
// identity document once, at launch, and nothing the server sends can be
// bound into it (see the package documentation for what follows).
type Challenge struct{}

// Evidence is the node's second message: the instance identity document and
// its signatures exactly as the instance metadata service returned them.
type Evidence struct {
	// Document is /latest/dynamic/instance-identity/document. It is
	// informational only and never trusted: the verifier reads the document
	// from the signed content of PKCS7 and refuses evidence whose Document,
	// when present, is a different document.
	Document []byte `json:"document,omitempty"`
	// PKCS7 is /latest/dynamic/instance-identity/rsa2048: a base64 (no PEM
	// armour; line breaks allowed) PKCS#7 SignedData with the document as
	// its attached content, signed with SHA-256 and RSA by the Region's
	// RSA-2048 key.
	PKCS7 string `json:"pkcs7"`
	// Signature is /latest/dynamic/instance-identity/signature, the legacy
	// base64 RSA-SHA256 signature over the document. Optional. The verifier
	// bounds its size and otherwise ignores it: it proves nothing PKCS7 does
	// not, and trusting it would need a second set of certificates.
	Signature string `json:"signature,omitempty"`
}

// Bounds on what crosses the network, checked before any parsing.
const (
	// MaxPKCS7Size bounds Evidence.PKCS7 (base64 text). AWS's rsa2048 blob
	// is about 1.5 KiB.
	MaxPKCS7Size = 16 << 10
	// MaxDocumentSize bounds a document: Evidence.Document and the signed
	// content alike. AWS's documents are about 500 bytes.
	MaxDocumentSize = 8 << 10
	// MaxSignatureSize bounds Evidence.Signature (base64 of an RSA
	// signature).
	MaxSignatureSize = 2 << 10
	// maxFieldSize bounds each document string field we keep.
	maxFieldSize = 128
)
