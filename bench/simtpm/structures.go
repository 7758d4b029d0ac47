package simtpm

import (
	"crypto/sha256"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"

	legacy "github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpm2"
)

// TPM structures, marshalled with go-tpm's tpm2 package.

const (
	numPCRs = 24
	// maxData is the largest TPM2B_DATA: sizeof(TPMT_HA) in a TPM with
	// SHA-512 (libtpms).
	maxData = 2 + 64
)

// ekTemplate is the TCG EK Credential Profile's default RSA-2048 EK
// template (go-tpm's RSAEKTemplate, go-attestation's defaultRSAEKTemplate)
// with the modulus a TPM fills in.
func ekTemplate(modulus []byte) tpm2.TPMTPublic {
	pub := tpm2.RSAEKTemplate
	pub.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgRSA, &tpm2.TPM2BPublicKeyRSA{Buffer: modulus})
	return pub
}

// srkTemplate is go-attestation's defaultECCSRKTemplate (storage-default
// attributes plus noDA, AES-128-CFB, NIST P-256, no scheme or KDF), the
// parent attest/tpm.Collector makes its AK under, with a unique point.
func srkTemplate(x, y []byte) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgECC,
		NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true,
			UserWithAuth: true, NoDA: true, Restricted: true, Decrypt: true,
		},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{
				Algorithm: tpm2.TPMAlgAES,
				KeyBits:   tpm2.NewTPMUSymKeyBits(tpm2.TPMAlgAES, tpm2.TPMKeyBits(128)),
				Mode:      tpm2.NewTPMUSymMode(tpm2.TPMAlgAES, tpm2.TPMAlgCFB),
			},
			Scheme:  tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgNull},
			CurveID: tpm2.TPMECCNistP256,
			KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{X: tpm2.TPM2BECCParameter{Buffer: x}, Y: tpm2.TPM2BECCParameter{Buffer: y}}),
	}
}

// akTemplate is go-attestation's akTemplateECC (FlagSignerDefault |
// FlagNoDA: fixedTPM, fixedParent, sensitiveDataOrigin, userWithAuth,
// noDA, restricted, sign; ECDSA with SHA-256 on NIST P-256; no symmetric
// algorithm or KDF) with the public point a TPM fills in.
func akTemplate(x, y []byte) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgECC,
		NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true,
			UserWithAuth: true, NoDA: true, Restricted: true, SignEncrypt: true,
		},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
			Scheme: tpm2.TPMTECCScheme{
				Scheme:  tpm2.TPMAlgECDSA,
				Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256}),
			},
			CurveID: tpm2.TPMECCNistP256,
			KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: x},
			Y: tpm2.TPM2BECCParameter{Buffer: y},
		}),
	}
}

// objectName is an object's Name: nameAlg || H_nameAlg(TPMT_PUBLIC).
func objectName(pub tpm2.TPMTPublic) ([]byte, error) {
	n, err := tpm2.ObjectName(&pub)
	if err != nil {
		return nil, fmt.Errorf("simtpm: object name: %w", err)
	}
	return n.Buffer, nil
}

// qualifiedName is QN(B) = nameAlg_B || H_nameAlg_B(QN(A) || Name(B))
// (Part 1, 16.6), for objects with a SHA-256 name algorithm. A
// hierarchy's QN is its handle.
func qualifiedName(parentQN, name []byte) []byte {
	h := sha256.New()
	h.Write(parentQN)
	h.Write(name)
	return h.Sum([]byte{byte(tpm2.TPMAlgSHA256 >> 8), byte(tpm2.TPMAlgSHA256)})
}

// emptyDigest is SHA-256 of nothing: the PCR digest of an empty selection.
var emptyDigest = sha256.Sum256(nil)

// creationData is the TPMS_CREATION_DATA of TPM2_Create under the SRK at
// locality 0 with no creation PCRs and no outside info (go-attestation's
// NewAK). A TPM digests the empty PCR selection too (libtpms does).
func creationData(parentName, parentQN []byte) tpm2.TPMSCreationData {
	return tpm2.TPMSCreationData{
		PCRSelect:           tpm2.TPMLPCRSelection{},
		PCRDigest:           tpm2.TPM2BDigest{Buffer: emptyDigest[:]},
		Locality:            tpm2.TPMALocality{TPMLocZero: true},
		ParentNameAlg:       tpm2.TPMAlgSHA256,
		ParentName:          tpm2.TPM2BName{Buffer: parentName},
		ParentQualifiedName: tpm2.TPM2BName{Buffer: parentQN},
		OutsideInfo:         tpm2.TPM2BData{},
	}
}

// pcrSelection selects PCRs 0-23 of one bank, the 3-byte bitmap
// go-attestation sends and the TPM echoes in the quote.
func pcrSelection(bank tpm2.TPMAlgID) tpm2.TPMLPCRSelection {
	return tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{
		{Hash: bank, PCRSelect: []byte{0xff, 0xff, 0xff}},
	}}
}

// tpmSignature is an ECDSA/SHA-256 TPMT_SIGNATURE as a TPM emits it: r and
// s each padded to the curve's size.
func tpmSignature(r, s []byte) tpm2.TPMTSignature {
	return tpm2.TPMTSignature{
		SigAlg: tpm2.TPMAlgECDSA,
		Signature: tpm2.NewTPMUSignature(tpm2.TPMAlgECDSA, &tpm2.TPMSSignatureECC{
			Hash:       tpm2.TPMAlgSHA256,
			SignatureR: tpm2.TPM2BECCParameter{Buffer: r},
			SignatureS: tpm2.TPM2BECCParameter{Buffer: s},
		}),
	}
}

// goAttestationSignature is the TPMT_SIGNATURE of a quote as
// go-attestation returns it: decoded by go-tpm's legacy tpm2 into big
// integers and encoded again, so r and s lose any leading zero bytes.
func goAttestationSignature(r, s []byte) ([]byte, error) {
	sig := legacy.Signature{Alg: legacy.AlgECDSA, ECC: &legacy.SignatureECC{
		HashAlg: legacy.AlgSHA256, R: new(big.Int).SetBytes(r), S: new(big.Int).SetBytes(s),
	}}
	return sig.Encode()
}

// parseASN1Signature returns an ASN.1 ECDSA P-256 signature's r and s,
// each as 32 bytes.
func parseASN1Signature(der []byte) (r, s []byte, err error) {
	var sig struct{ R, S *big.Int }
	rest, err := asn1.Unmarshal(der, &sig)
	if err != nil || len(rest) != 0 || sig.R == nil || sig.S == nil || sig.R.Sign() <= 0 || sig.S.Sign() <= 0 {
		return nil, nil, errors.New("simtpm: malformed ECDSA signature")
	}
	return sig.R.FillBytes(make([]byte, 32)), sig.S.FillBytes(make([]byte, 32)), nil
}
