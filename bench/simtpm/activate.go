package simtpm

import (
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rsa"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// Errors of TPM2_ActivateCredential, named by the response code a TPM
// returns for them.
var (
	// ErrValue: the seed does not decrypt under the EK (TPM_RC_VALUE),
	// e.g. a credential made for another EK.
	ErrValue = errors.New("TPM_RC_VALUE: the secret does not decrypt under the EK")
	// ErrIntegrity: the outer HMAC does not verify (TPM_RC_INTEGRITY),
	// e.g. a credential made for another AK's Name.
	ErrIntegrity = errors.New("TPM_RC_INTEGRITY: the credential's integrity HMAC does not verify")
	// ErrSize: a size in the credential is wrong (TPM_RC_SIZE).
	ErrSize = errors.New("TPM_RC_SIZE: malformed credential")
)

// identityLabel is the OAEP label of a credential's seed: "IDENTITY" with
// its terminating NUL (Part 1, Annex B.10.4).
const identityLabel = "IDENTITY\x00"

// ActivateCredential is TPM2_ActivateCredential with the AK as the
// activated object and the EK as the key, taking the TPM2B_ID_OBJECT and
// TPM2B_ENCRYPTED_SECRET of TPM2_MakeCredential as the server sends them
// (with their size fields, as go-attestation's ActivateCredential takes
// them). It returns the credential (certInfo).
//
// The algorithm is Part 1, 24.4-24.5 (and Part 3, ActivateCredential):
//  1. seed = RSA-OAEP-decrypt(EK, secret, SHA-256 (the EK's nameAlg),
//     label "IDENTITY\0"); at most a digest long.
//  2. The ID object is integrityHMAC (a TPM2B_DIGEST) || encIdentity;
//     HMAC-SHA-256(KDFa(seed, "INTEGRITY", -, -, 256), encIdentity ||
//     AK Name) must equal integrityHMAC.
//  3. encIdentity decrypts with AES-128-CFB (the EK's symmetric
//     algorithm), key KDFa(seed, "STORAGE", AK Name, -, 128), zero IV, to a
//     TPM2B_DIGEST: the credential.
func (m *Machine) ActivateCredential(credential, secret []byte) ([]byte, error) {
	idObject, err := unsized(credential)
	if err != nil {
		return nil, err
	}
	encSeed, err := unsized(secret)
	if err != nil {
		return nil, err
	}
	const nameAlg = crypto.SHA256 // the EK's
	seed, err := rsa.DecryptOAEP(nameAlg.New(), nil, m.ek, encSeed, []byte(identityLabel))
	if err != nil || len(seed) > nameAlg.Size() {
		return nil, ErrValue
	}

	// Unmarshal the TPMS_ID_OBJECT: a sized integrity HMAC, then the
	// encrypted identity (whose size field is inside the encryption).
	if len(idObject) < 2 {
		return nil, ErrSize
	}
	hmacSize := int(binary.BigEndian.Uint16(idObject))
	if hmacSize != nameAlg.Size() || len(idObject) < 2+hmacSize {
		return nil, ErrSize
	}
	integrity, encIdentity := idObject[2:2+hmacSize], idObject[2+hmacSize:]
	mac := hmac.New(nameAlg.New, tpm2.KDFa(nameAlg, seed, "INTEGRITY", nil, nil, nameAlg.Size()*8))
	mac.Write(encIdentity)
	mac.Write(m.akName)
	if !hmac.Equal(mac.Sum(nil), integrity) {
		return nil, ErrIntegrity
	}

	block, err := aes.NewCipher(tpm2.KDFa(nameAlg, seed, "STORAGE", m.akName, nil, 128))
	if err != nil {
		return nil, fmt.Errorf("simtpm: %w", err)
	}
	plain := make([]byte, len(encIdentity))
	cipher.NewCFBDecrypter(block, make([]byte, aes.BlockSize)).XORKeyStream(plain, encIdentity) //nolint:staticcheck // CFB is what the TPM uses
	d, err := tpm2.Unmarshal[tpm2.TPM2BDigest](plain)
	if err != nil || len(d.Buffer) > nameAlg.Size() || 2+len(d.Buffer) != len(plain) {
		return nil, ErrSize
	}
	return d.Buffer, nil
}

// unsized strips a TPM2B's size field as go-attestation does (it drops
// the first two bytes and sends the rest as the command's TPM2B).
func unsized(b []byte) ([]byte, error) {
	if len(b) < 2 {
		return nil, ErrSize
	}
	return b[2:], nil
}
