package tpmtest

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"os"
	"testing"

	"github.com/nodeproof/nodeproof/pemcert"
)

// ReadCert reads the one certificate of the PEM file at path (a shipped
// root or intermediate, a real AK certificate kept as data), failing t
// when it is not exactly one.
func ReadCert(t testing.TB, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pemcert.Parse(b)
	if err != nil || len(certs) != 1 {
		t.Fatalf("%s: %v (%d certificates)", path, err, len(certs))
	}
	return certs[0]
}

// VerifyRSASignatures checks, for each pair, the first certificate's
// RSA PKCS#1 v1.5 SHA-256 signature by the second's key, with the SHA-256
// of its TBS: the crypto floor of a chain's verification, as the cloud
// kinds' benchmarks measure it.
func VerifyRSASignatures(pairs [][2]*x509.Certificate) error {
	for _, p := range pairs {
		h := sha256.Sum256(p[0].RawTBSCertificate)
		pub, ok := p[1].PublicKey.(*rsa.PublicKey)
		if !ok {
			return fmt.Errorf("%q has no RSA key", p[1].Subject)
		}
		if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, h[:], p[0].Signature); err != nil {
			return fmt.Errorf("%q by %q: %w", p[0].Subject, p[1].Subject, err)
		}
	}
	return nil
}
