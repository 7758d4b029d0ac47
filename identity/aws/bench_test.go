package aws_test

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/asn1"
	"encoding/base64"
	"testing"

	"github.com/smallstep/pkcs7"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
)

// benchEvidence is a document signed as AWS signs it, and its verifier.
func benchEvidence(b *testing.B) (*aws.Verifier, *attest.Session, *aws.Evidence, *awstest.Region) {
	r := fuzzRegion(b)
	v, sess := fuzzVerifier(b, r)
	der, err := r.Sign(doc().JSON())
	if err != nil {
		b.Fatal(err)
	}
	return v, sess, &aws.Evidence{Document: doc().JSON(), PKCS7: awstest.Base64Lines(der)}, r
}

// BenchmarkVerify is a whole Verify (no live check): base64, PKCS#7 parse,
// JSON, signature, fields, freshness, claims.
func BenchmarkVerify(b *testing.B) {
	v, sess, ev, _ := benchEvidence(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(ctx, sess, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRSAVerifyFloor is the floor under BenchmarkVerify: the one RSA
// verification of the same signature (over the same signed attributes,
// hashed once outside the loop), which no verifier can skip.
func BenchmarkRSAVerifyFloor(b *testing.B) {
	_, _, ev, r := benchEvidence(b)
	der, err := base64.StdEncoding.DecodeString(stripNewlines(ev.PKCS7))
	if err != nil {
		b.Fatal(err)
	}
	p7, err := pkcs7.Parse(der)
	if err != nil {
		b.Fatal(err)
	}
	signer := p7.Signers[0]
	// The signature covers the DER SET OF the signed attributes: the
	// SEQUENCE OF encoding with its tag changed to SET (they are already
	// in DER order).
	attrs, err := asn1.Marshal(signer.AuthenticatedAttributes)
	if err != nil {
		b.Fatal(err)
	}
	attrs[0] = 0x31
	digest := sha256.Sum256(attrs)
	pub := &r.Key.PublicKey
	if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], signer.EncryptedDigest); err != nil {
		b.Fatalf("floor does not verify the same signature: %v", err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], signer.EncryptedDigest); err != nil {
			b.Fatal(err)
		}
	}
}

func stripNewlines(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '\n' {
			out = append(out, s[i])
		}
	}
	return string(out)
}
