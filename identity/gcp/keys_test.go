package gcp_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/gcp"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
)

func newJWKS(t *testing.T, maxAge, minRefresh time.Duration) (*gcptest.Server, *gcp.JWKSSource, *clock) {
	t.Helper()
	sharedKeyOnce.Do(func() { sharedKey = gcptest.NewKey(t) })
	clk := &clock{now: t0}
	srv := gcptest.NewServerWithKey(t, clk.Now, sharedKey)
	srv.SetJWKSMaxAge(maxAge)
	src, err := gcp.NewJWKSSource(srv.JWKSURL(), nil, clk.Now, minRefresh)
	if err != nil {
		t.Fatal(err)
	}
	return srv, src, clk
}

func wantKey(t *testing.T, src gcp.KeySource, k gcptest.Key) {
	t.Helper()
	got, err := src.Key(context.Background(), k.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(k.Public()) {
		t.Fatal("wrong key")
	}
}

func wantReason(t *testing.T, src gcp.KeySource, kid string, r attest.Reason) {
	t.Helper()
	if k, err := src.Key(context.Background(), kid); k != nil || !isReason(err, r) {
		t.Fatalf("Key(%q) = %v, want %s", kid, err, r)
	}
}

func wantFetches(t *testing.T, srv *gcptest.Server, src *gcp.JWKSSource, n int) {
	t.Helper()
	if srv.JWKSFetches() != n || src.Fetches() != n {
		t.Fatalf("fetches: server saw %d, source made %d, want %d", srv.JWKSFetches(), src.Fetches(), n)
	}
}

// TestJWKSRotation: a new kid causes exactly one refetch; tokens signed
// with the new key verify, and a retired key is forgotten.
func TestJWKSRotation(t *testing.T) {
	srv, src, clk := newJWKS(t, time.Hour, time.Minute)
	old := srv.Key()
	wantKey(t, src, old)
	wantKey(t, src, old)
	wantFetches(t, srv, src, 1)

	clk.Advance(2 * time.Minute) // cache still fresh
	next := srv.Rotate(t, true)
	wantKey(t, src, next)
	wantFetches(t, srv, src, 2)
	wantKey(t, src, next)
	wantKey(t, src, old)
	wantFetches(t, srv, src, 2)

	// End to end: a token signed with the new key verifies through the source.
	v, err := gcp.NewVerifier(gcp.Options{Keys: src, AudiencePrefix: prefix, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	ch, sess, _ := v.Challenge("worker", keySHA("k"), nil)
	if _, err := v.Verify(context.Background(), sess, &gcp.Evidence{Token: srv.Mint(t, ch.Audience)}); err != nil {
		t.Fatal(err)
	}

	// Google retires the old key; after the next fetch it is gone.
	clk.Advance(2 * time.Minute)
	newest := srv.Rotate(t, false)
	wantKey(t, src, newest)
	wantFetches(t, srv, src, 3)
	wantReason(t, src, old.ID, attest.ReasonTokenKeyUnknown)
	wantFetches(t, srv, src, 3)
}

// TestJWKSBoundedRefresh: a flood of unknown kids, sequential and
// concurrent, causes at most one fetch per minRefresh.
func TestJWKSBoundedRefresh(t *testing.T) {
	srv, src, clk := newJWKS(t, time.Hour, time.Minute)
	wantKey(t, src, srv.Key())
	wantFetches(t, srv, src, 1)

	clk.Advance(10 * time.Second)
	wantReason(t, src, "flood-0", attest.ReasonTokenKeyUnknown) // first unknown kid after 10s: still within minRefresh
	wantFetches(t, srv, src, 1)

	clk.Advance(time.Minute)
	flood := func(n int) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := src.Key(context.Background(), fmt.Sprintf("flood-%d", i)); !isReason(err, attest.ReasonTokenKeyUnknown) {
					t.Errorf("flood-%d: %v", i, err)
				}
			}()
		}
		wg.Wait()
	}
	flood(500)
	wantFetches(t, srv, src, 2)
	for i := range 500 {
		wantReason(t, src, fmt.Sprintf("seq-%d", i), attest.ReasonTokenKeyUnknown)
	}
	wantFetches(t, srv, src, 2)
	wantKey(t, src, srv.Key()) // known keys are unaffected
	clk.Advance(59 * time.Second)
	flood(100)
	wantFetches(t, srv, src, 2)
	clk.Advance(time.Second)
	flood(100)
	wantFetches(t, srv, src, 3)
}

// TestJWKSMaxAge: cached keys are used for max-age, then refetched.
func TestJWKSMaxAge(t *testing.T) {
	srv, src, clk := newJWKS(t, 5*time.Minute, time.Minute)
	k := srv.Key()
	wantKey(t, src, k)
	clk.Advance(5*time.Minute - time.Second)
	wantKey(t, src, k)
	wantFetches(t, srv, src, 1)
	clk.Advance(time.Second)
	wantKey(t, src, k)
	wantFetches(t, srv, src, 2)

	// max-age=0: every use after minRefresh refetches, never more often.
	srv.SetJWKSMaxAge(0)
	clk.Advance(5 * time.Minute)
	wantKey(t, src, k)
	wantFetches(t, srv, src, 3)
	wantKey(t, src, k) // stale, within minRefresh: served from cache
	wantFetches(t, srv, src, 3)
	clk.Advance(time.Minute)
	wantKey(t, src, k)
	wantFetches(t, srv, src, 4)
}

// TestJWKSOutage: while the endpoint is down, cached keys serve for up to
// MaxStale past freshness; never-fetched or too-stale keys give
// TrustRootsUnavailable; recovery refetches.
func TestJWKSOutage(t *testing.T) {
	srv, src, clk := newJWKS(t, time.Hour, time.Minute)
	srv.SetJWKSDown(true)
	wantReason(t, src, srv.Key().ID, attest.ReasonKeysUnavailable)
	wantReason(t, src, srv.Key().ID, attest.ReasonKeysUnavailable) // rate-limited, still unavailable
	wantFetches(t, srv, src, 1)

	srv.SetJWKSDown(false)
	clk.Advance(time.Minute)
	wantKey(t, src, srv.Key())
	wantFetches(t, srv, src, 2)

	srv.SetJWKSDown(true)
	clk.Advance(2 * time.Hour) // stale
	wantKey(t, src, srv.Key())
	wantFetches(t, srv, src, 3)
	wantReason(t, src, "other", attest.ReasonKeysUnavailable) // a fetch failed: not the node's fault
	clk.Advance(gcp.MaxStale)
	wantReason(t, src, srv.Key().ID, attest.ReasonKeysUnavailable)
	srv.SetJWKSDown(false)
	clk.Advance(time.Minute)
	wantKey(t, src, srv.Key())
}

// TestJWKSOversized: a body beyond MaxJWKSSize is refused, whether or not
// it declares its length.
func TestJWKSOversized(t *testing.T) {
	srv, src, clk := newJWKS(t, time.Hour, time.Minute)
	k := srv.Key()
	// A valid JWKS padded past the limit with an extra member.
	var set map[string]any
	json.Unmarshal(gcptest.JWKS(k), &set)
	set["pad"] = strings.Repeat("a", gcp.MaxJWKSSize)
	big, _ := json.Marshal(set)
	srv.SetJWKSBody(big)
	wantReason(t, src, k.ID, attest.ReasonKeysUnavailable)

	declared := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(big)))
		w.Write(big)
	}))
	defer declared.Close()
	src2, _ := gcp.NewJWKSSource(declared.URL, nil, clk.Now, time.Minute)
	wantReason(t, src2, k.ID, attest.ReasonKeysUnavailable)

	srv.SetJWKSBody(nil)
	clk.Advance(time.Minute)
	wantKey(t, src, k)
}

// TestJWKSNoRedirect: a redirect is not followed, even to a good JWKS.
func TestJWKSNoRedirect(t *testing.T) {
	srv, _, clk := newJWKS(t, time.Hour, time.Minute)
	redir := httptest.NewServer(http.RedirectHandler(srv.JWKSURL(), http.StatusFound))
	defer redir.Close()
	src, _ := gcp.NewJWKSSource(redir.URL, &http.Client{}, clk.Now, time.Minute)
	wantReason(t, src, srv.Key().ID, attest.ReasonKeysUnavailable)
	if srv.JWKSFetches() != 0 {
		t.Fatal("redirect followed")
	}
}

func TestNewJWKSSourceRefuses(t *testing.T) {
	now := func() time.Time { return t0 }
	for _, u := range []string{"http://www.googleapis.com/oauth2/v3/certs", "ftp://127.0.0.1/x", "/certs", "https://u:p@example.com/certs"} {
		if _, err := gcp.NewJWKSSource(u, nil, now, 0); err == nil {
			t.Errorf("%s accepted", u)
		}
	}
	if _, err := gcp.NewJWKSSource("", nil, nil, 0); err == nil {
		t.Error("no clock accepted")
	}
	if _, err := gcp.NewJWKSSource("", nil, now, -time.Second); err == nil {
		t.Error("negative minRefresh accepted")
	}
	if _, err := gcp.NewJWKSSource("", nil, now, 0); err != nil {
		t.Errorf("Google's URL: %v", err)
	}
}

// TestParseJWKS: only RS256 public signing keys of sane size are taken.
func TestParseJWKS(t *testing.T) {
	sharedKeyOnce.Do(func() { sharedKey = gcptest.NewKey(t) })
	good := sharedKey
	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	keys := []any{
		jose.JSONWebKey{Key: good.Public(), KeyID: "good", Algorithm: "RS256", Use: "sig"},
		jose.JSONWebKey{Key: good.Public(), KeyID: "no-alg-no-use"},
		jose.JSONWebKey{Key: good.Public(), KeyID: "rs512", Algorithm: "RS512", Use: "sig"},
		jose.JSONWebKey{Key: good.Public(), KeyID: "enc", Algorithm: "RS256", Use: "enc"},
		jose.JSONWebKey{Key: good.Public(), Algorithm: "RS256", Use: "sig"},
		jose.JSONWebKey{Key: &small.PublicKey, KeyID: "small", Algorithm: "RS256", Use: "sig"},
		jose.JSONWebKey{Key: &ec.PublicKey, KeyID: "ec", Algorithm: "ES256", Use: "sig"},
		jose.JSONWebKey{Key: good.Private, KeyID: "private", Algorithm: "RS256", Use: "sig"},
		jose.JSONWebKey{Key: good.Public(), KeyID: "dup", Algorithm: "RS256", Use: "sig"},
		jose.JSONWebKey{Key: good.Public(), KeyID: "dup", Algorithm: "RS256", Use: "sig"},
		map[string]string{"kty": "OKP-future", "kid": "future"},
		map[string]string{"kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"},
	}
	b, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		t.Fatal(err)
	}
	got, err := gcp.ParseJWKS(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["good"] == nil || got["no-alg-no-use"] == nil {
		t.Fatalf("keys = %v", got)
	}
	for name, doc := range map[string]string{
		"not JSON":      "nope",
		"array":         "[]",
		"no keys":       `{"keys":[]}`,
		"only EC":       `{"keys":[{"kty":"EC"}]}`,
		"too many keys": `{"keys":[` + strings.Repeat(`{},`, 40) + `{}]}`,
	} {
		if _, err := gcp.ParseJWKS([]byte(doc)); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}
