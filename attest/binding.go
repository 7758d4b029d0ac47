package attest

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
)

// BindingLabel starts every binding digest, so that a quote or token made
// for nodeproof cannot be mistaken for one made for another protocol.
const BindingLabel = "nodeproof/v1 attestation binding"

// NonceSize is the size of a server nonce in bytes.
const NonceSize = 32

// BindingDigest returns SHA-256(BindingLabel ‖ 0x00 ‖ nonce ‖ kubeletKeySHA256).
// It is the qualifying data of a TPM quote and part of a GCP token's
// audience: one piece of evidence serves exactly one session (the nonce) and
// one kubelet key (its hash), so neither a replayed quote nor a swapped key
// passes.
func BindingDigest(nonce, kubeletKeySHA256 []byte) []byte {
	h := sha256.New()
	h.Write([]byte(BindingLabel))
	h.Write([]byte{0})
	h.Write(nonce)
	h.Write(kubeletKeySHA256)
	return h.Sum(nil)
}

// KeySHA256 returns the SHA-256 of a public key's PKIX DER encoding after
// checking that it parses as one. This is the hash that evidence binds and
// that the CSR approver compares against a CSR's key.
func KeySHA256(pkixDER []byte) ([]byte, error) {
	if _, err := x509.ParsePKIXPublicKey(pkixDER); err != nil {
		return nil, Deny(ReasonMalformed, "kubelet public key is not PKIX DER: %v", err)
	}
	sum := sha256.Sum256(pkixDER)
	return sum[:], nil
}

// Equal reports whether a and b are equal, in time that depends only on
// their lengths. Every comparison of a secret or a binding goes through it.
func Equal(a, b []byte) bool {
	return subtle.ConstantTimeCompare(a, b) == 1
}
