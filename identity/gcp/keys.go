package gcp

import (
	"context"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/nodeproof/nodeproof/attest"
)

// KeySource finds the public key that signed a token, by its key ID.
//
// Key returns an error wrapping an *attest.Denial: TokenKeyUnknown when the
// source has no such key, TrustRootsUnavailable when it could not learn its
// keys (the server answers 503, "retry"). Any other error is treated as
// TrustRootsUnavailable. A source may fetch keys it does not have.
type KeySource interface {
	Key(ctx context.Context, kid string) (*rsa.PublicKey, error)
}

// StaticKeys is a fixed KeySource: key ID to RSA public key. For tests and
// for air-gapped deployments that pin Google's keys by hand.
type StaticKeys map[string]*rsa.PublicKey

// Key returns the key with this ID or a TokenKeyUnknown denial.
func (s StaticKeys) Key(_ context.Context, kid string) (*rsa.PublicKey, error) {
	if k, ok := s[kid]; ok && k != nil {
		return k, nil
	}
	return nil, attest.Deny(attest.ReasonTokenKeyUnknown, "no key with ID %q", kid)
}

// GoogleJWKSURL is where Google publishes the JWKS of the keys that sign
// its ID tokens, instance identity tokens included.
const GoogleJWKSURL = "https://www.googleapis.com/oauth2/v3/certs"

// Limits of a JWKSSource.
const (
	// MaxJWKSSize bounds a JWKS response (Google's is about 1.5 KiB).
	MaxJWKSSize = 64 << 10
	// maxJWKSKeys bounds the keys in one JWKS.
	maxJWKSKeys = 32
	// DefaultMinRefresh is the least time between two fetches when the
	// caller passes zero.
	DefaultMinRefresh = time.Minute
	// DefaultKeyTTL is how long keys are fresh when the response carries
	// no Cache-Control max-age.
	DefaultKeyTTL = time.Hour
	// maxKeyTTL caps a max-age, however long the response asks for.
	maxKeyTTL = 24 * time.Hour
	// MaxStale is how long past their freshness cached keys keep being
	// used while fetches fail. Past it, the source answers
	// TrustRootsUnavailable rather than trust keys Google may have
	// retired.
	MaxStale = 24 * time.Hour
	// FetchTimeout bounds one fetch (connect, headers and body), whatever
	// the client's own timeout.
	FetchTimeout = 10 * time.Second
	// minRSABits and maxRSABits bound accepted keys: no weak keys, and no
	// huge moduli that make each verification expensive.
	minRSABits = 2048
	maxRSABits = 8192
)

// JWKSSource is a KeySource backed by a JWKS URL (Google's certs endpoint
// in production). It is safe for concurrent use.
//
// Caching: keys are fresh for the response's Cache-Control max-age (minus
// its Age; no-store / no-cache mean zero; absent means DefaultKeyTTL;
// capped at 24h). A fetch replaces the whole key set, so keys Google
// retires are forgotten.
//
// Fetching, bounded: a fetch happens when a key ID is not in the cache or
// the cache is stale, but at most once per minRefresh, counting failed
// attempts too. So a flood of tokens with random key IDs causes at most one
// request to the JWKS URL per minRefresh, and an outage is not hammered.
// Only one fetch runs at a time; concurrent callers wait for it (or for
// their context). A fetch is not cancelled when the caller that started it
// goes away (it serves everyone) but is bounded by FetchTimeout. Redirects
// are not followed; the body is read up to MaxJWKSSize and refused beyond.
//
// Failures: when a fetch fails, the keys already cached keep being used for
// up to MaxStale past their freshness. A key ID not in the cache gives
// TokenKeyUnknown when the cached set is current (fresh, or fetched
// successfully within minRefresh) and lacks it; TrustRootsUnavailable when
// no key set could be fetched at all, or the cached set is stale and the
// last fetch failed. Servers should answer
// TrustRootsUnavailable with 503 and Retry-After: the node did nothing
// wrong.
//
// Keys are decoded by go-jose (jose.JSONWebKey). Only public RSA keys with
// a key ID, alg "RS256" or absent, use "sig" or absent, and a modulus of
// 2048 to 8192 bits are taken; others are ignored, as is a key ID that
// appears twice.
type JWKSSource struct {
	url        string
	client     *http.Client
	clock      func() time.Time
	minRefresh time.Duration

	// sem serialises fetches: a buffered channel of one, so waiting can
	// end with the caller's context.
	sem chan struct{}

	mu          sync.Mutex
	keys        map[string]*rsa.PublicKey
	fetchedAt   time.Time // last successful fetch
	freshUntil  time.Time
	lastAttempt time.Time
	fetches     int
}

// NewJWKSSource returns a JWKSSource. jwksURL empty means GoogleJWKSURL; it
// must be https, or http to a loopback address (tests). client nil means a
// plain client; whichever client, each fetch is bounded by FetchTimeout and
// redirects are not followed (the caller's client is copied, not changed).
// clock is required. minRefresh zero means DefaultMinRefresh.
func NewJWKSSource(jwksURL string, client *http.Client, clock func() time.Time, minRefresh time.Duration) (*JWKSSource, error) {
	if jwksURL == "" {
		jwksURL = GoogleJWKSURL
	}
	u, err := url.Parse(jwksURL)
	if err != nil || u.Host == "" || u.User != nil {
		return nil, fmt.Errorf("gcp: JWKS URL %q is not an absolute URL without credentials", jwksURL)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && isLoopback(u.Hostname()):
	default:
		return nil, fmt.Errorf("gcp: JWKS URL %q must be https (http only to loopback)", jwksURL)
	}
	if clock == nil {
		return nil, errors.New("gcp: JWKS source clock is required")
	}
	if minRefresh < 0 {
		return nil, errors.New("gcp: JWKS minRefresh is negative")
	}
	if minRefresh == 0 {
		minRefresh = DefaultMinRefresh
	}
	var c http.Client
	if client != nil {
		c = *client
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &JWKSSource{url: jwksURL, client: &c, clock: clock, minRefresh: minRefresh, sem: make(chan struct{}, 1)}, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Fetches reports how many fetches were attempted (for tests and metrics).
func (s *JWKSSource) Fetches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches
}

// lookup returns the cached key, whether the cache is fresh, and whether
// it is still usable as stale.
func (s *JWKSSource) lookup(kid string, now time.Time) (k *rsa.PublicKey, fresh, usable bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k = s.keys[kid]
	return k, now.Before(s.freshUntil), now.Before(s.freshUntil.Add(MaxStale))
}

// Key returns the RSA key with this ID; see the type's doc for when it
// fetches and what it returns.
func (s *JWKSSource) Key(ctx context.Context, kid string) (*rsa.PublicKey, error) {
	if kid == "" {
		return nil, attest.Deny(attest.ReasonTokenKeyUnknown, "token names no key ID")
	}
	if k, fresh, _ := s.lookup(kid, s.clock()); k != nil && fresh {
		return k, nil
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, attest.Deny(attest.ReasonKeysUnavailable, "waiting for the signing keys: %v", ctx.Err())
	}
	defer func() { <-s.sem }()

	now := s.clock()
	k, fresh, usable := s.lookup(kid, now) // another caller may have fetched
	if k != nil && fresh {
		return k, nil
	}
	if !usable {
		k = nil // too stale to trust, even as a fallback
	}
	s.mu.Lock()
	since := now.Sub(s.lastAttempt)
	limited := !s.lastAttempt.IsZero() && since >= 0 && since < s.minRefresh
	fetchedAt, next := s.fetchedAt, s.lastAttempt.Add(s.minRefresh)
	lastOK := !fetchedAt.IsZero() && fetchedAt.Equal(s.lastAttempt)
	if !limited {
		s.lastAttempt = now
		s.fetches++
	}
	s.mu.Unlock()
	if limited {
		switch {
		case k != nil: // stale, but the refresh budget is spent
			return k, nil
		case (fresh || lastOK) && usable:
			// The set we hold is current: the key is not Google's.
			return nil, attest.Deny(attest.ReasonTokenKeyUnknown, "no key with ID %q in the key set fetched at %s", kid, fetchedAt.UTC().Format(time.RFC3339))
		default:
			// Never fetched, or stale after a failed fetch: we cannot say.
			return nil, attest.Deny(attest.ReasonKeysUnavailable, "signing keys unavailable; next fetch after %s", next.UTC().Format(time.RFC3339))
		}
	}

	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FetchTimeout)
	defer cancel()
	keys, ttl, err := s.fetch(fctx)
	if err != nil {
		if k != nil {
			return k, nil // stale-if-error: keep verifying with what we have
		}
		return nil, attest.Deny(attest.ReasonKeysUnavailable, "fetching signing keys from %s: %v", s.url, err)
	}
	s.mu.Lock()
	s.keys, s.fetchedAt, s.freshUntil = keys, now, now.Add(ttl)
	s.mu.Unlock()
	if k := keys[kid]; k != nil {
		return k, nil
	}
	return nil, attest.Deny(attest.ReasonTokenKeyUnknown, "no key with ID %q in the key set just fetched", kid)
}

// fetch GETs the JWKS and returns its usable keys and how long they are
// fresh.
func (s *JWKSSource) fetch(ctx context.Context) (map[string]*rsa.PublicKey, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("status %s", resp.Status)
	}
	if resp.ContentLength > MaxJWKSSize {
		return nil, 0, fmt.Errorf("response of %d bytes exceeds %d", resp.ContentLength, MaxJWKSSize)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxJWKSSize+1))
	if err != nil {
		return nil, 0, err
	}
	if len(body) > MaxJWKSSize {
		return nil, 0, fmt.Errorf("response exceeds %d bytes", MaxJWKSSize)
	}
	keys, err := ParseJWKS(body)
	if err != nil {
		return nil, 0, err
	}
	return keys, cacheTTL(resp.Header), nil
}

// cacheTTL reads how long a response may be cached: Cache-Control max-age
// minus Age; zero for no-store or no-cache; DefaultKeyTTL when unsaid;
// never more than 24h.
func cacheTTL(h http.Header) time.Duration {
	ttl := DefaultKeyTTL
	for _, line := range h.Values("Cache-Control") {
		for _, d := range strings.Split(line, ",") {
			name, val, _ := strings.Cut(strings.TrimSpace(d), "=")
			switch strings.ToLower(name) {
			case "no-store", "no-cache":
				return 0
			case "max-age":
				n, err := strconv.ParseInt(strings.Trim(val, `"`), 10, 64)
				if err != nil || n < 0 {
					return 0 // unreadable freshness: treat as stale
				}
				ttl = time.Duration(min(n, int64(maxKeyTTL/time.Second))) * time.Second
			}
		}
	}
	if age, err := strconv.ParseInt(h.Get("Age"), 10, 64); err == nil && age > 0 {
		ttl -= time.Duration(min(age, int64(maxKeyTTL/time.Second))) * time.Second
	}
	return max(0, min(ttl, maxKeyTTL))
}

// ParseJWKS reads a JWKS document and returns its RS256 signing keys by
// key ID. Each key is decoded by go-jose; keys that do not decode, are not
// public RSA keys, have an alg other than RS256 or a use other than sig
// (absent is allowed for both), have no key ID, or a modulus outside
// 2048-8192 bits are ignored; a key ID that appears twice is dropped. A
// document that is not a JWKS, has more than 32 keys or no usable key is
// an error.
func ParseJWKS(b []byte) (map[string]*rsa.PublicKey, error) {
	if len(b) > MaxJWKSSize {
		return nil, fmt.Errorf("JWKS exceeds %d bytes", MaxJWKSSize)
	}
	// Decode key by key rather than into a jose.JSONWebKeySet, so that one
	// key of a type go-jose does not know cannot make the set unusable.
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := unmarshalObject(b, &doc); err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	if len(doc.Keys) > maxJWKSKeys {
		return nil, fmt.Errorf("JWKS has %d keys; at most %d", len(doc.Keys), maxJWKSKeys)
	}
	keys := make(map[string]*rsa.PublicKey, len(doc.Keys))
	dup := map[string]bool{}
	for _, raw := range doc.Keys {
		var k jose.JSONWebKey
		if k.UnmarshalJSON(raw) != nil {
			continue
		}
		pub, ok := k.Key.(*rsa.PublicKey)
		if !ok || k.KeyID == "" || len(k.KeyID) > maxClaimString ||
			(k.Algorithm != "" && k.Algorithm != string(jose.RS256)) || (k.Use != "" && k.Use != "sig") {
			continue
		}
		if bits := pub.N.BitLen(); bits < minRSABits || bits > maxRSABits || pub.E < 3 || pub.E%2 == 0 {
			continue
		}
		if _, seen := keys[k.KeyID]; seen || dup[k.KeyID] {
			delete(keys, k.KeyID)
			dup[k.KeyID] = true
			continue
		}
		keys[k.KeyID] = pub
	}
	if len(keys) == 0 {
		return nil, errors.New("JWKS holds no usable RS256 signing key")
	}
	return keys, nil
}
