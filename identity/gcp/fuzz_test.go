package gcp_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/gcp"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
)

// fuzzEnv is a verifier and a session with fixed values, so seeds mean the
// same thing on every run. The signing key is made per process: stored
// corpus tokens exercise the refusal paths, the seeds added here the
// accepting one.
func fuzzEnv(f *testing.F) (*env, *attest.Session) {
	e := newEnv(f, nil)
	sess := *e.sess
	sess.Nonce = bytes.Repeat([]byte{7}, 32)
	sess.KubeletKeySHA256 = keySHA("fuzz kubelet key")
	return e, &sess
}

func fuzzAudience(e *env, sess *attest.Session) string {
	return prefix + gcp.AudiencePath + b64(attest.BindingDigest(sess.Nonce, sess.KubeletKeySHA256))
}

// checkOutcome is the property every input must keep: either claims that
// are well-formed and bound to the session, or a typed Denial, never a
// panic or an untyped error.
func checkOutcome(t *testing.T, sess *attest.Session, c *attest.Claims, err error) {
	if err != nil {
		if c != nil {
			t.Fatal("claims with an error")
		}
		if _, ok := attest.ReasonOf(err); !ok {
			t.Fatalf("untyped error: %v", err)
		}
		return
	}
	if c == nil || c.Instance == nil || c.Kind != attest.KindGCP || !bytes.Equal(c.KubeletKeySHA256, sess.KubeletKeySHA256) ||
		c.NodeName == "" || c.NodeName != c.Instance.Name || strings.ContainsAny(c.NodeName, "./ ") ||
		c.Identity != "gcp:"+c.Instance.AccountNumber+"/"+c.Instance.Location+"/"+c.Instance.ID {
		t.Fatalf("bad claims: %+v", c)
	}
}

// FuzzVerifyToken fuzzes the token string through Verify: form, header,
// algorithm, key lookup and signature.
func FuzzVerifyToken(f *testing.F) {
	e, sess := fuzzEnv(f)
	aud := fuzzAudience(e, sess)
	k := e.srv.Key()
	c := e.srv.Claims(aud, true, true)
	valid := e.srv.Sign(f, c)
	if _, err := e.v.Verify(context.Background(), sess, &gcp.Evidence{Token: valid}); err != nil {
		f.Fatalf("the valid seed is refused: %v", err)
	}
	f.Add(valid)
	f.Add(gcptest.SignWith(f, jose.RS512, k.Private, k.ID, c, nil))
	f.Add(gcptest.SignWith(f, jose.HS256, gcptest.JWKS(k), k.ID, c, nil))
	f.Add(gcptest.SignWith(f, jose.RS256, k.Private, k.ID, c, map[string]any{"crit": []string{"b64"}, "b64": false}))
	f.Add(gcptest.Unsigned(f, map[string]any{"alg": "none", "kid": k.ID}, c, nil))
	f.Add(gcptest.Unsigned(f, map[string]any{"alg": "RS256", "kid": k.ID, "jwk": map[string]any{"kty": "RSA"}}, c, []byte{1, 2, 3}))
	f.Add("")
	f.Add("..")
	f.Add("e30.e30.")
	f.Fuzz(func(t *testing.T, tok string) {
		claims, err := e.v.Verify(context.Background(), sess, &gcp.Evidence{Token: tok})
		checkOutcome(t, sess, claims, err)
	})
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
