package gcevtpm_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// BenchmarkVerify is one whole GCE vTPM verification of evidence a swtpm
// made as a GCE vTPM: the AK certificate's chain (two RSA-2048 signatures:
// intermediate and leaf, as Google's EK/AK CA), the instance extension,
// the ECC P-256 quote, and the replay of a real GCE event log with the
// boot state read from it. BenchmarkRSAVerifyFloor and
// BenchmarkECDSAP256VerifyFloor are its crypto floor, in the same run
// (make bench-cloud).
func BenchmarkVerify(b *testing.B) {
	w := newWorld(b)
	v := w.verifier(b, gcevtpm.Options{})
	sess, ev := attestation(b, v, w.vm)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, sess, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRSAVerifyFloor: the two RSA-2048 PKCS#1 v1.5 verifications the
// chain costs (the AK certificate's signature by the intermediate, the
// intermediate's by the root), with their SHA-256.
func BenchmarkRSAVerifyFloor(b *testing.B) {
	w := newWorld(b)
	v := w.verifier(b, gcevtpm.Options{})
	_, ev := attestation(b, v, w.vm)
	leaf, err := x509.ParseCertificate(ev.AKCertificate)
	if err != nil {
		b.Fatal(err)
	}
	inter, root := w.ca.Intermediate, w.ca.Root
	b.ReportAllocs()
	for b.Loop() {
		if err := tpmtest.VerifyRSASignatures([][2]*x509.Certificate{{leaf, inter}, {inter, root}}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkECDSAP256VerifyFloor: the quote's ECDSA P-256 verification with
// its SHA-256.
func BenchmarkECDSAP256VerifyFloor(b *testing.B) {
	w := newWorld(b)
	v := w.verifier(b, gcevtpm.Options{})
	_, ev := attestation(b, v, w.vm)
	pub, err := tpm2.DecodePublic(ev.AKPublic)
	if err != nil {
		b.Fatal(err)
	}
	key, err := pub.Key()
	if err != nil {
		b.Fatal(err)
	}
	sig, err := tpm2.DecodeSignature(bytes.NewBuffer(ev.Quote.Quotes[0].Signature))
	if err != nil {
		b.Fatal(err)
	}
	q := ev.Quote.Quotes[0].Quote
	b.ReportAllocs()
	for b.Loop() {
		h := sha256.Sum256(q)
		if !ecdsa.Verify(key.(*ecdsa.PublicKey), h[:], sig.ECC.R, sig.ECC.S) {
			b.Fatal("quote signature does not verify")
		}
	}
}
