package attest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
)

// keyProofLabel separates kubelet key proofs from every other signature
// the key may make.
const keyProofLabel = "nodeproof/v1 kubelet key proof"

// KeyProofDigest is what a kubelet key proof signs: SHA-256(label ‖ 0 ‖
// session), where session is the sealed session string the server handed
// out with the challenge (unique and unpredictable per challenge, so a
// proof is good for one session only).
func KeyProofDigest(session string) []byte {
	h := sha256.New()
	h.Write([]byte(keyProofLabel))
	h.Write([]byte{0})
	h.Write([]byte(session))
	return h.Sum(nil)
}

// SignKeyProof proves possession of the kubelet private key for session:
// ECDSA (ASN.1) or RSA PKCS #1 v1.5, over KeyProofDigest with SHA-256.
func SignKeyProof(key crypto.Signer, session string) ([]byte, error) {
	return key.Sign(rand.Reader, KeyProofDigest(session), crypto.SHA256)
}

// VerifyKeyProof checks a proof made with SignKeyProof against the
// kubelet public key (PKIX DER) bound into the session: KeyProofInvalid
// unless the key parses as ECDSA or RSA and the signature over session's
// digest verifies.
func VerifyKeyProof(pkixDER []byte, session string, proof []byte) error {
	pub, err := x509.ParsePKIXPublicKey(pkixDER)
	if err != nil {
		return Deny(ReasonKeyProof, "kubelet public key: %v", err)
	}
	d := KeyProofDigest(session)
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if ecdsa.VerifyASN1(k, d, proof) {
			return nil
		}
	case *rsa.PublicKey:
		if rsa.VerifyPKCS1v15(k, crypto.SHA256, d, proof) == nil {
			return nil
		}
	default:
		return Deny(ReasonKeyProof, "kubelet key of type %T cannot prove possession", pub)
	}
	return Deny(ReasonKeyProof, "the kubelet key proof does not verify")
}
