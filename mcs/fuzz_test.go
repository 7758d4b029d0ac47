package mcs_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/seal"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// FuzzAttestRequests sends arbitrary bodies to /attest/v1/challenge and
// /attest/v1/verify (what any network peer may send): the server must not
// panic, must answer with a status from its table, and every refusal must
// carry a JSON body with a reason.
func FuzzAttestRequests(f *testing.F) {
	clock := time.Now
	_, pol, st, keys := fuzzState(f, clock)
	v, err := tpm.NewVerifier(tpm.Options{Clock: clock})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := mcs.New(mcs.Options{Policy: pol, Configs: &staticConfigs{}, Store: st, Keys: keys, Verifiers: attest.Registry{attest.KindTPM: v.Seam()},
		Clock: clock, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	h := srv.Handler(mcs.Secure)
	// Real TPM messages: the exchanges attest/tpm captured from swtpm and
	// the simulator.
	names, _ := filepath.Glob("../attest/tpm/testdata/exchanges/*.json")
	if len(names) == 0 {
		f.Fatal("no captured TPM exchanges")
	}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		var x struct {
			Request  tpm.ChallengeRequest `json:"request"`
			Evidence tpm.Evidence         `json:"evidence"`
		}
		if err := json.Unmarshal(b, &x); err != nil {
			f.Fatal(err)
		}
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		key, _ := x509.MarshalPKIXPublicKey(k.Public())
		ch, _ := json.Marshal(api.ChallengeRequest{Kind: attest.KindTPM, Pool: "worker", KubeletPublicKey: key, NodeName: "worker-0", Request: api.Message(&x.Request)})
		vr, _ := json.Marshal(api.VerifyRequest{Session: "np1.AAAA", KubeletKeyProof: []byte{1}, Kind: attest.KindTPM, Evidence: api.Message(&x.Evidence)})
		f.Add(true, ch)
		f.Add(false, vr)
	}
	for _, seed := range []string{
		`{"kind":"tpm","pool":"worker","kubeletPublicKey":"AAAA","tpm":{"ekPublic":"AAAA"}}`,
		`{"session":"np1.AAAA","tpm":{"kubeletKeySHA256":"AAAA","quotes":[{"quote":"AA","signature":"AA"}]}}`,
		`{"kind":"gcp","pool":"worker","kubeletPublicKey":"MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE","gcp":{}}`,
		`{"kind":"aws","pool":"worker"} {"x":1}`,
		`[]`, `null`, ``,
	} {
		f.Add(true, []byte(seed))
		f.Add(false, []byte(seed))
	}
	allowed := map[int]bool{200: true, 400: true, 403: true, 404: true, 413: true, 503: true}
	f.Fuzz(func(t *testing.T, challenge bool, body []byte) {
		path := api.PathVerify
		if challenge {
			path = api.PathChallenge
		}
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if !allowed[rec.Code] {
			t.Fatalf("status %d for %q", rec.Code, body)
		}
		if rec.Code == http.StatusOK {
			if !challenge {
				t.Fatalf("a fuzzed verify body was accepted: %q", body)
			}
			return
		}
		var r api.Refusal
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || r.Reason == "" {
			t.Fatalf("refusal body %q: %v", rec.Body.Bytes(), err)
		}
	})
}

// fuzzConfigs serves fixed bytes and remembers what the last request got:
// whether the full tier was rendered and for which record.
type fuzzConfigs struct {
	mu   sync.Mutex
	full bool
	node *store.Record
}

func (c *fuzzConfigs) Pools() []string {
	return []string{"worker", "master", "infra", "legacy", "broken"}
}

func (c *fuzzConfigs) Public(pool, accept string) ([]byte, error) {
	if !slices.Contains(c.Pools(), pool) {
		return nil, mcs.ErrUnknownPool
	}
	return []byte(`{"tier":"public"}`), nil
}

func (c *fuzzConfigs) Full(pool, accept string, node *store.Record) ([]byte, error) {
	if !slices.Contains(c.Pools(), pool) {
		return nil, mcs.ErrUnknownPool
	}
	c.mu.Lock()
	c.full, c.node = true, node
	c.mu.Unlock()
	return []byte(`{"tier":"full","secret":"pull-secret"}`), nil
}

func (c *fuzzConfigs) last() (bool, *store.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	full, node := c.full, c.node
	c.full, c.node = false, nil
	return full, node
}

// FuzzConfigRequest sends arbitrary GET|HEAD /config requests — request
// line (method, path, query with ?token=), Accept and Authorization, on
// either port — parsed by net/http as the listener would, to the server
// with the test policy (worker: token tier and attested; master: attested;
// infra: nothing public; legacy: full without credentials). It holds real
// credentials: provisioning tokens (current and rotated-out) and config
// tokens for records of worker and master. Properties:
//   - the status is one of 200, 400, 401, 403, 404, 405, 503; every
//     refusal is a JSON body with a reason, 503 carries Retry-After and
//     401 WWW-Authenticate;
//   - a 200 with the full config happens only for legacy (and not on the
//     plain port with credentials), for a worker request carrying a valid
//     provisioning token over TLS, or for the pool of a config token the
//     request carries, whose record it is — and each config token is
//     delivered by GET at most once;
//   - the plain-HTTP port never serves a config to a request carrying a
//     credential.
func FuzzConfigRequest(f *testing.F) {
	now := time.Now()
	clock := func() time.Time { return now }
	dir, pol, st, keys := fuzzState(f, clock)
	prov, err := tokens.LoadProvisioning(filepath.Join(dir, "tokens.json"), time.Hour, clock)
	if err != nil {
		f.Fatal(err)
	}
	prevProv := prov.Current()
	if err := prov.Rotate(); err != nil {
		f.Fatal(err)
	}
	curProv := prov.Current()
	configs := &fuzzConfigs{}
	srv, err := mcs.New(mcs.Options{Policy: pol, Configs: configs, Store: st, Keys: keys, Provisioning: prov,
		Clock: clock, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	handlers := map[bool]http.Handler{true: srv.Handler(mcs.Secure), false: srv.Handler(mcs.Insecure)}

	// A record and a config token for one node of worker and one of master,
	// and an expired token.
	configTokens := map[string]string{} // record ID -> token
	tokenPool := map[string]string{}    // token -> pool
	issue := func(id, pool string, exp time.Time) string {
		rec := &store.Record{ID: id, NodeName: id, Pool: pool, Kind: attest.KindTPM, Identity: "tpm-ek:" + id,
			KubeletKeySHA256: make([]byte, 32), CreatedAt: now, Expires: now.Add(time.Hour)}
		if err := st.CreateRecord(context.Background(), rec); err != nil {
			f.Fatal(err)
		}
		tok, err := tokens.IssueConfigToken(keys, tokens.ConfigToken{ID: "jti-" + id, RecordID: id, NodeName: id, Pool: pool, Expires: exp})
		if err != nil {
			f.Fatal(err)
		}
		configTokens[id], tokenPool[tok] = tok, pool
		return tok
	}
	worker := issue("worker-0", "worker", now.Add(10*time.Minute))
	master := issue("master-0", "master", now.Add(10*time.Minute))
	expired := issue("worker-1", "worker", now.Add(-time.Second))
	delivered := map[string]int{} // record ID -> full configs delivered by GET

	const ign = "application/vnd.coreos.ignition+json;version=3.4.0, */*;q=0.1"
	for _, s := range []struct {
		secure                         bool
		method, target, accept, header string
	}{
		{true, "GET", "/config/worker", ign, "Bearer " + curProv},
		{true, "GET", "/config/worker?token=" + prevProv, "", ""},
		{true, "HEAD", "/config/worker", ign, "Bearer " + worker},
		{true, "GET", "/config/worker", ign, "Bearer " + worker},
		{true, "GET", "/config/master?token=" + master, ign, ""},
		{true, "GET", "/config/worker", ign, "Bearer " + master},
		{true, "GET", "/config/worker", "", "bearer " + expired},
		{true, "GET", "/config/master", ign, "Bearer " + curProv},
		{false, "GET", "/config/worker?token=" + curProv, "", ""},
		{false, "GET", "/config/legacy", "", ""},
		{true, "GET", "/config/legacy", "application/vnd.coreos.ignition+json;version=4.0.0", "Basic " + curProv},
		{true, "GET", "/config/infra", "", ""},
		{true, "GET", "/config/../config/worker", "", "Bearer " + curProv},
		{true, "GET", "/config/worker%2F..%2Flegacy", "", ""},
		{true, "GET", "/config//legacy", "", ""},
		{true, "GET", "http://mcs/config/legacy?token=x&token=" + curProv, "", ""},
		{true, "POST", "/config/legacy", "", ""},
		{true, "GET", "/healthz", "", ""},
		{true, "GET", "/config/Worker", "", ""},
	} {
		f.Add(s.secure, s.method, s.target, s.accept, s.header)
	}
	allowed := map[int]bool{200: true, 400: true, 401: true, 403: true, 404: true, 405: true, 503: true}
	f.Fuzz(func(t *testing.T, secure bool, method, target, accept, authorization string) {
		raw := method + " " + target + " HTTP/1.1\r\nHost: mcs.example\r\n"
		if accept != "" {
			raw += "Accept: " + accept + "\r\n"
		}
		if authorization != "" {
			raw += "Authorization: " + authorization + "\r\n"
		}
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw + "\r\n")))
		if err != nil {
			return // net/http answers 400 before any handler
		}
		req.RemoteAddr = "192.0.2.7:40000"
		rec := httptest.NewRecorder()
		handlers[secure].ServeHTTP(rec, req)
		full, node := configs.last()
		if !allowed[rec.Code] {
			t.Fatalf("status %d for %q", rec.Code, raw)
		}
		if rec.Code != http.StatusOK {
			var r api.Refusal
			if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || r.Reason == "" {
				t.Fatalf("refusal body %q: %v", rec.Body.Bytes(), err)
			}
			switch {
			case rec.Code == http.StatusServiceUnavailable && rec.Header().Get("Retry-After") == "":
				t.Fatal("503 without Retry-After")
			case rec.Code == http.StatusUnauthorized && rec.Header().Get("WWW-Authenticate") == "":
				t.Fatal("401 without WWW-Authenticate")
			}
			return
		}
		pool := strings.TrimPrefix(req.URL.Path, "/config/")
		creds := req.Header.Values("Authorization")
		creds = append(creds, req.URL.RawQuery)
		carries := func(tok string) bool {
			for _, c := range creds {
				if strings.Contains(c, tok) {
					return true
				}
			}
			return false
		}
		// What the request presented: Authorization or a query at all.
		credentialed := len(req.Header.Values("Authorization")) > 0 || req.URL.Query().Has("token")
		if !secure && credentialed && strings.HasPrefix(req.URL.Path, api.PathConfig) {
			t.Fatalf("the plain port served %q with credentials", raw)
		}
		if !full {
			return
		}
		switch {
		case node != nil:
			tok := configTokens[node.ID]
			if tok == "" || !carries(tok) || tokenPool[tok] != pool || node.Pool != pool || !secure {
				t.Fatalf("full config for record %s (pool %s) served for %q", node.ID, node.Pool, raw)
			}
			if node.ID == "worker-1" {
				t.Fatal("an expired config token was honoured")
			}
			if req.Method == http.MethodGet {
				if delivered[node.ID]++; delivered[node.ID] > 1 {
					t.Fatalf("config token of %s delivered twice", node.ID)
				}
			}
		case pool == "legacy":
		case pool == "worker" && secure && (carries(curProv) || carries(prevProv)):
		default:
			t.Fatalf("full config of %q served without a valid credential: %q", pool, raw)
		}
	})
}

// fuzzState is what a fuzz target's server stands on: a directory, the
// test policy, a fresh embedded store (closed when the target ends) and a
// fresh keyring.
func fuzzState(f *testing.F, clock func() time.Time) (string, *policy.Policy, *boltstore.Store, *seal.Keyring) {
	f.Helper()
	dir := f.TempDir()
	pol := testPolicy(f)
	st, err := boltstore.Open(filepath.Join(dir, "state.db"), time.Second, clock)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	keys, err := seal.LoadOrCreate(filepath.Join(dir, "keys.json"), clock)
	if err != nil {
		f.Fatal(err)
	}
	return dir, pol, st, keys
}
