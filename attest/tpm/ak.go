package tpm

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"encoding/hex"
	"fmt"
	"math/big"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/attest"
)

// tpmGeneratedValue is TPM_GENERATED_VALUE: only a TPM writes it at the
// start of a TPMS_ATTEST it signs, and a restricted key refuses to sign data
// that begins with it, so it proves the structure came from the TPM.
const tpmGeneratedValue = 0xff544347

// Minimum AK strength.
const (
	minRSABits = 2048
	minECCBits = 256
)

// akKey is a checked attestation key.
type akKey struct {
	public  tpm2.Public
	key     crypto.PublicKey
	hash    crypto.Hash // the AK's signing scheme hash
	name    tpm2.Name
	nameHex string
}

// parseAKPublic decodes a TPMT_PUBLIC and checks the attributes of an
// attestation key: a restricted signing key, fixedTPM, fixedParent and
// sensitiveDataOrigin, not a decryption key, strong enough, with a signing
// scheme.
func parseAKPublic(public []byte) (*akKey, error) {
	pub, err := tpm2.DecodePublic(public)
	if err != nil {
		return nil, attest.Deny(attest.ReasonMalformed, "tpm.ak.public is not a TPMT_PUBLIC (bare, or in its TPM2B size)")
	}
	const need = tpm2.FlagFixedTPM | tpm2.FlagFixedParent | tpm2.FlagSensitiveDataOrigin | tpm2.FlagRestricted | tpm2.FlagSign
	if pub.Attributes&need != need {
		return nil, attest.Deny(attest.ReasonAKAttributes,
			"AK attributes %#x lack restricted/sign/fixedTPM/fixedParent/sensitiveDataOrigin", uint32(pub.Attributes))
	}
	if pub.Attributes&tpm2.FlagDecrypt != 0 {
		return nil, attest.Deny(attest.ReasonAKAttributes, "AK is also a decryption key")
	}
	ak := &akKey{public: pub}
	switch pub.Type {
	case tpm2.AlgRSA:
		if pub.RSAParameters == nil || pub.RSAParameters.Sign == nil {
			return nil, attest.Deny(attest.ReasonAKInvalid, "RSA AK has no signing scheme")
		}
		if pub.RSAParameters.KeyBits < minRSABits {
			return nil, attest.Deny(attest.ReasonAKAttributes, "RSA AK of %d bits", pub.RSAParameters.KeyBits)
		}
		ak.hash, err = pub.RSAParameters.Sign.Hash.Hash()
	case tpm2.AlgECC:
		if pub.ECCParameters == nil || pub.ECCParameters.Sign == nil {
			return nil, attest.Deny(attest.ReasonAKInvalid, "ECC AK has no signing scheme")
		}
		switch pub.ECCParameters.CurveID {
		case tpm2.CurveNISTP256, tpm2.CurveNISTP384, tpm2.CurveNISTP521:
		default:
			return nil, attest.Deny(attest.ReasonAKAttributes, "ECC AK on curve %#x", pub.ECCParameters.CurveID)
		}
		ak.hash, err = pub.ECCParameters.Sign.Hash.Hash()
	default:
		return nil, attest.Deny(attest.ReasonAKAttributes, "AK of algorithm %#x", pub.Type)
	}
	if err != nil {
		return nil, attest.Deny(attest.ReasonAKInvalid, "the AK's signing scheme names an unknown hash")
	}
	if ak.hash != crypto.SHA256 && ak.hash != crypto.SHA384 && ak.hash != crypto.SHA512 {
		return nil, attest.Deny(attest.ReasonAKAttributes, "AK signs with %v", ak.hash)
	}
	if ak.key, err = pub.Key(); err != nil {
		return nil, attest.Deny(attest.ReasonAKInvalid, "the AK's public key is not usable")
	}
	return ak, nil
}

// computeName computes the AK's TPM name (what the credential is bound to).
func (ak *akKey) computeName() error {
	var err error
	if ak.name, err = ak.public.Name(); err != nil || ak.name.Digest == nil {
		return attest.Deny(attest.ReasonAKInvalid, "the AK's name cannot be computed")
	}
	enc, err := ak.name.Encode()
	if err != nil {
		return attest.Deny(attest.ReasonAKInvalid, "the AK's name cannot be computed")
	}
	ak.nameHex = hex.EncodeToString(enc)
	return nil
}

// checkCreation checks the AK's creation attestation: a TPMS_ATTEST of type
// creation, TPM_GENERATED, naming exactly this AK, whose creation-data
// digest matches the creation data sent, signed by the AK itself.
func (ak *akKey) checkCreation(createData, createAttestation, createSignature []byte) error {
	if _, err := tpm2.DecodeCreationData(createData); err != nil {
		return attest.Deny(attest.ReasonMalformed, "tpm.ak.createData is not a TPMS_CREATION_DATA (bare, or in its TPM2B size)")
	}
	att, err := tpm2.DecodeAttestationData(createAttestation)
	if err != nil {
		return attest.Deny(attest.ReasonMalformed, "tpm.ak.createAttestation is not a TPMS_ATTEST")
	}
	if att.Magic != tpmGeneratedValue {
		return attest.Deny(attest.ReasonAKCreation, "creation attestation is not TPM_GENERATED")
	}
	if att.Type != tpm2.TagAttestCreation || att.AttestedCreationInfo == nil {
		return attest.Deny(attest.ReasonAKCreation, "attestation is not a creation attestation (tag %#x)", att.Type)
	}
	match, err := att.AttestedCreationInfo.Name.MatchesPublic(ak.public)
	if err != nil || !match {
		return attest.Deny(attest.ReasonAKCreation, "creation attestation names another key")
	}
	nameHash, err := ak.public.NameAlg.Hash()
	if err != nil {
		return attest.Deny(attest.ReasonAKCreation, "the AK's name algorithm is unknown")
	}
	h := nameHash.New()
	h.Write(createData)
	if !bytes.Equal(att.AttestedCreationInfo.OpaqueDigest, h.Sum(nil)) {
		return attest.Deny(attest.ReasonAKCreation, "creation data digest differs from the attested one")
	}
	if err := ak.verifySignature(createAttestation, createSignature); err != nil {
		return attest.Deny(attest.ReasonAKCreation, "creation attestation signature: %v", err)
	}
	return nil
}

// verifySignature checks a TPMT_SIGNATURE by the AK over msg, with the
// AK's own hash; the signature's scheme must fit the key.
func (ak *akKey) verifySignature(msg, sigBytes []byte) error {
	sig, err := tpm2.DecodeSignature(bytes.NewBuffer(sigBytes))
	if err != nil {
		return fmt.Errorf("the signature is not a TPMT_SIGNATURE")
	}
	h := ak.hash.New()
	h.Write(msg)
	digest := h.Sum(nil)
	switch pub := ak.key.(type) {
	case *rsa.PublicKey:
		if sig.RSA == nil {
			return fmt.Errorf("not an RSA signature")
		}
		if sh, err := sig.RSA.HashAlg.Hash(); err != nil || sh != ak.hash {
			return fmt.Errorf("signature hash differs from the AK's")
		}
		switch sig.Alg {
		case tpm2.AlgRSASSA:
			return rsa.VerifyPKCS1v15(pub, ak.hash, digest, sig.RSA.Signature)
		case tpm2.AlgRSAPSS:
			return rsa.VerifyPSS(pub, ak.hash, digest, sig.RSA.Signature, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthAuto})
		}
		return fmt.Errorf("RSA signature scheme %#x", sig.Alg)
	case *ecdsa.PublicKey:
		if sig.ECC == nil || sig.Alg != tpm2.AlgECDSA {
			return fmt.Errorf("not an ECDSA signature")
		}
		if sh, err := sig.ECC.HashAlg.Hash(); err != nil || sh != ak.hash {
			return fmt.Errorf("signature hash differs from the AK's")
		}
		if !ecdsa.Verify(pub, digest, new(big.Int).Set(sig.ECC.R), new(big.Int).Set(sig.ECC.S)) {
			return fmt.Errorf("ECDSA signature does not verify")
		}
		return nil
	}
	return fmt.Errorf("AK key type %T", ak.key)
}
