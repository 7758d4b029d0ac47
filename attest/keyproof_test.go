package attest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"testing"
)

func TestKeyProof(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	_, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	pkix := func(k crypto.Signer) []byte {
		der, err := x509.MarshalPKIXPublicKey(k.Public())
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	sign := func(k crypto.Signer, session string) []byte {
		p, err := SignKeyProof(k, session)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name    string
		pub     []byte
		session string
		proof   []byte
		ok      bool
	}{
		{"ECDSA P-256", pkix(ec), "np1.session-a", sign(ec, "np1.session-a"), true},
		{"RSA", pkix(rk), "np1.session-a", sign(rk, "np1.session-a"), true},
		{"a proof for another session", pkix(ec), "np1.session-b", sign(ec, "np1.session-a"), false},
		{"another key's proof", pkix(ec), "np1.session-a", sign(other, "np1.session-a"), false},
		{"empty proof", pkix(ec), "np1.session-a", nil, false},
		{"garbage key", []byte("not a key"), "np1.session-a", sign(ec, "np1.session-a"), false},
		{"Ed25519 cannot prove", pkix(edPriv), "np1.session-a", []byte{1}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := VerifyKeyProof(tc.pub, tc.session, tc.proof)
			if tc.ok != (err == nil) {
				t.Fatalf("VerifyKeyProof: %v, want ok %v", err, tc.ok)
			}
			if err != nil {
				if r, _ := ReasonOf(err); r != ReasonKeyProof {
					t.Fatalf("reason %q, want %q", r, ReasonKeyProof)
				}
			}
		})
	}
}
