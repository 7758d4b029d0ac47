package gcp_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/compute/metadata"
	jose "github.com/go-jose/go-jose/v4"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/gcp"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
)

const prefix = "https://api-int.example.com:22623"

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// clock is a settable fixed clock.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) Advance(d time.Duration) { c.now = c.now.Add(d) }

func keySHA(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// env is one server, one verifier and one open session.
type env struct {
	clk  *clock
	srv  *gcptest.Server
	v    *gcp.Verifier
	ch   *gcp.Challenge
	sess *attest.Session
}

var (
	sharedKeyOnce sync.Once
	sharedKey     gcptest.Key
)

func newEnv(t testing.TB, keys func(*gcptest.Server) gcp.KeySource) *env {
	t.Helper()
	sharedKeyOnce.Do(func() { sharedKey = gcptest.NewKey(t) })
	clk := &clock{now: t0}
	srv := gcptest.NewServerWithKey(t, clk.Now, sharedKey)
	var ks gcp.KeySource = gcp.StaticKeys(srv.PublicKeys())
	if keys != nil {
		ks = keys(srv)
	}
	v, err := gcp.NewVerifier(gcp.Options{Keys: ks, AudiencePrefix: prefix, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	ch, sess, err := v.Challenge("worker", keySHA("kubelet key"), &gcp.ChallengeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{clk: clk, srv: srv, v: v, ch: ch, sess: sess}
}

func TestChallenge(t *testing.T) {
	e := newEnv(t, nil)
	s := e.sess
	if s.Kind != attest.KindGCP || s.Pool != "worker" || len(s.Nonce) != 32 || !bytes.Equal(s.KubeletKeySHA256, keySHA("kubelet key")) ||
		!s.IssuedAt.Equal(t0) || !s.Expires.Equal(t0.Add(5*time.Minute)) {
		t.Fatalf("session = %+v", s)
	}
	want := prefix + gcp.AudiencePath + base64.RawURLEncoding.EncodeToString(attest.BindingDigest(s.Nonce, s.KubeletKeySHA256))
	if e.ch.Audience != want {
		t.Fatalf("audience = %q, want %q", e.ch.Audience, want)
	}
	ch2, s2, err := e.v.Challenge("worker", keySHA("kubelet key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(s2.Nonce, s.Nonce) || ch2.Audience == e.ch.Audience {
		t.Fatal("two challenges share a nonce or an audience")
	}
	if _, _, err := e.v.Challenge("worker", []byte("short"), nil); !isReason(err, attest.ReasonMalformed) {
		t.Fatalf("short kubelet key hash: %v", err)
	}
}

func TestNewVerifierOptions(t *testing.T) {
	keys := gcp.StaticKeys{}
	now := func() time.Time { return t0 }
	good := gcp.Options{Keys: keys, AudiencePrefix: prefix, Clock: now}
	if _, err := gcp.NewVerifier(good); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*gcp.Options){
		"no keys":              func(o *gcp.Options) { o.Keys = nil },
		"no clock":             func(o *gcp.Options) { o.Clock = nil },
		"no prefix":            func(o *gcp.Options) { o.AudiencePrefix = "" },
		"http prefix":          func(o *gcp.Options) { o.AudiencePrefix = "http://api-int.example.com:22623" },
		"trailing slash":       func(o *gcp.Options) { o.AudiencePrefix = prefix + "/" },
		"query":                func(o *gcp.Options) { o.AudiencePrefix = prefix + "?x=1" },
		"fragment":             func(o *gcp.Options) { o.AudiencePrefix = prefix + "#x" },
		"credentials":          func(o *gcp.Options) { o.AudiencePrefix = "https://u:p@api-int.example.com" },
		"relative":             func(o *gcp.Options) { o.AudiencePrefix = "api-int.example.com" },
		"skew above 60s":       func(o *gcp.Options) { o.MaxSkew = 61 * time.Second },
		"negative skew":        func(o *gcp.Options) { o.MaxSkew = -time.Second },
		"negative session TTL": func(o *gcp.Options) { o.SessionTTL = -time.Second },
	} {
		o := good
		mut(&o)
		if _, err := gcp.NewVerifier(o); err == nil {
			t.Errorf("%s: NewVerifier accepted %+v", name, o)
		}
	}
}

// collect runs the node side against the loopback metadata server.
func collect(t *testing.T, srv *gcptest.Server, audience string) *gcp.Evidence {
	t.Helper()
	t.Setenv("GCE_METADATA_HOST", srv.Host())
	ev, err := gcp.Collect(context.Background(), metadata.NewClient(&http.Client{Timeout: 5 * time.Second}), audience)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func checkClaims(t *testing.T, e *env, c *attest.Claims) {
	t.Helper()
	inst := e.srv.Instance()
	if c.Kind != attest.KindGCP || c.Identity != "gcp:123456789012/"+inst.Zone+"/"+inst.InstanceID || c.NodeName != inst.InstanceName ||
		!bytes.Equal(c.KubeletKeySHA256, e.sess.KubeletKeySHA256) || !c.VerifiedAt.Equal(e.clk.now) {
		t.Fatalf("claims = %+v", c)
	}
	want := attest.InstanceClaims{
		Cloud: attest.CloudGCP, Account: inst.ProjectID, AccountNumber: "123456789012", Location: inst.Zone, ID: inst.InstanceID,
		Name: inst.InstanceName, Created: inst.Created, ServiceAccount: inst.Email,
	}
	if c.Instance == nil || *c.Instance != want {
		t.Fatalf("GCP claims = %+v, want %+v", c.Instance, want)
	}
	// What kubelet serving CSRs are checked against: the instance name and
	// its zonal internal DNS name, nothing else.
	if wantAddrs := []string{inst.InstanceName, inst.InstanceName + "." + inst.Zone + ".c." + inst.ProjectID + ".internal"}; !slices.Equal(c.Addresses, wantAddrs) {
		t.Fatalf("addresses = %q, want %q", c.Addresses, wantAddrs)
	}
}

// TestRoundTrip: Challenge, Collect through the metadata library from the
// loopback metadata server, Verify.
func TestRoundTrip(t *testing.T) {
	e := newEnv(t, nil)
	ev := collect(t, e.srv, e.ch.Audience)
	if e.srv.IdentityRequests() != 1 {
		t.Fatalf("identity requests = %d", e.srv.IdentityRequests())
	}
	e.clk.Advance(30 * time.Second)
	c, err := e.v.Verify(context.Background(), e.sess, ev)
	if err != nil {
		t.Fatal(err)
	}
	checkClaims(t, e, c)
}

// TestRoundTripJWKS is the round trip with the keys fetched from the JWKS
// endpoint, and a token carrying license IDs.
func TestRoundTripJWKS(t *testing.T) {
	e := newEnv(t, func(s *gcptest.Server) gcp.KeySource {
		src, err := gcp.NewJWKSSource(s.JWKSURL(), nil, func() time.Time { return t0 }, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return src
	})
	t.Setenv("GCE_METADATA_HOST", e.srv.Host())
	tok, err := metadata.NewClient(nil).GetWithContext(context.Background(),
		"instance/service-accounts/default/identity?format=full&licenses=TRUE&audience="+e.ch.Audience)
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.v.Verify(context.Background(), e.sess, &gcp.Evidence{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	checkClaims(t, e, c)
	if e.srv.JWKSFetches() != 1 {
		t.Fatalf("JWKS fetches = %d", e.srv.JWKSFetches())
	}
}

// TestMetadataServerProtocol checks the loopback server behaves as GCE's
// does, so the round trip means something.
func TestMetadataServerProtocol(t *testing.T) {
	srv := gcptest.NewServer(t, func() time.Time { return t0 })
	get := func(path string, hdr map[string]string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL()+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	flavor := map[string]string{"Metadata-Flavor": "Google"}
	id := gcptest.IdentityPath + "?audience=https%3A%2F%2Fx.example&format=full"
	if resp, _ := get(id, nil); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("without Metadata-Flavor: %s", resp.Status)
	}
	if resp, _ := get(id, map[string]string{"Metadata-Flavor": "Google", "X-Forwarded-For": "10.0.0.1"}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("with X-Forwarded-For: %s", resp.Status)
	}
	if resp, _ := get(gcptest.IdentityPath+"?format=full", flavor); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("without audience: %s", resp.Status)
	}
	resp, tok := get(id, flavor)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Metadata-Flavor") != "Google" {
		t.Fatalf("identity: %s, Metadata-Flavor %q", resp.Status, resp.Header.Get("Metadata-Flavor"))
	}
	jws, err := jose.ParseSignedCompact(tok, []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		t.Fatal(err)
	}
	payload, err := jws.Verify(srv.Key().Public())
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	json.Unmarshal(payload, &claims)
	if claims["aud"] != "https://x.example" || claims["google"] == nil || jws.Signatures[0].Header.KeyID != srv.Key().ID {
		t.Fatalf("claims = %v", claims)
	}
	_, std := get(gcptest.IdentityPath+"?audience=https%3A%2F%2Fx.example", flavor)
	jws, _ = jose.ParseSignedCompact(std, []jose.SignatureAlgorithm{jose.RS256})
	payload, _ = jws.Verify(srv.Key().Public())
	if bytes.Contains(payload, []byte("compute_engine")) {
		t.Fatal("standard format carries compute_engine claims")
	}
	resp, body := get(gcptest.JWKSPath, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Cache-Control"), "max-age=") {
		t.Fatalf("JWKS: %s %v", resp.Status, resp.Header)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal([]byte(body), &set); err != nil || len(set.Key(srv.Key().ID)) != 1 {
		t.Fatalf("JWKS body %s: %v", body, err)
	}
}

func TestCollectRefuses(t *testing.T) {
	srv := gcptest.NewServer(t, func() time.Time { return t0 })
	t.Setenv("GCE_METADATA_HOST", srv.Host())
	for name, aud := range map[string]string{
		"empty":     "",
		"http":      "http://x.example/a",
		"space":     "https://x.example/a b",
		"too large": "https://x.example/" + strings.Repeat("a", gcp.MaxAudienceSize),
	} {
		if _, err := gcp.Collect(context.Background(), nil, aud); err == nil {
			t.Errorf("%s audience accepted", name)
		}
	}
	if srv.IdentityRequests() != 0 {
		t.Fatalf("refused audiences reached the metadata server %d times", srv.IdentityRequests())
	}
}

func isReason(err error, r attest.Reason) bool {
	got, ok := attest.ReasonOf(err)
	return ok && got == r
}

// failingKeys is a key source that cannot reach its keys with a plain
// (not Denial) error.
type failingKeys struct{}

func (failingKeys) Key(context.Context, string) (*rsa.PublicKey, error) {
	return nil, errors.New("dial tcp: connection refused")
}

// TestVerifyAttacks: one named case per attack, each refused with its
// own reason (or accepted, for the boundary cases with want "").
func TestVerifyAttacks(t *testing.T) {
	attackerKey := gcptest.NewKey(t)
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	skew := gcp.DefaultMaxSkew
	now := t0.Unix()

	type tc struct {
		name  string
		keys  func(*gcptest.Server) gcp.KeySource
		token func(t *testing.T, e *env) string
		sess  func(e *env) *attest.Session           // nil: e.sess
		want  attest.Reason                          // "": accepted
		check func(*testing.T, *env, *attest.Claims) // for accepted cases; nil: checkClaims
	}
	// claims returns a token with the session's claims changed by mut.
	claims := func(mut func(c map[string]any)) func(*testing.T, *env) string {
		return func(t *testing.T, e *env) string {
			c := e.srv.Claims(e.ch.Audience, true, false)
			mut(c)
			return e.srv.Sign(t, c)
		}
	}
	ce := func(mut func(ce map[string]any)) func(*testing.T, *env) string {
		return claims(func(c map[string]any) { mut(gcptest.ComputeEngine(c)) })
	}
	valid := claims(func(map[string]any) {})
	pubPEM := func(e *env) []byte {
		der, _ := x509.MarshalPKIXPublicKey(e.srv.Key().Public())
		return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	}
	signAlg := func(alg jose.SignatureAlgorithm, key func(e *env) any) func(*testing.T, *env) string {
		return func(t *testing.T, e *env) string {
			return gcptest.SignWith(t, alg, key(e), e.srv.Key().ID, e.srv.Claims(e.ch.Audience, true, false), nil)
		}
	}
	realKey := func(e *env) any { return e.srv.Key().Private }
	header := func(h map[string]any) func(*testing.T, *env) string {
		return func(t *testing.T, e *env) string {
			if _, ok := h["kid"]; !ok {
				h["kid"] = e.srv.Key().ID
			}
			return gcptest.Unsigned(t, h, e.srv.Claims(e.ch.Audience, true, false), []byte("sig"))
		}
	}
	segments := func(f func(h, p, s string) string) func(*testing.T, *env) string {
		return func(t *testing.T, e *env) string {
			parts := strings.Split(valid(t, e), ".")
			return f(parts[0], parts[1], parts[2])
		}
	}
	cases := []tc{
		{name: "valid", token: valid},
		// Algorithm.
		{name: "alg none", want: attest.ReasonTokenAlgorithm, token: func(t *testing.T, e *env) string {
			return gcptest.Unsigned(t, map[string]any{"alg": "none", "kid": e.srv.Key().ID, "typ": "JWT"}, e.srv.Claims(e.ch.Audience, true, false), nil)
		}},
		{name: "alg None", want: attest.ReasonTokenAlgorithm, token: header(map[string]any{"alg": "None"})},
		{name: "alg missing", want: attest.ReasonTokenAlgorithm, token: header(map[string]any{"typ": "JWT"})},
		{name: "alg rs256 lowercase", want: attest.ReasonTokenAlgorithm, token: header(map[string]any{"alg": "rs256"})},
		{name: "HS256 keyed with the public key PEM", want: attest.ReasonTokenAlgorithm, token: signAlg(jose.HS256, func(e *env) any { return pubPEM(e) })},
		{name: "HS256 keyed with the public key DER", want: attest.ReasonTokenAlgorithm, token: signAlg(jose.HS256, func(e *env) any {
			der, _ := x509.MarshalPKIXPublicKey(e.srv.Key().Public())
			return der
		})},
		{name: "HS256 keyed with the JWK", want: attest.ReasonTokenAlgorithm, token: signAlg(jose.HS256, func(e *env) any { return gcptest.JWKS(e.srv.Key()) })},
		{name: "RS384", want: attest.ReasonTokenAlgorithm, token: signAlg(jose.RS384, realKey)},
		{name: "RS512", want: attest.ReasonTokenAlgorithm, token: signAlg(jose.RS512, realKey)},
		{name: "PS256", want: attest.ReasonTokenAlgorithm, token: signAlg(jose.PS256, realKey)},
		{name: "ES256", want: attest.ReasonTokenAlgorithm, token: signAlg(jose.ES256, func(*env) any { return ecKey })},
		// Keys.
		{name: "unknown kid", want: attest.ReasonTokenKeyUnknown, token: func(t *testing.T, e *env) string {
			return gcptest.SignWith(t, jose.RS256, attackerKey.Private, attackerKey.ID, e.srv.Claims(e.ch.Audience, true, false), nil)
		}},
		{name: "no kid", want: attest.ReasonTokenKeyUnknown, token: func(t *testing.T, e *env) string {
			return gcptest.SignWith(t, jose.RS256, e.srv.Key().Private, "", e.srv.Claims(e.ch.Audience, true, false), nil)
		}},
		{name: "other key under the real kid", want: attest.ReasonTokenSignature, token: func(t *testing.T, e *env) string {
			return gcptest.SignWith(t, jose.RS256, attackerKey.Private, e.srv.Key().ID, e.srv.Claims(e.ch.Audience, true, false), nil)
		}},
		{name: "embedded jwk chooses no key", want: attest.ReasonTokenSignature, token: func(t *testing.T, e *env) string {
			jwk := jose.JSONWebKey{Key: attackerKey.Public(), KeyID: e.srv.Key().ID, Algorithm: "RS256", Use: "sig"}
			return gcptest.SignWith(t, jose.RS256, attackerKey.Private, e.srv.Key().ID, e.srv.Claims(e.ch.Audience, true, false), map[string]any{"jwk": jwk})
		}},
		{name: "jku chooses no key", want: attest.ReasonTokenKeyUnknown, token: func(t *testing.T, e *env) string {
			evil := gcptest.NewServer(t, e.clk.Now)
			tok := gcptest.SignWith(t, jose.RS256, evil.Key().Private, evil.Key().ID, e.srv.Claims(e.ch.Audience, true, false),
				map[string]any{"jku": evil.JWKSURL(), "x5u": evil.JWKSURL()})
			t.Cleanup(func() {
				if evil.JWKSFetches() != 0 {
					t.Errorf("the verifier fetched the token's jku")
				}
			})
			return tok
		}},
		{name: "unknown kid, JWKS source", want: attest.ReasonTokenKeyUnknown, keys: jwksKeys, token: func(t *testing.T, e *env) string {
			return gcptest.SignWith(t, jose.RS256, attackerKey.Private, attackerKey.ID, e.srv.Claims(e.ch.Audience, true, false), nil)
		}},
		{name: "key source down", want: attest.ReasonKeysUnavailable, keys: func(s *gcptest.Server) gcp.KeySource {
			s.SetJWKSDown(true)
			return jwksKeys(s)
		}, token: valid},
		{name: "key source fails with a plain error", want: attest.ReasonKeysUnavailable, keys: func(*gcptest.Server) gcp.KeySource { return failingKeys{} }, token: valid},
		{name: "1024-bit key", want: attest.ReasonTokenKeyUnknown, keys: func(s *gcptest.Server) gcp.KeySource {
			small, _ := rsa.GenerateKey(rand.Reader, 1024)
			return gcp.StaticKeys{s.Key().ID: &small.PublicKey}
		}, token: valid},
		// Signature.
		{name: "bad signature", want: attest.ReasonTokenSignature, token: segments(func(h, p, s string) string {
			b, _ := base64.RawURLEncoding.DecodeString(s)
			b[len(b)/2] ^= 1
			return h + "." + p + "." + base64.RawURLEncoding.EncodeToString(b)
		})},
		{name: "payload swapped", want: attest.ReasonTokenSignature, token: func(t *testing.T, e *env) string {
			parts := strings.Split(valid(t, e), ".")
			c := e.srv.Claims(e.ch.Audience, true, false)
			gcptest.ComputeEngine(c)["instance_name"] = "control-plane-0"
			p, _ := json.Marshal(c)
			return parts[0] + "." + base64.RawURLEncoding.EncodeToString(p) + "." + parts[2]
		}},
		{name: "empty signature", want: attest.ReasonTokenSignature, token: segments(func(h, p, _ string) string { return h + "." + p + "." })},
		// Issuer.
		{name: "wrong issuer", want: attest.ReasonTokenIssuer, token: claims(func(c map[string]any) { c["iss"] = "https://evil.example" })},
		{name: "scheme-less issuer", want: attest.ReasonTokenIssuer, token: claims(func(c map[string]any) { c["iss"] = "accounts.google.com" })},
		{name: "no issuer", want: attest.ReasonTokenIssuer, token: claims(func(c map[string]any) { delete(c, "iss") })},
		// Audience.
		{name: "token of another session (replay)", want: attest.ReasonTokenAudience, token: func(t *testing.T, e *env) string {
			other, _, err := e.v.Challenge("worker", e.sess.KubeletKeySHA256, nil)
			if err != nil {
				t.Fatal(err)
			}
			return e.srv.Mint(t, other.Audience)
		}},
		{name: "token for another kubelet key", want: attest.ReasonTokenAudience, token: func(t *testing.T, e *env) string {
			aud := prefix + gcp.AudiencePath + base64.RawURLEncoding.EncodeToString(attest.BindingDigest(e.sess.Nonce, keySHA("attacker key")))
			return e.srv.Mint(t, aud)
		}},
		{name: "token for another server", want: attest.ReasonTokenAudience, token: func(t *testing.T, e *env) string {
			return e.srv.Mint(t, strings.Replace(e.ch.Audience, "api-int.example.com", "evil.example", 1))
		}},
		{name: "audience array with two members", want: attest.ReasonTokenAudience, token: claims(func(c map[string]any) { c["aud"] = []string{c["aud"].(string), "https://evil.example"} })},
		{name: "audience array with one member", token: claims(func(c map[string]any) { c["aud"] = []string{c["aud"].(string)} })},
		{name: "no audience", want: attest.ReasonTokenAudience, token: claims(func(c map[string]any) { delete(c, "aud") })},
		// Time.
		{name: "expired", want: attest.ReasonTokenExpired, token: claims(func(c map[string]any) {
			c["iat"], c["exp"] = now-7200, now-int64(skew/time.Second)
		})},
		{name: "expired within skew", token: claims(func(c map[string]any) { c["iat"], c["exp"] = now-3600, now-int64(skew/time.Second)+1 })},
		{name: "iat beyond skew", want: attest.ReasonTokenNotYetValid, token: claims(func(c map[string]any) { c["iat"] = now + int64(skew/time.Second) + 1 })},
		{name: "iat within skew", token: claims(func(c map[string]any) { c["iat"] = now + int64(skew/time.Second) })},
		{name: "nbf beyond skew", want: attest.ReasonTokenNotYetValid, token: claims(func(c map[string]any) { c["nbf"] = now + 3600 })},
		{name: "exp missing", want: attest.ReasonTokenClaims, token: claims(func(c map[string]any) { delete(c, "exp") })},
		{name: "iat missing", want: attest.ReasonTokenClaims, token: claims(func(c map[string]any) { delete(c, "iat") })},
		{name: "exp a string", want: attest.ReasonTokenClaims, token: claims(func(c map[string]any) { c["exp"] = "99999999999" })},
		{name: "exp a fraction", want: attest.ReasonTokenClaims, token: claims(func(c map[string]any) { c["exp"] = float64(now) + 0.5 })},
		{name: "exp beyond int64", want: attest.ReasonTokenClaims, token: claims(func(c map[string]any) { c["exp"] = json.Number("99999999999999999999999") })},
		// Compute Engine claims.
		{name: "standard format (no google claim)", want: attest.ReasonTokenClaims, token: claims(func(c map[string]any) { delete(c, "google") })},
		{name: "no compute_engine", want: attest.ReasonTokenClaims, token: claims(func(c map[string]any) { c["google"] = map[string]any{} })},
		{name: "instance_name not a label", want: attest.ReasonTokenClaims, token: ce(func(m map[string]any) { m["instance_name"] = "Worker.evil" })},
		{name: "instance_name a path", want: attest.ReasonTokenClaims, token: ce(func(m map[string]any) { m["instance_name"] = "../etc" })},
		{name: "instance_name a number", want: attest.ReasonTokenClaims, token: ce(func(m map[string]any) { m["instance_name"] = 7 })},
		{name: "instance_id not decimal", want: attest.ReasonTokenClaims, token: ce(func(m map[string]any) { m["instance_id"] = "12a" })},
		{name: "instance_id as a number", token: ce(func(m map[string]any) { m["instance_id"] = json.Number(gcptest.DefaultInstance(t0).InstanceID) })},
		{name: "project_number negative", want: attest.ReasonTokenClaims, token: ce(func(m map[string]any) { m["project_number"] = -5 })},
		{name: "project_number as a string", token: ce(func(m map[string]any) { m["project_number"] = "123456789012" })},
		{name: "zone with a slash", want: attest.ReasonTokenClaims, token: ce(func(m map[string]any) { m["zone"] = "projects/1/zones/us-central1-a" })},
		{name: "project_id with a space", want: attest.ReasonTokenClaims, token: ce(func(m map[string]any) { m["project_id"] = "my project" })},
		{name: "instance_creation_timestamp zero", want: attest.ReasonTokenClaims, token: ce(func(m map[string]any) { m["instance_creation_timestamp"] = 0 })},
		{name: "email malformed", want: attest.ReasonTokenClaims, token: claims(func(c map[string]any) { c["email"] = "a b@example.com" })},
		{name: "no email", token: claims(func(c map[string]any) { delete(c, "email") }), check: func(t *testing.T, _ *env, c *attest.Claims) {
			if c.Instance.ServiceAccount != "" || c.NodeName != "worker-0" {
				t.Fatalf("claims = %+v", c.Instance)
			}
		}},
		{name: "addresses follow the token's zone and project", token: ce(func(m map[string]any) {
			m["zone"], m["project_id"], m["instance_name"] = "europe-west4-b", "other-project", "infra-7"
		}), check: func(t *testing.T, _ *env, c *attest.Claims) {
			want := []string{"infra-7", "infra-7.europe-west4-b.c.other-project.internal"}
			if c.NodeName != "infra-7" || !slices.Equal(c.Addresses, want) {
				t.Fatalf("node %q, addresses %q, want %q", c.NodeName, c.Addresses, want)
			}
		}},
		{name: "domain-scoped project: the instance name only", token: ce(func(m map[string]any) { m["project_id"] = "example.com:my-project" }), check: func(t *testing.T, _ *env, c *attest.Claims) {
			if c.Instance.Account != "example.com:my-project" || !slices.Equal(c.Addresses, []string{"worker-0"}) {
				t.Fatalf("project %q, addresses %q, want [worker-0]", c.Instance.Account, c.Addresses)
			}
		}},
		{name: "email not a string", want: attest.ReasonTokenClaims, token: claims(func(c map[string]any) { c["email"] = 5 })},
		{name: "issuer not a string", want: attest.ReasonTokenIssuer, token: claims(func(c map[string]any) { c["iss"] = []string{gcptest.Issuer} })},
		{name: "compute_engine not an object", want: attest.ReasonTokenClaims, token: claims(func(c map[string]any) { c["google"] = map[string]any{"compute_engine": "x"} })},
		// Form.
		{name: "oversized", want: attest.ReasonMalformed, token: claims(func(c map[string]any) { c["pad"] = strings.Repeat("a", gcp.MaxTokenSize) })},
		{name: "empty", want: attest.ReasonMalformed, token: func(*testing.T, *env) string { return "" }},
		{name: "not a JWS", want: attest.ReasonMalformed, token: func(*testing.T, *env) string { return "not-a-token" }},
		{name: "two segments", want: attest.ReasonMalformed, token: segments(func(h, p, _ string) string { return h + "." + p })},
		{name: "four segments", want: attest.ReasonMalformed, token: segments(func(h, p, s string) string { return h + "." + p + "." + s + "." + s })},
		{name: "header not base64", want: attest.ReasonMalformed, token: segments(func(_, p, s string) string { return "!!." + p + "." + s })},
		{name: "header not JSON", want: attest.ReasonMalformed, token: segments(func(_, p, s string) string {
			return base64.RawURLEncoding.EncodeToString([]byte("alg=RS256")) + "." + p + "." + s
		})},
		{name: "JSON serialization", want: attest.ReasonMalformed, token: func(t *testing.T, e *env) string {
			parts := strings.Split(valid(t, e), ".")
			b, _ := json.Marshal(map[string]string{"protected": parts[0], "payload": parts[1], "signature": parts[2]})
			return string(b)
		}},
		{name: "crit header", want: attest.ReasonMalformed, token: func(t *testing.T, e *env) string {
			return gcptest.SignWith(t, jose.RS256, e.srv.Key().Private, e.srv.Key().ID, e.srv.Claims(e.ch.Audience, true, false),
				map[string]any{"crit": []string{"exp"}, "exp": 1})
		}},
		{name: "payload not JSON", want: attest.ReasonMalformed, token: func(t *testing.T, e *env) string {
			k := e.srv.Key()
			return gcptest.SignWith(t, jose.RS256, k.Private, k.ID, nil, nil)
		}},
		// Session.
		{name: "expired session", want: attest.ReasonSessionExpired, token: valid, sess: func(e *env) *attest.Session {
			s := *e.sess
			s.Expires = e.clk.now
			return &s
		}},
		{name: "TPM session", want: attest.ReasonSessionInvalid, token: valid, sess: func(e *env) *attest.Session {
			s := *e.sess
			s.Kind = attest.KindTPM
			return &s
		}},
		{name: "session without a nonce", want: attest.ReasonSessionInvalid, token: valid, sess: func(e *env) *attest.Session {
			s := *e.sess
			s.Nonce = nil
			return &s
		}},
		{name: "no session", want: attest.ReasonSessionInvalid, token: valid, sess: func(*env) *attest.Session { return nil }},
	}
	// Every compute_engine claim, missing and null.
	for _, name := range []string{"project_id", "project_number", "zone", "instance_id", "instance_name", "instance_creation_timestamp"} {
		cases = append(cases,
			tc{name: "missing " + name, want: attest.ReasonTokenClaims, token: ce(func(m map[string]any) { delete(m, name) })},
			tc{name: "null " + name, want: attest.ReasonTokenClaims, token: ce(func(m map[string]any) { m[name] = nil })},
			tc{name: "empty " + name, want: attest.ReasonTokenClaims, token: ce(func(m map[string]any) { m[name] = "" })},
		)
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.keys)
			tok := c.token(t, e)
			sess := e.sess
			if c.sess != nil {
				sess = c.sess(e)
			}
			claims, err := e.v.Verify(context.Background(), sess, &gcp.Evidence{Token: tok})
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if c.check != nil {
					c.check(t, e, claims)
				} else {
					checkClaims(t, e, claims)
				}
				return
			}
			if claims != nil {
				t.Fatalf("claims returned with a refusal: %v", claims)
			}
			attacktable.CheckRefusal(t, "GCP", c.name, c.want, err)
		})
	}
	t.Run("no evidence", func(t *testing.T) {
		e := newEnv(t, nil)
		if _, err := e.v.Verify(context.Background(), e.sess, nil); !isReason(err, attest.ReasonMalformed) {
			t.Fatal(err)
		}
	})
}

func jwksKeys(s *gcptest.Server) gcp.KeySource {
	src, err := gcp.NewJWKSSource(s.JWKSURL(), nil, func() time.Time { return t0 }, time.Minute)
	if err != nil {
		panic(err)
	}
	return src
}
