package tpm

import (
	"bytes"
	"crypto"
	"crypto/subtle"
	"encoding/binary"

	tpm2 "github.com/google/go-tpm/tpm2"

	"github.com/nodeproof/nodeproof/attest"
)

// quoteResult is what a verified quote establishes.
type quoteResult struct {
	bank crypto.Hash
	pcrs map[int][]byte // quoted PCR values of bank
	// banks are the quoted PCR values of every bank the quote selects.
	banks map[crypto.Hash]map[int][]byte
	// clock is the quote's TPMS_CLOCK_INFO.
	clock tpm2.TPMSClockInfo
}

// bankName names a PCR bank in claims and in the wire format.
func bankName(h crypto.Hash) string {
	switch h {
	case crypto.SHA1:
		return "sha1"
	case crypto.SHA256:
		return "sha256"
	case crypto.SHA384:
		return "sha384"
	}
	return h.String()
}

func bankHash(name string) (crypto.Hash, bool) {
	switch name {
	case "sha1":
		return crypto.SHA1, true
	case "sha256":
		return crypto.SHA256, true
	case "sha384":
		return crypto.SHA384, true
	}
	return 0, false
}

// selection is one bank of a quote's PCR selection, its PCRs ascending.
type selection struct {
	bank crypto.Hash
	pcrs []int
}

// decodeQuote decodes a TPMS_ATTEST that should be a quote, with go-tpm's
// TPM 2.0 structures (which take a selection of several banks, as
// tpm2_quote -l sha1:…+sha256:… makes). It returns the attestation and
// its selection, banks in the quote's order.
func decodeQuote(b []byte, field string) (*tpm2.TPMSAttest, []selection, error) {
	if len(b) < 4 || binary.BigEndian.Uint32(b) != uint32(tpm2.TPMGeneratedValue) {
		return nil, nil, attest.Deny(attest.ReasonQuoteNotTPM, "%s is not TPM_GENERATED", field)
	}
	att, err := tpm2.Unmarshal[tpm2.TPMSAttest](b)
	if err != nil {
		return nil, nil, attest.Deny(attest.ReasonMalformed, "%s is not a TPMS_ATTEST", field)
	}
	if att.Type != tpm2.TPMSTAttestQuote {
		return nil, nil, attest.Deny(attest.ReasonQuoteNotTPM, "%s is not a quote (tag %#x)", field, uint16(att.Type))
	}
	info, err := att.Attested.Quote()
	if err != nil {
		return nil, nil, attest.Deny(attest.ReasonMalformed, "%s holds no quote information", field)
	}
	var sels []selection
	seen := map[crypto.Hash]bool{}
	for _, s := range info.PCRSelect.PCRSelections {
		h, err := s.Hash.Hash()
		if err != nil {
			return nil, nil, attest.Deny(attest.ReasonQuoteSelection, "%s selects a bank of algorithm %#x", field, uint16(s.Hash))
		}
		if seen[h] {
			return nil, nil, attest.Deny(attest.ReasonQuoteSelection, "%s selects the %s bank twice", field, bankName(h))
		}
		seen[h] = true
		sel := selection{bank: h}
		for byteIdx, bits := range s.PCRSelect {
			for bit := 0; bit < 8; bit++ {
				if bits&(1<<bit) != 0 {
					sel.pcrs = append(sel.pcrs, byteIdx*8+bit)
				}
			}
		}
		sels = append(sels, sel)
	}
	return att, sels, nil
}

// verifyQuote checks one TPM2_Quote:
//   - the TPMS_ATTEST starts with TPM_GENERATED_VALUE and is a quote
//     (QuoteNotTPMGenerated), and decodes (MalformedEvidence);
//   - the TPMT_SIGNATURE is the AK's, over the TPMS_ATTEST, with the AK's
//     scheme and hash (QuoteSignature);
//   - its qualifying data (extraData) equals binding, compared in constant
//     time; when it does not, the refusal says what it holds instead, if
//     that is a common mistake (QuoteQualifyingDataRawNonce: the nonce
//     itself; QuoteKubeletKeyHashMissing: the binding without the kubelet
//     key hash) or else QuoteBindingMismatch (another session's nonce, or
//     another key);
//   - its selection names each bank once (QuotePCRSelection), one of them
//     the first of banks it selects — for Verify SHA-256, or when no
//     SHA-256 is selected, SHA-1, which claims mark for policy
//     (SHA256BankMissing when none) — and that bank covers every PCR in
//     required (QuotePCRSelection);
//   - the PCR values sent for every selected bank, in the selection's
//     order (bank by bank, PCRs ascending), hash with the AK's hash to
//     the quoted PCR digest (QuotePCRDigestMismatch; a value missing,
//     sent twice, of the wrong size or not selected is refused too).
//
// nonce and keySHA are the session's, to name the binding mistakes.
func verifyQuote(ak *akKey, q Quote, pcrs []PCR, binding, nonce []byte, required []int, banks []crypto.Hash) (*quoteResult, error) {
	att, sels, err := decodeQuote(q.Quote, "the quote")
	if err != nil {
		return nil, err
	}
	if err := ak.verifySignature(q.Quote, q.Signature); err != nil {
		return nil, attest.Deny(attest.ReasonQuoteSignature, "quote signature: %v", err)
	}
	if subtle.ConstantTimeCompare(att.ExtraData.Buffer, binding) != 1 {
		return nil, bindingMistake(att.ExtraData.Buffer, nonce)
	}
	bank, ok := crypto.Hash(0), false
	for _, want := range banks {
		for _, s := range sels {
			if s.bank == want && !ok {
				bank, ok = want, true
			}
		}
	}
	if !ok {
		return nil, attest.Deny(attest.ReasonNoSHA256Bank, "the quote selects no %s bank", bankNames(banks))
	}
	// Values sent, by bank and index.
	values := map[crypto.Hash]map[int][]byte{}
	selected := map[crypto.Hash]map[int]bool{}
	for _, s := range sels {
		values[s.bank] = map[int][]byte{}
		selected[s.bank] = map[int]bool{}
		for _, i := range s.pcrs {
			selected[s.bank][i] = true
		}
	}
	for _, p := range pcrs {
		h, known := bankHash(p.Bank)
		if !known || selected[h] == nil {
			continue // a bank this quote does not select: another quote's
		}
		if !selected[h][p.Index] {
			return nil, attest.Deny(attest.ReasonQuoteSelection, "PCR %d of the %s bank sent but not quoted", p.Index, p.Bank)
		}
		if _, dup := values[h][p.Index]; dup {
			return nil, attest.Deny(attest.ReasonMalformed, "PCR %d of the %s bank sent twice", p.Index, p.Bank)
		}
		if len(p.Digest) != h.Size() {
			return nil, attest.Deny(attest.ReasonMalformed, "PCR %d of the %s bank has %d bytes", p.Index, p.Bank, len(p.Digest))
		}
		values[h][p.Index] = p.Digest
	}
	for _, i := range required {
		if !selected[bank][i] {
			return nil, attest.Deny(attest.ReasonQuoteSelection, "quote does not cover PCR %d of the %s bank", i, bankName(bank))
		}
	}
	h := ak.hash.New()
	for _, s := range sels {
		for _, i := range s.pcrs {
			v, ok := values[s.bank][i]
			if !ok {
				return nil, attest.Deny(attest.ReasonQuotePCRDigest, "quoted PCR %d of the %s bank has no value", i, bankName(s.bank))
			}
			h.Write(v)
		}
	}
	info, _ := att.Attested.Quote()
	if subtle.ConstantTimeCompare(h.Sum(nil), info.PCRDigest.Buffer) != 1 {
		return nil, attest.Deny(attest.ReasonQuotePCRDigest, "PCR values do not match the quoted digest")
	}
	return &quoteResult{bank: bank, pcrs: values[bank], banks: values, clock: att.ClockInfo}, nil
}

// bindingMistake names what a quote's qualifying data holds instead of the
// binding, when it is a mistake an integrator makes.
func bindingMistake(got, nonce []byte) error {
	switch {
	case bytes.Equal(got, nonce):
		return attest.Deny(attest.ReasonQuoteRawNonce, "the quote's qualifying data is the nonce itself; it must be SHA-256(%q ‖ 0x00 ‖ nonce ‖ SHA-256(kubelet public key, PKIX DER))", attest.BindingLabel)
	case bytes.Equal(got, attest.BindingDigest(nonce, nil)), bytes.Equal(got, attest.BindingDigest(nonce, make([]byte, 32))):
		return attest.Deny(attest.ReasonQuoteKeyMissing, "the quote's qualifying data binds this session's nonce but no kubelet key hash: append SHA-256(kubelet public key, PKIX DER) after the nonce")
	}
	return attest.Deny(attest.ReasonQuoteBinding, "the quote's qualifying data is not this session's binding: another session's nonce, or another kubelet key")
}

// quoteBanks reads the banks a quote selects without verifying it.
func quoteBanks(q Quote) ([]crypto.Hash, error) {
	_, sels, err := decodeQuote(q.Quote, "a quote")
	if err != nil {
		return nil, err
	}
	var out []crypto.Hash
	for _, s := range sels {
		out = append(out, s.bank)
	}
	return out, nil
}
