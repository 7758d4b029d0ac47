package mcs_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/seal"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// testPolicy: worker takes TPM evidence with Secure Boot, and the
// provisioning token; master TPM evidence; infra serves no public tier;
// legacy serves everything without credentials; broken has nothing.
func testPolicy(t testing.TB) *policy.Policy {
	return policytest.New().
		Pool("worker", policytest.TPM().SecureBoot().Token().Requested()).
		Pool("master", policytest.TPM().Requested()).
		Pool("infra", policytest.Public().Private()).
		Pool("legacy", policytest.Public().Edit(func(p *policy.Pool) { p.Serve.FullWithoutCredentials = true })).
		Pool("broken", policytest.Public()).Must(t)
}

// staticConfigs serves fixed bytes and remembers which record asked.
type staticConfigs struct {
	mu       sync.Mutex
	lastNode *store.Record
}

func (c *staticConfigs) Pools() []string {
	return []string{"worker", "master", "infra", "legacy", "broken"}
}

func (c *staticConfigs) known(pool string) bool {
	return slices.Contains(c.Pools(), pool)
}

func (c *staticConfigs) Public(pool, accept string) ([]byte, error) {
	if !c.known(pool) {
		return nil, mcs.ErrUnknownPool
	}
	if pool == "broken" {
		return nil, errors.New("the inputs of pool broken do not render")
	}
	return []byte(`{"tier":"public","pool":"` + pool + `"}`), nil
}

func (c *staticConfigs) Full(pool, accept string, node *store.Record) ([]byte, error) {
	if !c.known(pool) {
		return nil, mcs.ErrUnknownPool
	}
	c.mu.Lock()
	c.lastNode = node
	c.mu.Unlock()
	return []byte(`{"tier":"full","pool":"` + pool + `","secret":"pull-secret"}`), nil
}

type env struct {
	t       *testing.T
	offset  time.Duration // the clock is real time plus offset
	mu      sync.Mutex
	secure  *httptest.Server
	plain   *httptest.Server
	store   *boltstore.Store
	prov    *tokens.Provisioning
	configs *staticConfigs
	man     *swtpm.Manufacturer
	// opts are the server's options; keysPath its keyring file; srv the
	// server.
	opts     mcs.Options
	srv      *mcs.Server
	keysPath string
	log      testenv.LockedBuffer
	events   eventLog
}

// eventLog records the Events the server publishes (mcs.EnrolmentEvents).
type eventLog struct {
	mu  sync.Mutex
	evs []string // "node warning reason: message"
	// identities are the identities of evs' decisions ("report" for a
	// report).
	identities []string
}

func (l *eventLog) Decision(identity, node string, warning bool, reason, message string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, fmt.Sprintf("%s %v %s: %s", node, warning, reason, message))
	l.identities = append(l.identities, identity)
}

func (l *eventLog) Report(node, reason, message string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, fmt.Sprintf("%s %v %s: %s", node, true, reason, message))
	l.identities = append(l.identities, "report")
}

func (l *eventLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.evs...)
}

func (e *env) clock() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return time.Now().Add(e.offset)
}

func (e *env) advance(d time.Duration) {
	e.mu.Lock()
	e.offset += d
	e.mu.Unlock()
}

var (
	manOnce sync.Once
	man     *swtpm.Manufacturer
	manErr  error
)

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, nil)
}

// newEnvWith serves configs (the static test configs when nil).
func newEnvWith(t *testing.T, configs mcs.Configs) *env {
	t.Helper()
	return newEnvLimits(t, configs, mcs.Limits{})
}

// newEnvLimits is newEnvWith with admission limits.
func newEnvLimits(t *testing.T, configs mcs.Configs, limits mcs.Limits) *env {
	t.Helper()
	return newEnvPolicy(t, configs, limits, testPolicy(t), nil)
}

// newEnvPolicy is newEnvLimits with a policy of its own (its pools among
// staticConfigs') and metrics.
func newEnvPolicy(t *testing.T, configs mcs.Configs, limits mcs.Limits, pol *policy.Policy, metrics *mcs.Metrics) *env {
	t.Helper()
	e := &env{t: t, configs: &staticConfigs{}}
	if configs == nil {
		configs = e.configs
	}
	dir := t.TempDir()
	var err error
	if e.store, err = boltstore.Open(filepath.Join(dir, "state.db"), time.Second, e.clock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.store.Close() })
	keys, err := seal.LoadOrCreate(filepath.Join(dir, "keys.json"), e.clock)
	if err != nil {
		t.Fatal(err)
	}
	if e.prov, err = tokens.LoadProvisioning(filepath.Join(dir, "tokens.json"), time.Hour, e.clock); err != nil {
		t.Fatal(err)
	}
	manOnce.Do(func() {
		var d string
		if d, manErr = os.MkdirTemp("", "mcs-test-vendor-"); manErr == nil {
			man, manErr = swtpm.NewManufacturer(d)
		}
	})
	if manErr != nil {
		t.Fatal(manErr)
	}
	e.man = man
	// The manufacturer's CA exists once a TPM was provisioned.
	if err := man.Provision(context.Background(), filepath.Join(dir, "warmup")); err != nil {
		t.Fatal(err)
	}
	rootsDir, err := man.RootsDir()
	if err != nil {
		t.Fatal(err)
	}
	set, err := tpm.LoadRootSet("vendor", rootsDir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tpm.NewVerifier(tpm.Options{Roots: []tpm.RootSet{set}, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	e.keysPath = filepath.Join(dir, "keys.json")
	e.opts = mcs.Options{
		Policy: pol, Configs: configs, Store: e.store, Keys: keys, Provisioning: e.prov, Verifiers: attest.Registry{attest.KindTPM: v.Seam()},
		Limits: limits, Clock: e.clock, Log: slog.New(slog.NewJSONHandler(&e.log, nil)), Events: &e.events, Metrics: metrics,
	}
	srv, err := mcs.New(e.opts)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	e.secure = httptest.NewTLSServer(srv.Handler(mcs.Secure))
	e.plain = httptest.NewServer(srv.Handler(mcs.Insecure))
	t.Cleanup(e.secure.Close)
	t.Cleanup(e.plain.Close)
	return e
}

type result struct {
	status int
	body   []byte
	header http.Header
	reason attest.Reason
	// closed: the server closes the connection after this response.
	closed bool
}

func (e *env) do(method, url string, body []byte, header map[string]string) result {
	e.t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	client := e.secure.Client()
	resp, err := client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := result{status: resp.StatusCode, body: b, header: resp.Header, closed: resp.Close}
	if resp.StatusCode >= 400 {
		var ref api.Refusal
		if err := json.Unmarshal(b, &ref); err != nil {
			e.t.Fatalf("refusal body is not JSON: %q", b)
		}
		r.reason = ref.Reason
	}
	return r
}

// machine is a swtpm node with a kubelet key.
type machine struct {
	kubelet   *ecdsa.PrivateKey
	collector *tpm.Collector
	keyDER    []byte
	keySHA    []byte
}

func (e *env) newMachine(log []byte) *machine {
	t := e.t
	t.Helper()
	m, err := e.man.NewMachine(context.Background(), t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &machine{kubelet: m.Kubelet, collector: m.Collector, keyDER: m.KubeletDER, keySHA: m.KubeletSHA}
}

func (e *env) challenge(m *machine, pool, node string) (*api.ChallengeResponse, result) {
	return e.challengeAt(e.secure.URL, m, pool, node)
}

func (e *env) verifyBody(m *machine, ch *api.ChallengeResponse) []byte {
	ev, err := m.collector.Answer(tpmChallenge(e.t, ch), m.keySHA)
	if err != nil {
		e.t.Fatal(err)
	}
	body, _ := json.Marshal(api.VerifyRequest{Session: ch.Session, Kind: attest.KindTPM, Evidence: api.Message(ev)})
	return body
}

func (e *env) verify(body []byte) (*api.VerifyResponse, result) {
	return e.verifyAt(e.secure.URL, body)
}

func bearer(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }

func TestTiers(t *testing.T) {
	e := newEnv(t)
	prev := e.prov.Current()
	if err := e.prov.Rotate(); err != nil {
		t.Fatal(err)
	}
	cur := e.prov.Current()
	cases := []struct {
		name       string
		method     string
		url        string
		header     map[string]string
		wantStatus int
		wantTier   string
		wantReason attest.Reason
	}{
		{"no credentials gets the public tier", "GET", e.secure.URL + "/config/worker", nil, 200, "public", ""},
		{"curl's Accept", "GET", e.secure.URL + "/config/worker", map[string]string{"Accept": "*/*"}, 200, "public", ""},
		{"HEAD", "HEAD", e.secure.URL + "/config/worker", nil, 200, "", ""},
		{"provisioning token", "GET", e.secure.URL + "/config/worker", bearer(cur), 200, "full", ""},
		{"previous token within grace", "GET", e.secure.URL + "/config/worker", bearer(prev), 200, "full", ""},
		{"token as query parameter", "GET", e.secure.URL + "/config/worker?token=" + strings.ReplaceAll(cur, "+", "%2B"), nil, 200, "full", ""},
		{"wrong token", "GET", e.secure.URL + "/config/worker", bearer("bm90IGEgdG9rZW4="), 403, "", attest.ReasonTokenInvalid},
		{"token on a pool without the token tier", "GET", e.secure.URL + "/config/master", bearer(cur), 403, "", attest.ReasonTierDisabled},
		{"public tier off", "GET", e.secure.URL + "/config/infra", nil, 401, "", attest.ReasonCredentials},
		{"unknown pool", "GET", e.secure.URL + "/config/nosuch", nil, 404, "", attest.ReasonUnknownPool},
		{"POST", "POST", e.secure.URL + "/config/worker", nil, 405, "", attest.ReasonMethodNotAllowed},
		{"dot-dot", "GET", e.secure.URL + "/config/../config/worker", nil, 400, "", attest.ReasonBadPath},
		{"encoded slash", "GET", e.secure.URL + "/config/..%2Fconfig%2Fworker", nil, 400, "", attest.ReasonBadPath},
		{"not a pool name", "GET", e.secure.URL + "/config/Worker_1", nil, 400, "", attest.ReasonBadPath},
		{"plain port, no credentials", "GET", e.plain.URL + "/config/worker", nil, 200, "public", ""},
		{"plain port refuses credentials", "GET", e.plain.URL + "/config/worker", bearer(cur), 403, "", attest.ReasonInsecurePort},
		{"plain port refuses any Authorization", "GET", e.plain.URL + "/config/legacy", map[string]string{"Authorization": "Basic " + cur}, 403, "", attest.ReasonInsecurePort},
		{"plain port refuses a token beside another Authorization", "GET", e.plain.URL + "/config/worker?token=" + cur, map[string]string{"Authorization": "0"}, 403, "", attest.ReasonInsecurePort},
		{"plain port refuses attestation", "POST", e.plain.URL + api.PathChallenge, nil, 403, "", attest.ReasonInsecurePort},
		{"healthz", "GET", e.secure.URL + "/healthz", nil, 200, "", ""},
		{"anything else", "GET", e.secure.URL + "/etc/passwd", nil, 404, "", attest.ReasonNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(tc.method, tc.url, nil, tc.header)
			if r.status != tc.wantStatus || r.reason != tc.wantReason {
				t.Fatalf("status %d reason %q (%s); want %d %q", r.status, r.reason, r.body, tc.wantStatus, tc.wantReason)
			}
			if tc.wantTier != "" && !bytes.Contains(r.body, []byte(`"tier":"`+tc.wantTier+`"`)) {
				t.Fatalf("body %s is not the %s tier", r.body, tc.wantTier)
			}
			if r.status == 200 && strings.HasPrefix(tc.url, e.secure.URL+"/config") {
				if r.header.Get("Content-Type") != "application/json" || r.header.Get("Content-Length") == "" {
					t.Fatalf("headers %v", r.header)
				}
			}
			if tc.wantStatus == 405 && r.header.Get("Allow") == "" {
				t.Fatal("405 without Allow")
			}
		})
	}
	// The token never appears in the log.
	if strings.Contains(e.log.String(), cur) || strings.Contains(e.log.String(), prev) {
		t.Fatal("a provisioning token was logged")
	}
}

func TestAttestedFetch(t *testing.T) {
	e := newEnv(t)
	m := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	ch, r := e.challenge(m, "worker", "worker-7")
	if ch == nil {
		t.Fatalf("challenge refused: %d %s", r.status, r.body)
	}
	body := e.verifyBody(m, ch)
	vr, r := e.verify(body)
	if vr == nil {
		t.Fatalf("verify refused: %d %s", r.status, r.body)
	}
	if vr.NodeName != "worker-7" || vr.Pool != "worker" {
		t.Fatalf("verify response %+v", vr)
	}
	rec, err := e.store.GetRecord(context.Background(), vr.Record)
	if err != nil || !bytes.Equal(rec.KubeletKeySHA256, m.keySHA) || rec.NodeName != "worker-7" {
		t.Fatalf("record %+v %v", rec, err)
	}

	steps := []struct {
		name       string
		do         func() result
		wantStatus int
		wantReason attest.Reason
	}{
		{"token for another pool", func() result { return e.do("GET", e.secure.URL+"/config/master", nil, bearer(vr.ConfigToken)) }, 403, attest.ReasonTokenWrongPool},
		{"HEAD does not spend the token", func() result { return e.do("HEAD", e.secure.URL+"/config/worker", nil, bearer(vr.ConfigToken)) }, 200, ""},
		{"the full config, for this node", func() result { return e.do("GET", e.secure.URL+"/config/worker", nil, bearer(vr.ConfigToken)) }, 200, ""},
		{"the token is single-use", func() result { return e.do("GET", e.secure.URL+"/config/worker", nil, bearer(vr.ConfigToken)) }, 403, attest.ReasonTokenUsed},
		{"the session answered again after its config was delivered", func() result { _, r := e.verify(body); return r }, 403, attest.ReasonSessionReused},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			r := s.do()
			if r.status != s.wantStatus || r.reason != s.wantReason {
				t.Fatalf("status %d reason %q (%s); want %d %q", r.status, r.reason, r.body, s.wantStatus, s.wantReason)
			}
			// A delivered config ends its connection (the machine asks
			// nothing more; no idle TLS connection is held for it); a HEAD
			// delivers nothing and keeps it.
			if wantClosed := r.status == 200 && s.name != "HEAD does not spend the token"; r.closed != wantClosed {
				t.Fatalf("connection closed after the response: %v, want %v", r.closed, wantClosed)
			}
		})
	}
	if e.configs.lastNode == nil || e.configs.lastNode.ID != vr.Record {
		t.Fatal("the full config was not rendered for the attested node's record")
	}
	if recs, _ := e.store.RecordsForNode(context.Background(), "worker-7"); len(recs) != 1 {
		t.Fatalf("%d records for the node; answering the session again must write none", len(recs))
	}
	if strings.Contains(e.log.String(), vr.ConfigToken) || strings.Contains(e.log.String(), ch.Session) {
		t.Fatal("a token or session was logged")
	}

	// A token that expired before use (another machine: this one enrolled).
	m2 := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	ch2, _ := e.challenge(m2, "worker", "worker-8")
	vr2, r := e.verify(e.verifyBody(m2, ch2))
	if vr2 == nil {
		t.Fatalf("second attestation refused: %s", r.body)
	}
	e.advance(11 * time.Minute)
	if r := e.do("GET", e.secure.URL+"/config/worker", nil, bearer(vr2.ConfigToken)); r.reason != attest.ReasonTokenExpired {
		t.Fatalf("expired token: %d %q", r.status, r.reason)
	}
}

// TestBadInputAttacks: every malformed or hostile request is a clear 4xx with its
// reason, and nothing is written to the store.
func TestBadInputAttacks(t *testing.T) {
	e := newEnv(t)
	m := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	ch, r := e.challenge(m, "worker", "node-x")
	if ch == nil {
		t.Fatalf("challenge refused: %s", r.body)
	}
	good := e.verifyBody(m, ch)
	tampered := bytes.Replace(good, []byte(ch.Session[:20]), []byte(ch.Session[:19]+"A"), 1)
	if bytes.Equal(tampered, good) {
		tampered = bytes.Replace(good, []byte(ch.Session[:20]), []byte(ch.Session[:19]+"B"), 1)
	}
	var unknownField map[string]any
	json.Unmarshal(good, &unknownField)
	unknownField["extra"] = true
	withUnknown, _ := json.Marshal(unknownField)

	cases := []struct {
		name       string
		path       string
		body       []byte
		wantStatus int
		wantReason attest.Reason
	}{
		{"oversized challenge", api.PathChallenge, bytes.Repeat([]byte("A"), api.MaxChallengeBody+1), 413, attest.ReasonBodyTooLarge},
		{"oversized evidence", api.PathVerify, bytes.Repeat([]byte("A"), api.MaxVerifyBody+1), 413, attest.ReasonBodyTooLarge},
		{"malformed JSON", api.PathVerify, []byte(`{"session":`), 400, attest.ReasonMalformedRequest},
		{"two JSON values", api.PathVerify, append(append([]byte(nil), good...), good...), 400, attest.ReasonMalformedRequest},
		{"unknown field", api.PathVerify, withUnknown, 400, attest.ReasonMalformedRequest},
		{"tampered session", api.PathVerify, tampered, 403, attest.ReasonSessionInvalid},
		{"pool not in policy", api.PathChallenge, []byte(`{"kind":"tpm","pool":"nosuch","kubeletPublicKey":"AA=="}`), 403, attest.ReasonPolicyUnknownPool},
		{"kind the pool does not take", api.PathChallenge, []byte(`{"kind":"gcp","pool":"worker","kubeletPublicKey":"AA=="}`), 403, attest.ReasonPolicyKindNotAllowed},
		{"kubelet key not PKIX", api.PathChallenge, []byte(`{"kind":"tpm","pool":"worker","kubeletPublicKey":"AAAA","tpm":{}}`), 400, attest.ReasonMalformed},
		{"bad node name", api.PathChallenge, []byte(`{"kind":"tpm","pool":"worker","nodeName":"../etc","kubeletPublicKey":"AA=="}`), 400, attest.ReasonMalformedRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("POST", e.secure.URL+tc.path, tc.body, nil)
			attacktable.Check(t, "MCS input", tc.name, fmt.Sprintf("%d %s", tc.wantStatus, tc.wantReason), fmt.Sprintf("%d %s", r.status, r.reason))
		})
	}
	// An expired session, answered honestly.
	e.advance(6 * time.Minute)
	if _, r := e.verify(good); r.reason != attest.ReasonSessionExpired {
		t.Fatalf("expired session: %d %q", r.status, r.reason)
	}
	if recs, _ := e.store.RecordsForNode(context.Background(), "node-x"); len(recs) != 0 {
		t.Fatalf("bad input wrote %d records", len(recs))
	}
	if n, _ := e.store.GC(context.Background(), e.clock().Add(24*time.Hour)); n != 0 {
		t.Fatalf("bad input left %d markers or records", n)
	}
}

// TestMigrationAndUnavailable: a pool with serve.fullWithoutCredentials
// serves its full config to anyone (as the OpenShift MCS does) and the
// server says so loudly; what cannot be answered now is a 503 with
// Retry-After, which Ignition and the agent retry.
func TestMigrationAndUnavailable(t *testing.T) {
	e := newEnv(t)
	if !strings.Contains(e.log.String(), `"level":"WARN","msg":"INSECURE`) || !strings.Contains(e.log.String(), `"pool":"legacy"`) {
		t.Fatalf("no loud warning for fullWithoutCredentials:\n%s", e.log.String())
	}
	if r := e.do("GET", e.secure.URL+"/config/legacy", nil, nil); r.status != 200 || !bytes.Contains(r.body, []byte(`"tier":"full"`)) {
		t.Fatalf("legacy pool: %d %s", r.status, r.body)
	}
	r := e.do("GET", e.secure.URL+"/config/broken", nil, nil)
	if r.status != 503 || r.reason != attest.ReasonConfigUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("unrenderable pool: %d %q Retry-After=%q", r.status, r.reason, r.header.Get("Retry-After"))
	}
	if strings.Contains(string(r.body), "do not render") {
		t.Fatal("an internal error's text reached the client")
	}
	// The store goes away (a disk failure; in a cluster, the API server):
	// attestation answers 503, not a refusal.
	m := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	ch, _ := e.challenge(m, "worker", "node-y")
	body := e.verifyBody(m, ch)
	e.store.Close()
	if _, r := e.verify(body); r.status != 503 || r.reason != attest.ReasonUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("store down: %d %q", r.status, r.reason)
	}
}

// tpmChallenge is ch's TPM challenge.
func tpmChallenge(t testing.TB, ch *api.ChallengeResponse) *tpm.Challenge {
	t.Helper()
	var c tpm.Challenge
	if ch.Kind != attest.KindTPM || json.Unmarshal(ch.Challenge, &c) != nil {
		t.Fatalf("no TPM challenge in %+v", ch)
	}
	return &c
}
