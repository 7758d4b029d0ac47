package gcp_test

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/identity/gcp"
)

// BenchmarkVerify is a whole Verify of a full-format token with static
// keys: JWS parsing, RS256, claims.
func BenchmarkVerify(b *testing.B) {
	e := newEnv(b, nil)
	ev := &gcp.Evidence{Token: e.srv.Mint(b, e.ch.Audience)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.v.Verify(ctx, e.sess, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRSAVerifyFloor is the floor under BenchmarkVerify: SHA-256 of
// the same signing input and rsa.VerifyPKCS1v15 of the same signature.
func BenchmarkRSAVerifyFloor(b *testing.B) {
	e := newEnv(b, nil)
	tok := e.srv.Mint(b, e.ch.Audience)
	i := strings.LastIndexByte(tok, '.')
	input := tok[:i]
	sig, err := base64.RawURLEncoding.DecodeString(tok[i+1:])
	if err != nil {
		b.Fatal(err)
	}
	pub := e.srv.Key().Public()
	b.ReportAllocs()
	for b.Loop() {
		h := sha256.Sum256([]byte(input))
		if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, h[:], sig); err != nil {
			b.Fatal(err)
		}
	}
}
