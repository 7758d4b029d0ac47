package tpm

import (
	"crypto"
	"crypto/x509"
	"encoding/hex"
	"fmt"

	"github.com/google/go-tpm-tools/client"
	legacy "github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/attest"
)

// Quotes by an attestation key that something other than credential
// activation vouches for: a cloud that certifies the AK (GCE's vTPM, whose
// AK certificate Google issues, identity/gcevtpm; Azure's Trusted Launch
// vTPM, identity/azuretpm) or signs a document naming it (AWS NitroTPM;
// identity/nitrotpm). Those kinds check the
// voucher themselves and then verify the quote, the event log and the boot
// state exactly as Verify does, with the functions below.

// AK is an attestation key's public area, checked as Challenge checks one
// (parseAKPublic).
type AK struct {
	k *akKey
}

// ParseAK reads a TPMT_PUBLIC, bare or in its TPM2B size, and checks that
// it is an attestation key: a restricted signing key with fixedTPM,
// fixedParent, sensitiveDataOrigin, not decrypt, RSA >= 2048 or NIST
// P-256+, a SHA-256+ scheme (MalformedEvidence, AKAttributes, AKInvalid).
func ParseAK(public []byte) (*AK, error) {
	if len(public) > maxStructure {
		return nil, attest.Deny(attest.ReasonMalformed, "AK public area of %d bytes exceeds %d", len(public), maxStructure)
	}
	k, err := parseAKPublic(unTPM2B(public))
	if err != nil {
		return nil, err
	}
	if err := k.computeName(); err != nil {
		return nil, err
	}
	return &AK{k: k}, nil
}

// PublicKey is the AK's public key (*rsa.PublicKey or *ecdsa.PublicKey).
func (a *AK) PublicKey() crypto.PublicKey { return a.k.key }

// PKIX is the AK's public key as PKIX DER (SubjectPublicKeyInfo): one
// encoding for one key, so two keys are equal when these bytes are.
func (a *AK) PKIX() ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(a.k.key)
	if err != nil {
		return nil, attest.Deny(attest.ReasonAKInvalid, "the AK's public key has no PKIX encoding")
	}
	return der, nil
}

// Name is the AK's TPM name, hex.
func (a *AK) Name() string { return a.k.nameHex }

// CertifiedBy checks that cert certifies this AK: the certificate's
// public key and the AK public area's, both as PKIX DER, are equal in
// constant time (AKCertificateKeyMismatch). A quote is then verified with
// the AK public area, so a quote by any other key fails.
func (a *AK) CertifiedBy(cert *x509.Certificate) error {
	akDER, err := a.PKIX()
	if err != nil {
		return err
	}
	certDER, err := x509.MarshalPKIXPublicKey(cert.PublicKey)
	if err != nil || !attest.Equal(akDER, certDER) {
		return attest.Deny(attest.ReasonAKCertKeyMismatch, "the AK certificate certifies another key than the AK the quote is verified with")
	}
	return nil
}

// QuoteEvidence is what a node sends to prove its boot with a vouched-for
// AK: the quotes, the PCR values and the event log, as in Evidence.
type QuoteEvidence struct {
	// KubeletKeySHA256 is the hash of the kubelet public key the node bound
	// into the quote (it must be the session's).
	KubeletKeySHA256 []byte `json:"kubeletKeySHA256"`
	// Quotes are one quote per bank the node quoted (or one quote of
	// several banks).
	Quotes []Quote `json:"quotes"`
	PCRs   []PCR   `json:"pcrs"`
	// EventLog is the TCG PC Client event log (binary_bios_measurements).
	EventLog []byte `json:"eventLog,omitempty"`
}

// QuoteOptions say which bank a quote must select and what it must cover.
type QuoteOptions struct {
	// Banks are the banks accepted, preferred first; the quote whose
	// selection has the first is used, and the log replays on it. Nil
	// means SHA-256, else SHA-1 (as Verify).
	Banks []crypto.Hash
	// RequiredPCRs the chosen bank must cover. Nil means 0-9 (as Verify).
	RequiredPCRs []int
}

// CheckRequiredPCRs is every TPM kind's NewVerifier check of its
// Options.RequiredPCRs: each names a PCR, 0-23. The error names pkg, the
// kind's package ("gcevtpm: required PCR 24 out of range").
func CheckRequiredPCRs(pkg string, pcrs []int) error {
	for _, i := range pcrs {
		if i < 0 || i > 23 {
			return fmt.Errorf("%s: required PCR %d out of range", pkg, i)
		}
	}
	return nil
}

// QuoteResult is what a verified quote establishes.
type QuoteResult struct {
	q *quoteResult
}

// Bank is the bank the quote was verified on and the log replays on.
func (r *QuoteResult) Bank() crypto.Hash { return r.q.bank }

// PCRs are the quoted values of bank h, by index (nil when the quote does
// not select h). The caller must not modify them.
func (r *QuoteResult) PCRs(h crypto.Hash) map[int][]byte { return r.q.banks[h] }

// VerifyQuote checks a quote by ak for the session: Verify's checks 2 and
// 4 to 6, with o's banks and required PCRs:
//   - sizes of every field (MalformedEvidence; an event log over
//     MaxEventLogSize: EventLogMalformed);
//   - the first quote that selects the most preferred of o.Banks is used
//     (SHA256BankMissing when none; a quote that does not decode:
//     MalformedEvidence or QuoteNotTPMGenerated);
//   - the quote (verifyQuote): ak's signature (QuoteSignature),
//     TPM_GENERATED and quote type (QuoteNotTPMGenerated), qualifying data
//     = attest.BindingDigest(session nonce, ev.KubeletKeySHA256)
//     (QuoteBindingMismatch, QuoteQualifyingDataRawNonce,
//     QuoteKubeletKeyHashMissing), the chosen bank covers RequiredPCRs
//     (QuotePCRSelection), the values of every selected bank match the
//     quoted digest (QuotePCRDigestMismatch);
//   - the kubelet key hash the quote binds is the session's, in constant
//     time (KubeletKeyMismatch).
//
// The caller checks the session's kind and expiry, and what vouches for ak.
func VerifyQuote(ak *AK, sess *attest.Session, ev *QuoteEvidence, o QuoteOptions) (*QuoteResult, error) {
	if ak == nil || sess == nil {
		return nil, attest.Deny(attest.ReasonSessionInvalid, "no AK or no session")
	}
	if err := checkEvidenceSizes(&Evidence{Quotes: ev.Quotes, PCRs: ev.PCRs, EventLog: ev.EventLog}); err != nil {
		return nil, err
	}
	banks := o.Banks
	if banks == nil {
		banks = defaultBanks
	}
	required := o.RequiredPCRs
	if required == nil {
		required = []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	}
	q, err := pickQuote(ev.Quotes, banks)
	if err != nil {
		return nil, err
	}
	binding := attest.BindingDigest(sess.Nonce, ev.KubeletKeySHA256)
	qr, err := verifyQuote(ak.k, q, ev.PCRs, binding, sess.Nonce, required, banks)
	if err != nil {
		return nil, err
	}
	if !attest.Equal(ev.KubeletKeySHA256, sess.KubeletKeySHA256) {
		return nil, attest.Deny(attest.ReasonKubeletKey, "the quote binds a kubelet key other than the one this session was opened for")
	}
	return &QuoteResult{q: qr}, nil
}

// ReplayBoot is Verify's checks 7 and 8 on a verified quote: the event log
// parses (EventLogMalformed) and replays to the quoted values of the
// quote's bank (EventLogReplayMismatch), and the boot state is read from
// the replayed events as the boot's sequence (bootState, each refusal with
// its reason). The caller wraps a refusal in an *attest.Identified once
// the identity is proven.
func (r *QuoteResult) ReplayBoot(eventLog []byte) (attest.BootState, error) {
	events, phases, err := replayLog(eventLog, r.q.bank, r.q.pcrs)
	if err != nil {
		return attest.BootState{}, err
	}
	bs, err := bootState(events, r.q.bank)
	bs.SystemdPhases = phases
	return bs, err
}

// IdentifiedClaims is what a vouched-for kind's Verify ends with, once
// identity is proven: ReplayBoot of eventLog, a refusal wrapped in an
// *attest.Identified naming identity (a re-attestation records it as the
// node's failure), and the Claims of ak and the boot with EKTrust ekTrust
// (what vouched for the AK).
func (r *QuoteResult) IdentifiedClaims(ak *AK, eventLog []byte, identity, ekTrust string) (*attest.TPMClaims, error) {
	boot, err := r.ReplayBoot(eventLog)
	if err != nil {
		return nil, &attest.Identified{Identity: identity, Err: err}
	}
	tc := r.Claims(ak, boot)
	tc.EKTrust = ekTrust
	return tc, nil
}

// Claims are the TPM claims of a verified quote and boot: the AK's name,
// the bank, the quoted PCRs of the bank (hex), the clock and the boot.
// The EK fields are empty: no EK took part.
func (r *QuoteResult) Claims(ak *AK, boot attest.BootState) *attest.TPMClaims {
	pcrs := make(map[int]string, len(r.q.pcrs))
	for i, d := range r.q.pcrs {
		pcrs[i] = hex.EncodeToString(d)
	}
	return &attest.TPMClaims{
		AKName: ak.Name(), PCRBank: bankName(r.q.bank), PCRs: pcrs, Boot: boot,
		ResetCount: r.q.clock.ResetCount, RestartCount: r.q.clock.RestartCount, Clock: r.q.clock.Clock,
	}
}

// BankName names a PCR bank as the wire format does ("sha256", "sha384").
func BankName(h crypto.Hash) string { return bankName(h) }

// QuoteAll is the node side of a vouched-for AK: it quotes PCRs 0-23 of
// bank with ak and qualifying data attest.BindingDigest(nonce,
// kubeletKeySHA256), and returns the quote, the PCR values it covers and
// the event log log returns.
func QuoteAll(ak *client.Key, bank crypto.Hash, nonce, kubeletKeySHA256 []byte, log func() ([]byte, error)) (*QuoteEvidence, error) {
	alg, ok := map[crypto.Hash]legacy.Algorithm{crypto.SHA256: legacy.AlgSHA256, crypto.SHA384: legacy.AlgSHA384}[bank]
	if !ok {
		return nil, fmt.Errorf("tpm: bank %v: want SHA-256 or SHA-384", bank)
	}
	sel := legacy.PCRSelection{Hash: alg}
	for i := 0; i < 24; i++ {
		sel.PCRs = append(sel.PCRs, i)
	}
	q, err := ak.Quote(sel, attest.BindingDigest(nonce, kubeletKeySHA256))
	if err != nil {
		return nil, fmt.Errorf("quote: %w", err)
	}
	ev := &QuoteEvidence{KubeletKeySHA256: kubeletKeySHA256, Quotes: []Quote{{Quote: q.GetQuote(), Signature: q.GetRawSig()}}}
	for i := 0; i < 24; i++ {
		d, ok := q.GetPcrs().GetPcrs()[uint32(i)]
		if !ok {
			return nil, fmt.Errorf("quote: PCR %d missing", i)
		}
		ev.PCRs = append(ev.PCRs, PCR{Index: i, Bank: bankName(bank), Digest: d})
	}
	if ev.EventLog, err = log(); err != nil {
		return nil, fmt.Errorf("read event log: %w", err)
	}
	return ev, nil
}
