package nitrotpm_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"testing"
)

// BenchmarkVerify is one whole NitroTPM verification of evidence the
// collector made through the fake NSM: the COSE_Sign1 document (ES384)
// and its chain of four P-384 signatures (as AWS's: root, regional, zonal,
// instance CA, leaf), the identity document's RSA-2048 PKCS#7, the ECC
// P-256 quote of the SHA-384 bank, the PCR comparison, and the replay of
// a real event log in SHA-384. Its crypto floor, in the same run: five
// BenchmarkECDSAP384VerifyFloor, one BenchmarkECDSAP256VerifyFloor and one
// BenchmarkRSAVerifyFloor (make bench-cloud).
func BenchmarkVerify(b *testing.B) {
	w := newWorld(b)
	v := w.verifier(b, nil)
	sess, ev := w.attestation(b, v, w.nsm)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, sess, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkECDSAP384VerifyFloor: one ECDSA P-384 verification with its
// SHA-384 (the document's signature and each certificate's).
func BenchmarkECDSAP384VerifyFloor(b *testing.B) {
	benchECDSA(b, elliptic.P384(), func(m []byte) []byte { s := sha512.Sum384(m); return s[:] })
}

// BenchmarkECDSAP256VerifyFloor: one ECDSA P-256 verification with its
// SHA-256 (the quote's).
func BenchmarkECDSAP256VerifyFloor(b *testing.B) {
	benchECDSA(b, elliptic.P256(), func(m []byte) []byte { s := sha256.Sum256(m); return s[:] })
}

func benchECDSA(b *testing.B, c elliptic.Curve, h func([]byte) []byte) {
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	msg := make([]byte, 512)
	sig, err := ecdsa.SignASN1(rand.Reader, k, h(msg))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if !ecdsa.VerifyASN1(&k.PublicKey, h(msg), sig) {
			b.Fatal("does not verify")
		}
	}
}

// BenchmarkRSAVerifyFloor: one RSA-2048 PKCS#1 v1.5 verification with its
// SHA-256 (the identity document's).
func BenchmarkRSAVerifyFloor(b *testing.B) {
	w := newWorld(b)
	msg := make([]byte, 512)
	d := sha256.Sum256(msg)
	sig, err := rsa.SignPKCS1v15(rand.Reader, w.region.Key, crypto.SHA256, d[:])
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		d := sha256.Sum256(msg)
		if err := rsa.VerifyPKCS1v15(&w.region.Key.PublicKey, crypto.SHA256, d[:], sig); err != nil {
			b.Fatal(err)
		}
	}
}
