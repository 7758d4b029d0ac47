package tpm

// The wire format of TPM evidence: JSON, with every binary field base64
// (encoding/json's []byte). The same structures travel from the node agent
// to the server and are what tests, tpm2-tools conversions and the bench
// load generator produce. Field contents are TPM structures exactly as the
// TPM emitted them, so any producer (go-attestation, tpm2-tools, a model)
// can make them.

// AKParameters describe an attestation key and prove the TPM made it.
type AKParameters struct {
	// Public is the AK's TPMT_PUBLIC.
	Public []byte `json:"public"`
	// CreateData is the TPMS_CREATION_DATA from TPM2_Create.
	CreateData []byte `json:"createData"`
	// CreateAttestation is the TPMS_ATTEST from TPM2_CertifyCreation.
	CreateAttestation []byte `json:"createAttestation"`
	// CreateSignature is the AK's TPMT_SIGNATURE over CreateAttestation.
	CreateSignature []byte `json:"createSignature"`
}

// ChallengeRequest is the node's first message: who it is.
type ChallengeRequest struct {
	// EKPublic is the endorsement key's public key, PKIX DER.
	EKPublic []byte `json:"ekPublic"`
	// EKCertificate is the EK certificate as read from NV (DER, possibly
	// with the TCG NV header); empty for TPMs without one.
	EKCertificate []byte `json:"ekCertificate,omitempty"`
	// EKIntermediates are extra DER certificates between the EK
	// certificate and a vendor root, if the node has them.
	EKIntermediates [][]byte     `json:"ekIntermediates,omitempty"`
	AK              AKParameters `json:"ak"`
}

// Challenge is the server's answer: a credential only the TPM holding both
// the EK and the AK can activate, and the nonce the quote must bind. A node
// whose AK ticket held gets the nonce alone (no credential to activate).
type Challenge struct {
	Nonce []byte `json:"nonce"`
	// Credential is the TPM2B_ID_OBJECT and Secret the
	// TPM2B_ENCRYPTED_SECRET of TPM2_MakeCredential.
	Credential []byte `json:"credential,omitempty"`
	Secret     []byte `json:"secret,omitempty"`
}

// Quote is a TPM2_Quote: the TPMS_ATTEST and the AK's TPMT_SIGNATURE.
type Quote struct {
	Quote     []byte `json:"quote"`
	Signature []byte `json:"signature"`
}

// PCR is one PCR value of one bank.
type PCR struct {
	Index  int    `json:"index"`
	Bank   string `json:"bank"` // "sha1", "sha256", "sha384"
	Digest []byte `json:"digest"`
}

// Evidence is the node's second message: the activated secret, the quotes
// and the event log.
type Evidence struct {
	// KubeletKeySHA256 is the hash of the kubelet public key the node bound
	// into the quote (it must be the session's).
	KubeletKeySHA256 []byte `json:"kubeletKeySHA256"`
	// ActivationSecret is what TPM2_ActivateCredential returned; none
	// when the challenge carried no credential.
	ActivationSecret []byte `json:"activationSecret,omitempty"`
	// Quotes are one quote per bank the node quoted.
	Quotes []Quote `json:"quotes"`
	PCRs   []PCR   `json:"pcrs"`
	// EventLog is the TCG PC Client event log (binary_bios_measurements).
	EventLog []byte `json:"eventLog,omitempty"`
}

// Bounds on what a node may send, checked before any parsing.
const (
	maxStructure = 4096 // any single TPM structure or certificate
	maxQuotes    = 4
	maxPCRs      = 3 * 24
	maxChain     = 4
)
