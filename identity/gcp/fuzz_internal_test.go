package gcp

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/nodeproof/nodeproof/attest"
)

// FuzzVerifyClaims fuzzes what Verify reads after the signature passed
// (checks 6 to 10), without signing each input: the same function Verify
// calls, fed the payload directly. FuzzVerifyToken covers what comes
// before.
func FuzzVerifyClaims(f *testing.F) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	v, err := NewVerifier(Options{Keys: StaticKeys{}, AudiencePrefix: "https://api-int.example.com:22623", Clock: func() time.Time { return now }})
	if err != nil {
		f.Fatal(err)
	}
	kh := sha256.Sum256([]byte("fuzz kubelet key"))
	sess := &attest.Session{Kind: attest.KindGCP, Nonce: bytes.Repeat([]byte{7}, 32), KubeletKeySHA256: kh[:], IssuedAt: now, Expires: now.Add(time.Minute)}
	aud := v.audienceFor(sess.Nonce, sess.KubeletKeySHA256)
	valid := map[string]any{
		"iss": Issuer, "aud": aud, "iat": now.Unix(), "exp": now.Unix() + 3600, "email": "sa@example.iam.gserviceaccount.com",
		"google": map[string]any{"compute_engine": map[string]any{
			"project_id": "nodeproof-test", "project_number": 123456789012, "zone": "us-central1-a",
			"instance_id": "4567890123456789012", "instance_name": "worker-0", "instance_creation_timestamp": now.Unix() - 600,
			"license_id": []string{"1"},
		}},
	}
	b, _ := json.Marshal(valid)
	if _, err := v.claims(b, sess, now); err != nil {
		f.Fatalf("the valid seed is refused: %v", err)
	}
	f.Add(b)
	f.Add([]byte(`{"iss":"https://accounts.google.com","aud":["` + aud + `"],"exp":1e99,"iat":-1,"google":{"compute_engine":null}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		c, err := v.claims(payload, sess, now)
		if err != nil {
			if _, ok := attest.ReasonOf(err); !ok || c != nil {
				t.Fatalf("untyped error or claims with an error: %v", err)
			}
			return
		}
		if c.Kind != attest.KindGCP || c.Instance == nil || !bytes.Equal(c.KubeletKeySHA256, sess.KubeletKeySHA256) ||
			!isLabel(c.NodeName) || c.NodeName != c.Instance.Name || !isLabel(c.Instance.Location) || !isProjectID(c.Instance.Account) ||
			c.Identity != "gcp:"+c.Instance.AccountNumber+"/"+c.Instance.Location+"/"+c.Instance.ID || strings.Count(c.Identity, "/") != 2 {
			t.Fatalf("bad claims: %+v", c)
		}
	})
}

// FuzzJWKS feeds the answer of Google's JWKS endpoint (a network peer,
// even over TLS: a proxy, a captive portal) to the key source's parser and
// cache rule: the document, its Cache-Control and its Age. Seeds are JWKS
// documents as Google serves them (two RS256 signing keys) and their
// headers. Properties: the keys taken are public RSA keys of 2048-8192
// bits with an odd exponent >= 3, under a non-empty key ID of bounded
// length, at most 32 of them, and a document without one is an error; the
// cache lifetime is between 0 and 24 hours.
func FuzzJWKS(f *testing.F) {
	var set jose.JSONWebKeySet
	for _, id := range []string{"a1b2c3", "d4e5f6"} {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			f.Fatal(err)
		}
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: &k.PublicKey, KeyID: id, Algorithm: string(jose.RS256), Use: "sig"})
	}
	doc, err := json.Marshal(set)
	if err != nil {
		f.Fatal(err)
	}
	if keys, err := ParseJWKS(doc); err != nil || len(keys) != 2 {
		f.Fatalf("the seed JWKS gives %d keys: %v", len(keys), err)
	}
	f.Add(doc, "public, max-age=20661, must-revalidate, no-transform", "120")
	f.Add(doc, "no-store", "")
	f.Add([]byte(`{"keys":[{"kty":"RSA","kid":"x","n":"AQAB","e":"AQAB"},{"kty":"EC","crv":"P-256","x":"","y":""}]}`), "max-age=-1", "-5")
	f.Add([]byte(`{"keys":[]}`), "max-age=99999999999999999999", "99999999999999999999")
	f.Fuzz(func(t *testing.T, doc []byte, cacheControl, age string) {
		keys, err := ParseJWKS(doc)
		if err == nil && (len(keys) == 0 || len(keys) > maxJWKSKeys) {
			t.Fatalf("%d keys", len(keys))
		}
		for id, k := range keys {
			if id == "" || len(id) > maxClaimString || k == nil || k.N.BitLen() < minRSABits || k.N.BitLen() > maxRSABits || k.E < 3 || k.E%2 == 0 {
				t.Fatalf("took key %q", id)
			}
		}
		h := http.Header{}
		h.Set("Cache-Control", cacheControl)
		h.Set("Age", age)
		if ttl := cacheTTL(h); ttl < 0 || ttl > maxKeyTTL {
			t.Fatalf("Cache-Control %q, Age %q: cached for %v", cacheControl, age, ttl)
		}
	})
}
