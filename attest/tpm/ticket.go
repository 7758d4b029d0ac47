package tpm

import (
	"encoding/json"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// An AK ticket is what the verifier hands a node after a credential
// activation proved its AK resident in the TPM that holds its EK, for the
// node to bring back with the same AK (kept between runs: the agent's
// --ak-state) so that its next attestations need no activation: a quote
// and the reads, no key generation, no RSA decryption by the EK. The
// server seals it (AES-GCM, its session keys: the verifier keeps no
// state), so it is authentic; what it states is a fact of the hardware —
// a fixedTPM key never leaves the TPM that made it, and a TPM2_Clear
// destroys it with the storage hierarchy — so it names the EK and the
// AK and nothing else: the EK's trust, the quote, the boot and the node's
// status are checked at every attestation as before. A ticket is worth no
// more than the session keys: whoever can seal one can also seal a
// session (docs/tpm.md, "A kept AK").
type akTicket struct {
	// V is the ticket's format (1).
	V int `json:"v"`
	// EKSHA256 is the SHA-256 of the EK's PKIX DER; AKName the hex TPM
	// name of the AK the credential was made for.
	EKSHA256 []byte `json:"ek"`
	AKName   string `json:"ak"`
	// IssuedAt is when the activation was verified.
	IssuedAt time.Time `json:"at"`
}

// DefaultTicketTTL is how long a ticket spares a node the activation: a
// month, after which one attestation activates a credential again and
// gets a new ticket. A rotation of the server's session keys ends tickets
// sooner (a ticket that does not open is no ticket).
const DefaultTicketTTL = 30 * 24 * time.Hour

// ticketSkew is how far in the future a ticket's time may be (replicas'
// clocks).
const ticketSkew = 5 * time.Minute

// issueTicket is the ticket for the AK named akName in the TPM of the EK
// whose SHA-256 is ek, activated at now.
func issueTicket(ek []byte, akName string, now time.Time) []byte {
	b, _ := json.Marshal(akTicket{V: 1, EKSHA256: ek, AKName: akName, IssuedAt: now.UTC()})
	return b
}

// ticketHolds reports whether raw, an opened ticket, says that the AK
// named akName is resident in the TPM of the EK whose SHA-256 is ek, and
// is still good at now. Its checks: it decodes, in format 1; its EK is ek
// and its AK is akName (attest.Equal); it was issued no later than now
// (within ticketSkew) and less than ttl ago. A ticket that fails any is
// not a refusal: the node activates a credential, as one without a ticket
// does.
func ticketHolds(raw, ek []byte, akName string, now time.Time, ttl time.Duration) bool {
	if len(raw) == 0 {
		return false
	}
	var t akTicket
	if err := json.Unmarshal(raw, &t); err != nil || t.V != 1 {
		return false
	}
	if !attest.Equal(t.EKSHA256, ek) || !attest.Equal([]byte(t.AKName), []byte(akName)) {
		return false
	}
	return !t.IssuedAt.After(now.Add(ticketSkew)) && now.Sub(t.IssuedAt) < ttl
}
