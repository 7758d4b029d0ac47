package tpm

import (
	"crypto"
	"crypto/subtle"
	"fmt"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/attest"
)

// quoteResult is what a verified quote establishes.
type quoteResult struct {
	bank crypto.Hash
	pcrs map[int][]byte // quoted PCR values of bank
	// clock is the quote's TPMS_CLOCK_INFO.
	clock tpm2.ClockInfo
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

// verifyQuote checks one TPM2_Quote:
//   - the TPMT_SIGNATURE is the AK's, over the TPMS_ATTEST, with the AK's
//     scheme and hash;
//   - the TPMS_ATTEST starts with TPM_GENERATED_VALUE and is a quote;
//   - its qualifying data (extraData) equals binding, compared in
//     constant time;
//   - it selects exactly one bank, and every PCR in required;
//   - the digest of the PCR values sent for the selected PCRs, in
//     selection order, equals the quoted PCR digest; a PCR value sent for
//     that bank but not selected is refused too.
func verifyQuote(ak *akKey, q Quote, pcrs []PCR, binding []byte, required []int) (*quoteResult, error) {
	if err := ak.verifySignature(q.Quote, q.Signature); err != nil {
		return nil, attest.Deny(attest.ReasonQuoteSignature, "quote: %v", err)
	}
	att, err := tpm2.DecodeAttestationData(q.Quote)
	if err != nil {
		return nil, attest.Deny(attest.ReasonMalformed, "quote does not decode: %v", err)
	}
	if att.Magic != tpmGeneratedValue {
		return nil, attest.Deny(attest.ReasonQuoteNotTPM, "quote is not TPM_GENERATED")
	}
	if att.Type != tpm2.TagAttestQuote || att.AttestedQuoteInfo == nil {
		return nil, attest.Deny(attest.ReasonQuoteNotTPM, "attestation is not a quote (tag %#x)", att.Type)
	}
	if subtle.ConstantTimeCompare(att.ExtraData, binding) != 1 {
		return nil, attest.Deny(attest.ReasonQuoteBinding, "quote's qualifying data is not this session's nonce and kubelet key")
	}
	sel := att.AttestedQuoteInfo.PCRSelection
	bank, err := sel.Hash.Hash()
	if err != nil {
		return nil, attest.Deny(attest.ReasonQuoteSelection, "quote bank %#x: %v", sel.Hash, err)
	}
	selected := make(map[int]bool, len(sel.PCRs))
	for _, i := range sel.PCRs {
		selected[i] = true
	}
	for _, i := range required {
		if !selected[i] {
			return nil, attest.Deny(attest.ReasonQuoteSelection, "quote does not cover PCR %d of the %s bank", i, bankName(bank))
		}
	}
	values := make(map[int][]byte, len(sel.PCRs))
	for _, p := range pcrs {
		h, ok := bankHash(p.Bank)
		if !ok || h != bank {
			continue
		}
		if !selected[p.Index] {
			return nil, attest.Deny(attest.ReasonQuoteSelection, "PCR %d sent but not quoted", p.Index)
		}
		if _, dup := values[p.Index]; dup {
			return nil, attest.Deny(attest.ReasonMalformed, "PCR %d sent twice", p.Index)
		}
		if len(p.Digest) != bank.Size() {
			return nil, attest.Deny(attest.ReasonMalformed, "PCR %d value has %d bytes", p.Index, len(p.Digest))
		}
		values[p.Index] = p.Digest
	}
	h := ak.hash.New()
	for _, i := range sel.PCRs {
		v, ok := values[i]
		if !ok {
			return nil, attest.Deny(attest.ReasonQuotePCRDigest, "quoted PCR %d has no value", i)
		}
		h.Write(v)
	}
	if subtle.ConstantTimeCompare(h.Sum(nil), att.AttestedQuoteInfo.PCRDigest) != 1 {
		return nil, attest.Deny(attest.ReasonQuotePCRDigest, "PCR values do not match the quoted digest")
	}
	return &quoteResult{bank: bank, pcrs: values, clock: att.ClockInfo}, nil
}

// quoteBank reads the bank a quote selects without verifying it.
func quoteBank(q Quote) (crypto.Hash, error) {
	att, err := tpm2.DecodeAttestationData(q.Quote)
	if err != nil || att.AttestedQuoteInfo == nil {
		return 0, fmt.Errorf("quote does not decode")
	}
	return att.AttestedQuoteInfo.PCRSelection.Hash.Hash()
}
