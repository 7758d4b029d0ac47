// Package gcptest is a loopback stand-in for a Compute Engine metadata
// server and for Google's JWKS endpoint, speaking the real protocols, for
// tests of identity/gcp and of anything built on it.
//
// The metadata side answers under /computeMetadata/v1/ the way GCE does:
// every request must carry "Metadata-Flavor: Google" (403 without, and 403
// with an X-Forwarded-For header), every response carries
// "Metadata-Flavor: Google", and instance/service-accounts/default/identity
// mints an RS256 JWT for its audience parameter (400 without one), with
// google.compute_engine claims when format=full (and license_id with
// licenses=TRUE). Point the metadata library at it with
// t.Setenv("GCE_METADATA_HOST", s.Host()).
//
// The JWKS side serves the public keys at /oauth2/v3/certs with
// Cache-Control max-age, like Google's, counts its fetches, can rotate
// keys, go down, or serve any body.
//
// Tokens are signed with go-jose and RSA keys generated per server. For
// attacks, Sign, SignWith and Unsigned mint tokens with any claims, any
// algorithm, any key and any header.
package gcptest

import (
	"cloud.google.com/go/compute/metadata"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// TB is what the helpers need of a test: testing.TB has it, and so can a
// benchmark program (bench/scale) that runs the server outside a test.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

var _ TB = testing.TB(nil)

// Issuer is the iss Google writes in instance identity tokens.
const Issuer = "https://accounts.google.com"

// JWKSPath is where the server publishes its keys, as Google does.
const JWKSPath = "/oauth2/v3/certs"

// IdentityPath is the metadata path that mints identity tokens.
const IdentityPath = "/computeMetadata/v1/instance/service-accounts/default/identity"

// Instance is the Compute Engine instance the server pretends to be.
type Instance struct {
	ProjectID     string
	ProjectNumber int64
	Zone          string
	InstanceID    string
	InstanceName  string
	Created       time.Time
	// Email is the default service account's email.
	Email string
	// Licenses are the license IDs of the boot disk (license_id, only
	// with licenses=TRUE).
	Licenses []string
}

// DefaultInstance is a plausible worker created ten minutes before now.
func DefaultInstance(now time.Time) Instance {
	return Instance{
		ProjectID:     "nodeproof-test",
		ProjectNumber: 123456789012,
		Zone:          "us-central1-a",
		InstanceID:    "4567890123456789012",
		InstanceName:  "worker-0",
		Created:       now.Add(-10 * time.Minute).Truncate(time.Second),
		Email:         "123456789012-compute@developer.gserviceaccount.com",
		Licenses:      []string{"5926592092274602096"},
	}
}

// Key is a signing key and its key ID.
type Key struct {
	ID      string
	Private *rsa.PrivateKey
}

// Public returns the public half.
func (k Key) Public() *rsa.PublicKey { return &k.Private.PublicKey }

// NewKey generates a 2048-bit RSA key with a random key ID.
func NewKey(tb TB) Key {
	tb.Helper()
	priv, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		tb.Fatal(err)
	}
	id := make([]byte, 20)
	rand.Read(id)
	return Key{ID: fmt.Sprintf("%x", id), Private: priv}
}

// Server is the loopback metadata server and JWKS endpoint.
type Server struct {
	srv   *httptest.Server
	clock func() time.Time

	mu        sync.Mutex
	inst      Instance
	current   Key
	published []Key
	tokenTTL  time.Duration
	maxAge    time.Duration
	jwksDown  bool
	jwksBody  []byte
	// counters
	jwksFetches int
	identities  int
}

// NewServer starts a server for tb that tells time with clock, pretends
// to be DefaultInstance, and signs with one fresh key. It stops when the
// test ends.
func NewServer(tb TB, clock func() time.Time) *Server {
	tb.Helper()
	return NewServerWithKey(tb, clock, NewKey(tb))
}

// NewServerWithKey is NewServer signing with k (tests that start many
// servers share one key rather than generate one each).
func NewServerWithKey(tb TB, clock func() time.Time, k Key) *Server {
	tb.Helper()
	s := &Server{
		clock: clock, inst: DefaultInstance(clock()),
		current: k, published: []Key{k},
		tokenTTL: time.Hour, maxAge: 5 * time.Hour,
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	tb.Cleanup(s.srv.Close)
	return s
}

// Host is the server's host:port, the value for GCE_METADATA_HOST.
func (s *Server) Host() string { return strings.TrimPrefix(s.srv.URL, "http://") }

// URL is the server's base URL.
func (s *Server) URL() string { return s.srv.URL }

// JWKSURL is the URL of the server's JWKS.
func (s *Server) JWKSURL() string { return s.srv.URL + JWKSPath }

// Instance returns the instance the server pretends to be.
func (s *Server) Instance() Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inst
}

// Client is a metadata client that asks this server (what
// GCE_METADATA_HOST does for the library's default client, for one
// client only, so many servers can run in one process).
func (s *Server) Client() *metadata.Client {
	return metadata.NewWithOptions(&metadata.Options{Client: &http.Client{Transport: hostRewrite{host: s.Host()}, Timeout: 10 * time.Second}})
}

// hostRewrite sends every request to host over plain HTTP.
type hostRewrite struct{ host string }

func (h hostRewrite) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = h.host, h.host
	r.URL.Scheme = "http"
	return http.DefaultTransport.RoundTrip(r)
}

// SetInstance changes the instance the server pretends to be.
func (s *Server) SetInstance(i Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inst = i
}

// Key returns the current signing key.
func (s *Server) Key() Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

// PublicKeys returns the published keys by ID (a gcp.StaticKeys).
func (s *Server) PublicKeys() map[string]*rsa.PublicKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]*rsa.PublicKey, len(s.published))
	for _, k := range s.published {
		m[k.ID] = k.Public()
	}
	return m
}

// Rotate makes a new signing key current and publishes it; keepOld keeps
// the previous keys published too (Google overlaps its keys).
func (s *Server) Rotate(tb TB, keepOld bool) Key {
	k := NewKey(tb)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = k
	if keepOld {
		s.published = append(s.published, k)
	} else {
		s.published = []Key{k}
	}
	return k
}

// SetJWKSMaxAge sets the Cache-Control max-age of JWKS responses.
func (s *Server) SetJWKSMaxAge(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxAge = d
}

// SetJWKSDown makes the JWKS endpoint answer 503 (down) or recover.
func (s *Server) SetJWKSDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jwksDown = down
}

// SetJWKSBody makes the JWKS endpoint serve b verbatim; nil restores the
// real key set.
func (s *Server) SetJWKSBody(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jwksBody = b
}

// JWKSFetches counts requests to the JWKS endpoint.
func (s *Server) JWKSFetches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jwksFetches
}

// IdentityRequests counts identity tokens minted over HTTP.
func (s *Server) IdentityRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.identities
}

// Claims returns the claims the metadata server would sign now for
// audience: in full format with google.compute_engine (and license_id if
// licenses), else the standard ones. The maps are fresh: change them and
// Sign them to make hostile tokens.
func (s *Server) Claims(audience string, full, licenses bool) map[string]any {
	s.mu.Lock()
	inst, ttl := s.inst, s.tokenTTL
	s.mu.Unlock()
	now := s.clock().Unix()
	c := map[string]any{
		"iss":            Issuer,
		"aud":            audience,
		"azp":            "117" + strconv.FormatInt(inst.ProjectNumber, 10),
		"sub":            "117" + strconv.FormatInt(inst.ProjectNumber, 10),
		"email":          inst.Email,
		"email_verified": true,
		"iat":            now,
		"exp":            now + int64(ttl/time.Second),
	}
	if full {
		ce := map[string]any{
			"project_id":                  inst.ProjectID,
			"project_number":              inst.ProjectNumber,
			"zone":                        inst.Zone,
			"instance_id":                 inst.InstanceID,
			"instance_name":               inst.InstanceName,
			"instance_creation_timestamp": inst.Created.Unix(),
		}
		if licenses && len(inst.Licenses) > 0 {
			ce["license_id"] = inst.Licenses
		}
		c["google"] = map[string]any{"compute_engine": ce}
	}
	return c
}

// ComputeEngine returns the google.compute_engine map of claims made by
// Claims, to change.
func ComputeEngine(claims map[string]any) map[string]any {
	return claims["google"].(map[string]any)["compute_engine"].(map[string]any)
}

// Mint returns the token the metadata server would mint now for audience
// in full format, without going through HTTP.
func (s *Server) Mint(tb TB, audience string) string {
	return s.Sign(tb, s.Claims(audience, true, false))
}

// Sign signs claims as the metadata server does: RS256 with the current
// key, header {alg, kid, typ: JWT}.
func (s *Server) Sign(tb TB, claims map[string]any) string {
	k := s.Key()
	return SignWith(tb, jose.RS256, k.Private, k.ID, claims, nil)
}

// SignWith signs claims with any go-jose algorithm and key (an
// *rsa.PrivateKey, *ecdsa.PrivateKey, or []byte for HMAC), kid in the
// header when non-empty, plus extra header members (jku, jwk, crit, ...).
func SignWith(tb TB, alg jose.SignatureAlgorithm, key any, kid string, claims map[string]any, extra map[string]any) string {
	tb.Helper()
	tok, err := sign(alg, key, kid, claims, extra)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

// sign is SignWith without a testing.TB, for the HTTP handler too.
func sign(alg jose.SignatureAlgorithm, key any, kid string, claims map[string]any, extra map[string]any) (string, error) {
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader("kid", kid)
	}
	for name, v := range extra {
		opts = opts.WithHeader(jose.HeaderKey(name), v)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		return "", err
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", err
	}
	return jws.CompactSerialize()
}

// Unsigned assembles a compact JWS from a header and claims, with the
// given signature bytes (nil for alg "none"), by hand: for headers no
// signer would write.
func Unsigned(tb TB, header, claims map[string]any, sig []byte) string {
	tb.Helper()
	h, err := json.Marshal(header)
	if err != nil {
		tb.Fatal(err)
	}
	p, err := json.Marshal(claims)
	if err != nil {
		tb.Fatal(err)
	}
	e := base64.RawURLEncoding
	return e.EncodeToString(h) + "." + e.EncodeToString(p) + "." + e.EncodeToString(sig)
}

// JWKS returns the JSON Web Key Set of keys, as Google publishes it.
func JWKS(keys ...Key) []byte {
	set := jose.JSONWebKeySet{}
	for _, k := range keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Public(), KeyID: k.ID, Algorithm: string(jose.RS256), Use: "sig"})
	}
	b, err := json.Marshal(set)
	if err != nil {
		panic(err) // public RSA keys always marshal
	}
	return b
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == JWKSPath:
		s.serveJWKS(w, r)
	case strings.HasPrefix(r.URL.Path, "/computeMetadata/v1/"):
		s.serveMetadata(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (s *Server) serveJWKS(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.jwksFetches++
	down, body, maxAge, keys := s.jwksDown, s.jwksBody, s.maxAge, append([]Key(nil), s.published...)
	s.mu.Unlock()
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if down {
		http.Error(w, "backend unavailable", http.StatusServiceUnavailable)
		return
	}
	if body == nil {
		body = JWKS(keys...)
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.Header().Set("Cache-Control", fmt.Sprintf("public, max-age=%d, must-revalidate, no-transform", int64(maxAge/time.Second)))
	w.Write(body)
}

// serveMetadata behaves as the GCE metadata server does for the paths it
// knows.
func (s *Server) serveMetadata(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Metadata-Flavor", "Google")
	w.Header().Set("Server", "Metadata Server for VM")
	if r.Header.Get("Metadata-Flavor") != "Google" || r.Header.Get("X-Forwarded-For") != "" {
		http.Error(w, "Your client does not have permission to get URL "+r.URL.Path+" from this server. Missing Metadata-Flavor:Google header.", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	inst := s.Instance()
	text := func(v string) {
		w.Header().Set("Content-Type", "application/text")
		w.Write([]byte(v))
	}
	switch strings.TrimPrefix(r.URL.Path, "/computeMetadata/v1/") {
	case "instance/service-accounts/default/identity":
		q := r.URL.Query()
		aud := q.Get("audience")
		if aud == "" {
			http.Error(w, "non-empty audience parameter required", http.StatusBadRequest)
			return
		}
		var full bool
		switch q.Get("format") {
		case "", "standard":
		case "full":
			full = true
		default:
			http.Error(w, "invalid format parameter", http.StatusBadRequest)
			return
		}
		licenses := strings.EqualFold(q.Get("licenses"), "TRUE")
		k := s.Key()
		tok, err := sign(jose.RS256, k.Private, k.ID, s.Claims(aud, full, licenses), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		s.mu.Lock()
		s.identities++
		s.mu.Unlock()
		text(tok)
	case "instance/id":
		text(inst.InstanceID)
	case "instance/name":
		text(inst.InstanceName)
	case "instance/zone":
		text(fmt.Sprintf("projects/%d/zones/%s", inst.ProjectNumber, inst.Zone))
	case "project/project-id":
		text(inst.ProjectID)
	case "project/numeric-project-id":
		text(strconv.FormatInt(inst.ProjectNumber, 10))
	default:
		http.NotFound(w, r)
	}
}
