package azuretpm_test

import (
	"context"
	"crypto/x509"
	"testing"

	"github.com/nodeproof/nodeproof/identity/azuretpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// BenchmarkVerify is one whole Azure vTPM verification of evidence a
// swtpm made as an Azure vTPM: the AK certificate's chain (two RSA-2048
// signatures), the attested document (its PKCS#7 signature and its
// signer's chain: three RSA-2048 signatures), the RSA-2048 quote, and the
// replay of a real UEFI event log with the boot state read from it.
// BenchmarkRSAVerifyFloor is its crypto floor, in the same run.
func BenchmarkVerify(b *testing.B) {
	w := newWorld(b)
	v := w.verifier(b, azuretpm.Options{})
	sess, ev := w.attestation(b, v, w.vm)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, sess, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRSAVerifyFloor: the six RSA-2048 PKCS#1 v1.5 verifications
// Verify costs, with their SHA-256: the AK certificate's chain (leaf and
// intermediate), the document signer's chain (signer and intermediate),
// the document's signature and the quote's (stood in for by certificate
// signatures of the same size).
func BenchmarkRSAVerifyFloor(b *testing.B) {
	w := newWorld(b)
	v := w.verifier(b, azuretpm.Options{})
	_, ev := w.attestation(b, v, w.vm)
	leaf, err := x509.ParseCertificate(ev.AKCertificate)
	if err != nil {
		b.Fatal(err)
	}
	pairs := [][2]*x509.Certificate{
		{leaf, w.ca.Intermediate}, {w.ca.Intermediate, w.ca.Root},
		{w.imca.Signer, w.imca.Intermediate}, {w.imca.Intermediate, w.imca.Root},
		{leaf, w.ca.Intermediate}, {w.imca.Signer, w.imca.Intermediate},
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := tpmtest.VerifyRSASignatures(pairs); err != nil {
			b.Fatal(err)
		}
	}
}
