// Package tpm is nodeproof's TPM 2.0 evidence: the wire format, the
// node-side collector (collect.go) and the server-side verifier
// (verify.go). The verifier establishes Claims; attest/policy decides what
// they may have.
package tpm

import (
	"crypto"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/go-tpm/legacy/tpm2/credactivation"

	"github.com/nodeproof/nodeproof/attest"
)

// activationSecretSize is the size of the credential-activation secret.
const activationSecretSize = 32

// Options configure a Verifier. Each field says what it changes about
// security.
type Options struct {
	// Roots are the TPM-vendor CA sets an EK certificate may chain to.
	// Empty trusts no EK certificate (the inventory may still vouch).
	Roots []RootSet
	// Inventory lists EKs trusted without a certificate. Nil trusts none.
	Inventory *Inventory
	// RequiredPCRs must all be covered by the quote. Nil means 0-9, the
	// PCRs the firmware, Secure Boot and the boot loader measure into.
	RequiredPCRs []int
	// SessionTTL bounds the time between challenge and answer. Zero means
	// five minutes.
	SessionTTL time.Duration
	// Clock tells the time; required (no global clock).
	Clock func() time.Time
	// Rand is the randomness for nonces and activation secrets; nil means
	// crypto/rand.
	Rand io.Reader
	// TicketTTL is how long an AK ticket (ticket.go) spares a node the
	// credential activation. Zero means DefaultTicketTTL; negative takes
	// no ticket (every attestation activates a credential).
	TicketTTL time.Duration
}

// Verifier is the server side of TPM evidence. It is safe for concurrent
// use and keeps no per-session state: what it needs between the two steps
// is in the attest.Session it returns, which the caller must seal.
type Verifier struct {
	ek        *ekTrust
	required  []int
	sess      *attest.Sessions
	ticketTTL time.Duration
}

// NewVerifier returns a Verifier.
func NewVerifier(o Options) (*Verifier, error) {
	sessions, err := attest.NewSessions(attest.KindTPM, "tpm", o.SessionTTL, o.Clock, o.Rand)
	if err != nil {
		return nil, err
	}
	v := &Verifier{ek: newEKTrust(o.Roots, o.Inventory), required: o.RequiredPCRs, sess: sessions, ticketTTL: o.TicketTTL}
	if v.ticketTTL == 0 {
		v.ticketTTL = DefaultTicketTTL
	}
	if v.required == nil {
		v.required = []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	}
	if err := CheckRequiredPCRs("tpm", v.required); err != nil {
		return nil, err
	}
	return v, nil
}

// sessionState is the TPM part of a sealed attest.Session.
type sessionState struct {
	Secret []byte `json:"secret,omitempty"`
	// Ticketed is set when the node's AK ticket stood for the activation:
	// the challenge carried no credential, and the answer carries no
	// secret.
	Ticketed   bool     `json:"ticketed,omitempty"`
	AKPublic   []byte   `json:"akPublic"`
	AKName     string   `json:"akName"`
	EKSHA256   []byte   `json:"ekSHA256"`
	EKTrust    string   `json:"ekTrust"`
	EKKind     string   `json:"ekKind,omitempty"`
	CertSubj   string   `json:"certSubject,omitempty"`
	CertIssuer string   `json:"certIssuer,omitempty"`
	CertSerial string   `json:"certSerial,omitempty"`
	NodeName   string   `json:"nodeName,omitempty"`
	Addresses  []string `json:"addresses,omitempty"`
}

// Challenge is step one. It checks the node's identity and returns the
// challenge for the node and the session for the caller to seal.
//
// Checks, each with its own denial reason:
//  1. Sizes: every structure and certificate within bounds
//     (MalformedEvidence); the kubelet key hash is 32 bytes.
//  2. EK trust (see ekTrust): inventory, or an EK certificate whose key is
//     the EK (EKCertificateKeyMismatch) chaining to a configured vendor
//     root (EKUntrusted, EKCertificateInvalid); neither: EKNotInInventory.
//  3. AK public area: a TPMT_PUBLIC, bare (go-attestation) or in its
//     TPM2B size (tpm2_createak -u) (MalformedEvidence, naming the field);
//     a restricted signing key with fixedTPM, fixedParent,
//     sensitiveDataOrigin, not decrypt, RSA >= 2048 or NIST P-256+,
//     SHA-256+ scheme (AKAttributes).
//  4. AK creation attestation, when the node sends creation data (a
//     go-attestation convention; plain tpm2_createak sends none): all
//     three fields, the data bare or in its TPM2B size
//     (MalformedEvidence), TPM_GENERATED, a creation attestation of
//     exactly this AK, creation-data digest matching, signed by the AK
//     (AKCreationAttestation). Without it, credential activation (step
//     two) is what proves the AK is this TPM's: the credential is bound to
//     the AK's name — the hash of its public area, attributes included —
//     and only the TPM holding the EK and a loaded object of that name
//     can release the secret; a TPM loads a fixedTPM, restricted signing
//     key only if it made it (docs/tpm.md).
//
// Then it makes the credential (TPM2_MakeCredential, with go-tpm's
// credactivation) for the AK's name under the EK, with a fresh 32-byte
// secret, and a fresh 32-byte nonce. Challenge takes no AK ticket:
// ChallengeTicketed does.
func (v *Verifier) Challenge(pool string, kubeletKeySHA256 []byte, req *ChallengeRequest) (*Challenge, *attest.Session, error) {
	return v.ChallengeTicketed(pool, kubeletKeySHA256, req, nil)
}

// ChallengeTicketed is Challenge for a node that brought back an AK
// ticket, opened (attest.ChallengeInput.Ticket; nil for none). Every
// check of Challenge is made; then, when the ticket holds (ticketHolds:
// this EK, this AK's name, issued less than Options.TicketTTL ago), no
// credential is made: the challenge is the nonce alone, and Verify
// requires no activation secret. A ticket that does not hold is ignored:
// the challenge carries a credential, as for a node without one.
func (v *Verifier) ChallengeTicketed(pool string, kubeletKeySHA256 []byte, req *ChallengeRequest, ticket []byte) (*Challenge, *attest.Session, error) {
	if err := checkRequestSizes(req); err != nil {
		return nil, nil, err
	}
	if len(kubeletKeySHA256) != 32 {
		return nil, nil, attest.Deny(attest.ReasonMalformed, "kubelet key hash must be 32 bytes")
	}
	now := v.sess.Now()
	ek, err := v.ek.check(req.EKPublic, req.EKCertificate, req.EKIntermediates, now)
	if err != nil {
		return nil, nil, err
	}
	akPublic := unTPM2B(req.AK.Public)
	ak, err := parseAKPublic(akPublic)
	if err != nil {
		return nil, nil, err
	}
	c := req.AK
	switch {
	case len(c.CreateData) == 0 && len(c.CreateAttestation) == 0 && len(c.CreateSignature) == 0:
		// No creation data: activation alone binds the AK (see above).
	case len(c.CreateData) == 0 || len(c.CreateAttestation) == 0 || len(c.CreateSignature) == 0:
		return nil, nil, attest.Deny(attest.ReasonMalformed, "tpm.ak: createData, createAttestation and createSignature go together: send all three or none")
	default:
		if err := ak.checkCreation(unTPM2B(c.CreateData), c.CreateAttestation, c.CreateSignature); err != nil {
			return nil, nil, err
		}
	}
	if err := ak.computeName(); err != nil {
		return nil, nil, err
	}
	sess, err := v.sess.OpenAt(now, pool, kubeletKeySHA256)
	if err != nil {
		return nil, nil, err
	}
	ch := &Challenge{Nonce: sess.Nonce}
	var secret []byte
	ticketed := v.ticketTTL > 0 && ticketHolds(ticket, ek.SHA256[:], ak.nameHex, now, v.ticketTTL)
	if !ticketed {
		secret = make([]byte, activationSecretSize)
		if _, err := io.ReadFull(v.sess.Rand(), secret); err != nil {
			return nil, nil, fmt.Errorf("tpm: activation secret: %w", err)
		}
		if ch.Credential, ch.Secret, err = credactivation.Generate(ak.name.Digest, ek.Public, 16, secret); err != nil {
			return nil, nil, attest.Deny(attest.ReasonAKInvalid, "cannot make a credential for this AK under this EK")
		}
	}
	state, err := json.Marshal(sessionState{
		Secret: secret, Ticketed: ticketed, AKPublic: akPublic, AKName: ak.nameHex, EKSHA256: ek.SHA256[:], EKTrust: ek.Trust, EKKind: ek.Kind,
		CertSubj: ek.CertSubj, CertIssuer: ek.CertIssuer, CertSerial: ek.CertSerial,
		NodeName: ek.NodeName, Addresses: ek.Addresses,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("tpm: session state: %w", err)
	}
	sess.State = state
	return ch, sess, nil
}

// Verify is step two: it checks the node's answer against the session the
// caller unsealed and, only if every check passes, returns Claims.
// One-time use of a session is the caller's to enforce (the store).
//
// Checks, each with its own denial reason:
//  1. The session is a TPM session with a 32-byte nonce and kubelet key
//     hash (SessionInvalid) and has not expired at the verifier's clock
//     (SessionExpired): attest.Sessions.Check.
//  2. Sizes of every field (MalformedEvidence).
//  3. The activation secret equals the session's, in constant time
//     (CredentialActivationFailed): the AK lives in the TPM that holds the
//     EK. A session whose challenge the node's AK ticket spared the
//     credential (ChallengeTicketed) takes no secret (MalformedEvidence
//     when one is sent): the ticket, sealed by the server after an
//     earlier activation of this AK under this EK, is that proof.
//  4. A quote whose selection includes the SHA-256 bank (alone, or beside
//     others as tpm2_quote -l sha1:…+sha256:… makes) is used; otherwise one
//     of the SHA-1 bank, accepted here and marked pcrBank "sha1" for
//     policy to refuse (SHA256BankMissing when there is neither; a quote
//     that does not decode is MalformedEvidence or QuoteNotTPMGenerated).
//  5. The quote (see verifyQuote): AK signature (QuoteSignature),
//     TPM_GENERATED and quote type (QuoteNotTPMGenerated), qualifying data
//     = attest.BindingDigest(session nonce, the kubelet key hash the node
//     says it bound) (QuoteBindingMismatch; QuoteQualifyingDataRawNonce and
//     QuoteKubeletKeyHashMissing name the two common mistakes), the chosen
//     bank covers RequiredPCRs (QuotePCRSelection), the values of every
//     selected bank match the quoted digest (QuotePCRDigestMismatch).
//  6. The kubelet key hash the quote binds is the session's, in constant
//     time (KubeletKeyMismatch): so the accepted quote's qualifying data is
//     exactly BindingDigest(session nonce, session kubelet key).
//  7. The event log parses (EventLogMalformed) and replays to the quoted
//     PCR values (EventLogReplayMismatch); PCR 11 may hold systemd's boot
//     phases after its logged events, only as systemd makes them
//     (pcr11Phases; BootState.SystemdPhases).
//  8. Boot state is read only from replayed events whose data matches its
//     digest where the meaning is in the data (EventLogMalformed), as the
//     boot's sequence: bootState lists each of its checks (the order of
//     PCR 7, ExitBootServices, Secure Boot authorities and the shim's
//     PCR 7 and PCR 14 measurements; EventLogOutOfOrder,
//     EventLogVariableRepeated, EventLogVariableGUID,
//     EventLogUnexpectedEvent, UEFIDebuggerPresent).
//
// Refusals of checks 7 and 8 come after the identity was proven: they are
// wrapped in an *attest.Identified naming it (a re-attestation records
// them as the node's failure). Claims of a session that activated a
// credential carry an AK ticket (Claims.Ticket) for the server to seal
// and the node to keep with its AK; a ticketed session's carry none (the
// node keeps the one it has until it expires).
func (v *Verifier) Verify(sess *attest.Session, ev *Evidence) (*attest.Claims, error) {
	now, err := v.sess.Check(sess)
	if err != nil {
		return nil, err
	}
	var st sessionState
	if err := json.Unmarshal(sess.State, &st); err != nil {
		return nil, attest.Deny(attest.ReasonSessionInvalid, "the session's TPM state does not decode")
	}
	if err := checkEvidenceSizes(ev); err != nil {
		return nil, err
	}
	switch {
	case st.Ticketed && len(ev.ActivationSecret) > 0:
		return nil, attest.Deny(attest.ReasonMalformed, "an activation secret for a challenge that carried no credential (the AK ticket stood for it)")
	case st.Ticketed:
	case len(st.Secret) != activationSecretSize || !attest.Equal(ev.ActivationSecret, st.Secret):
		return nil, attest.Deny(attest.ReasonActivation, "activation secret does not match: the AK is not in the TPM that holds the EK")
	}
	ak, err := parseAKPublic(st.AKPublic)
	if err != nil {
		return nil, err
	}
	q, err := pickQuote(ev.Quotes, defaultBanks)
	if err != nil {
		return nil, err
	}
	binding := attest.BindingDigest(sess.Nonce, ev.KubeletKeySHA256)
	qr, err := verifyQuote(ak, q, ev.PCRs, binding, sess.Nonce, v.required, defaultBanks)
	if err != nil {
		return nil, err
	}
	if !attest.Equal(ev.KubeletKeySHA256, sess.KubeletKeySHA256) {
		return nil, attest.Deny(attest.ReasonKubeletKey, "the quote binds a kubelet key other than the one this session was opened for")
	}
	ekHex := hex.EncodeToString(st.EKSHA256)
	// From here on the identity is proven (the AK is the EK's, the quote
	// is the AK's and this session's): what is refused is the boot.
	events, phases, err := replayLog(ev.EventLog, qr.bank, qr.pcrs)
	if err != nil {
		return nil, &attest.Identified{Identity: "tpm-ek:" + ekHex, Err: err}
	}
	boot, err := bootState(events, qr.bank)
	if err != nil {
		return nil, &attest.Identified{Identity: "tpm-ek:" + ekHex, Err: err}
	}
	boot.SystemdPhases = phases
	boot.LogMissing = len(ev.EventLog) == 0
	pcrs := make(map[int]string, len(qr.pcrs))
	for i, d := range qr.pcrs {
		pcrs[i] = hex.EncodeToString(d)
	}
	var ticket []byte
	if !st.Ticketed && v.ticketTTL > 0 {
		ticket = issueTicket(st.EKSHA256, st.AKName, now)
	}
	return &attest.Claims{
		Ticket:           ticket,
		Kind:             attest.KindTPM,
		Identity:         "tpm-ek:" + ekHex,
		NodeName:         st.NodeName,
		Addresses:        st.Addresses,
		KubeletKeySHA256: sess.KubeletKeySHA256,
		VerifiedAt:       now,
		TPM: &attest.TPMClaims{
			EKSHA256: ekHex, EKTrust: st.EKTrust, EKKind: st.EKKind,
			EKCertSubject: st.CertSubj, EKCertIssuer: st.CertIssuer, EKCertSerial: st.CertSerial,
			AKName: st.AKName, PCRBank: bankName(qr.bank), PCRs: pcrs, Boot: boot,
			ResetCount: qr.clock.ResetCount, RestartCount: qr.clock.RestartCount, Clock: qr.clock.Clock,
		},
	}, nil
}

// defaultBanks are the banks Verify accepts, preferred first: SHA-256,
// else SHA-1 (marked in claims for policy to refuse).
var defaultBanks = []crypto.Hash{crypto.SHA256, crypto.SHA1}

// pickQuote returns the quote whose selection includes the first bank of
// banks (alone or beside others, as tpm2_quote -l sha1:…+sha256:… makes),
// else one that selects the next, and so on. A quote that does not decode
// is refused for what it is (MalformedEvidence, QuoteNotTPMGenerated), not
// skipped.
func pickQuote(quotes []Quote, banks []crypto.Hash) (Quote, error) {
	best, bestRank := -1, len(banks)
	for i, q := range quotes {
		qb, err := quoteBanks(q)
		if err != nil {
			return Quote{}, err
		}
		for _, h := range qb {
			if r := slices.Index(banks, h); r >= 0 && r < bestRank {
				best, bestRank = i, r
			}
		}
	}
	if best < 0 {
		return Quote{}, attest.Deny(attest.ReasonNoSHA256Bank, "no quote selects the %s bank", bankNames(banks))
	}
	return quotes[best], nil
}

// bankNames names banks for a refusal: "sha256 or sha1".
func bankNames(banks []crypto.Hash) string {
	names := make([]string, len(banks))
	for i, h := range banks {
		names[i] = bankName(h)
	}
	return strings.Join(names, " or ")
}

// unTPM2B returns the contents of b when b is a TPM2B — a 2-byte
// big-endian size, then exactly that many bytes — and b otherwise. A bare
// TPMT_PUBLIC or TPMS_CREATION_DATA is never read as one: the first starts
// with its algorithm (2 bytes, 0x0001 or 0x0023) and the second with a
// 4-byte count, and no real structure is as short as those would make it.
func unTPM2B(b []byte) []byte {
	if len(b) >= 2 && int(binary.BigEndian.Uint16(b)) == len(b)-2 {
		return b[2:]
	}
	return b
}

func checkRequestSizes(r *ChallengeRequest) error {
	if r == nil {
		return attest.Deny(attest.ReasonMalformed, "empty challenge request")
	}
	fields := [][]byte{r.EKPublic, r.EKCertificate, r.AK.Public, r.AK.CreateData, r.AK.CreateAttestation, r.AK.CreateSignature}
	fields = append(fields, r.EKIntermediates...)
	for _, f := range fields {
		if len(f) > maxStructure {
			return attest.Deny(attest.ReasonMalformed, "a field of %d bytes exceeds %d", len(f), maxStructure)
		}
	}
	if len(r.EKIntermediates) > maxChain {
		return attest.Deny(attest.ReasonMalformed, "more than %d EK intermediates", maxChain)
	}
	if len(r.EKPublic) == 0 || len(r.AK.Public) == 0 {
		return attest.Deny(attest.ReasonMalformed, "EK and AK public keys are required")
	}
	return nil
}

func checkEvidenceSizes(e *Evidence) error {
	if e == nil {
		return attest.Deny(attest.ReasonMalformed, "empty evidence")
	}
	if len(e.Quotes) == 0 || len(e.Quotes) > maxQuotes {
		return attest.Deny(attest.ReasonMalformed, "%d quotes; want 1 to %d", len(e.Quotes), maxQuotes)
	}
	if len(e.PCRs) > maxPCRs {
		return attest.Deny(attest.ReasonMalformed, "%d PCR values; at most %d", len(e.PCRs), maxPCRs)
	}
	for _, q := range e.Quotes {
		if len(q.Quote) > maxStructure || len(q.Signature) > maxStructure {
			return attest.Deny(attest.ReasonMalformed, "quote exceeds %d bytes", maxStructure)
		}
	}
	if len(e.ActivationSecret) > maxStructure {
		return attest.Deny(attest.ReasonMalformed, "activation secret too large")
	}
	if len(e.EventLog) > MaxEventLogSize {
		return attest.Deny(attest.ReasonEventLogInvalid, "event log of %d bytes exceeds %d", len(e.EventLog), MaxEventLogSize)
	}
	return nil
}
