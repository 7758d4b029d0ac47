package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// reply is one scripted answer of a test server.
type reply struct {
	status     int
	retryAfter string // Retry-After header, if any
	body       string
	reset      bool // close the connection without an answer
}

func serve503(retryAfter string) reply {
	return reply{status: http.StatusServiceUnavailable, retryAfter: retryAfter, body: `{"reason":"Unavailable","detail":"not yet"}`}
}

func refuse(status int, reason attest.Reason) reply {
	return reply{status: status, body: fmt.Sprintf(`{"reason":%q,"detail":"because"}`, reason)}
}

var reset = reply{reset: true}

// script answers requests in order; after the last reply, it repeats it.
type script struct {
	mu      sync.Mutex
	replies []reply
	n       int
}

func (s *script) next() reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.replies[min(s.n, len(s.replies)-1)]
	s.n++
	return r
}

func (s *script) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func write(t *testing.T, w http.ResponseWriter, r reply) {
	if r.reset {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		if tc, ok := conn.(interface{ NetConn() net.Conn }); ok {
			if tcp, ok := tc.NetConn().(*net.TCPConn); ok {
				tcp.SetLinger(0) // RST, not FIN
			}
		}
		conn.Close()
		return
	}
	if r.retryAfter != "" {
		w.Header().Set("Retry-After", r.retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(r.status)
	io.WriteString(w, r.body)
}

// tlsClient returns a Client for srv (trusting exactly its certificate)
// whose waits are recorded instead of slept.
func tlsClient(t *testing.T, srv *httptest.Server) (*Client, *[]time.Duration, *[]string) {
	t.Helper()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	c, err := NewClient(srv.URL, ca)
	if err != nil {
		t.Fatal(err)
	}
	var waits []time.Duration
	var progress []string
	c.Sleep = func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		return ctx.Err()
	}
	c.Progress = func(format string, args ...any) { progress = append(progress, fmt.Sprintf(format, args...)) }
	return c, &waits, &progress
}

func secs(s ...int) []time.Duration {
	var out []time.Duration
	for _, v := range s {
		out = append(out, time.Duration(v)*time.Second)
	}
	return out
}

// TestRetry: what the agent does with each kind of answer, against a real
// TLS server: 5xx and transport failures are retried (as the server asks
// with Retry-After, else with doubling backoff up to MaxBackoff), a 4xx
// stops at once with the server's reason.
func TestRetry(t *testing.T) {
	ok := reply{status: http.StatusOK, body: `{"session":"s-1"}`}
	cases := []struct {
		name        string
		replies     []reply
		min, max    time.Duration
		wantWaits   []time.Duration
		wantReqs    int
		wantRefused attest.Reason // "" for success
		wantStatus  int
	}{
		{name: "503 with Retry-After 2 twice, then 200", replies: []reply{serve503("2"), serve503("2"), ok},
			wantWaits: secs(2, 2), wantReqs: 3},
		{name: "Retry-After above the cap is honoured", replies: []reply{serve503("90"), ok},
			max: 30 * time.Second, wantWaits: secs(90), wantReqs: 2},
		{name: "Retry-After of years, or beyond what a Duration holds, waits maxRetryAfter", replies: []reply{serve503("99999999999999"), serve503("3153600000"), ok},
			wantWaits: []time.Duration{maxRetryAfter, maxRetryAfter}, wantReqs: 3},
		{name: "Retry-After below the backoff waits the backoff", replies: []reply{serve503(""), serve503(""), serve503("1"), ok},
			wantWaits: secs(1, 2, 4), wantReqs: 4},
		{name: "503 without Retry-After: backoff doubles, capped at MaxBackoff",
			replies: []reply{serve503(""), serve503(""), serve503(""), serve503(""), serve503(""), serve503(""), ok},
			max:     8 * time.Second, wantWaits: secs(1, 2, 4, 8, 8, 8), wantReqs: 7},
		{name: "500 and 502 are retried too", replies: []reply{{status: 500, body: "oops"}, {status: 502}, ok},
			wantWaits: secs(1, 2), wantReqs: 3},
		{name: "connection reset is retried", replies: []reply{reset, reset, ok},
			wantWaits: secs(1, 2), wantReqs: 3},
		{name: "403 refusal stops at once", replies: []reply{refuse(403, attest.ReasonPolicySecureBootOff), ok},
			wantReqs: 1, wantRefused: attest.ReasonPolicySecureBootOff, wantStatus: 403},
		{name: "401 refusal stops at once", replies: []reply{refuse(401, "CredentialsRequired"), ok},
			wantReqs: 1, wantRefused: "CredentialsRequired", wantStatus: 401},
		{name: "a refusal after retries stops there", replies: []reply{serve503("3"), refuse(403, attest.ReasonEKUntrusted), ok},
			wantWaits: secs(3), wantReqs: 2, wantRefused: attest.ReasonEKUntrusted, wantStatus: 403},
		{name: "a 4xx without a JSON body is still final", replies: []reply{{status: 404, body: "404 page not found"}, ok},
			wantReqs: 1, wantRefused: "Unknown", wantStatus: 404},
		{name: "a 4xx whose JSON names no reason is Unknown", replies: []reply{{status: 400, body: `{"detail":"x"}`}, ok},
			wantReqs: 1, wantRefused: "Unknown", wantStatus: 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &script{replies: tc.replies}
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != api.PathChallenge || r.Method != http.MethodPost {
					t.Errorf("%s %s", r.Method, r.URL.Path)
				}
				write(t, w, s.next())
			}))
			defer srv.Close()
			c, waits, progress := tlsClient(t, srv)
			c.MinBackoff, c.MaxBackoff = tc.min, tc.max
			var out api.ChallengeResponse
			attempts, err := c.post(context.Background(), api.PathChallenge, map[string]string{"kind": "tpm"}, &out)
			if tc.wantRefused == "" {
				if err != nil {
					t.Fatalf("err %v", err)
				}
				if out.Session != "s-1" {
					t.Errorf("decoded %+v", out)
				}
			} else {
				var r *Refused
				if !errors.As(err, &r) || r.Refusal.Reason != tc.wantRefused || r.Status != tc.wantStatus {
					t.Fatalf("err %v (%T), want a refusal %d %s", err, err, tc.wantStatus, tc.wantRefused)
				}
			}
			if got := s.count(); got != tc.wantReqs || attempts != tc.wantReqs {
				t.Errorf("server saw %d requests, post counted %d; want %d", got, attempts, tc.wantReqs)
			}
			if !slices.Equal(*waits, tc.wantWaits) {
				t.Errorf("waited %v, want %v", *waits, tc.wantWaits)
			}
			if len(*progress) != len(tc.wantWaits) {
				t.Errorf("progress %q: want one line per retry", *progress)
			}
		})
	}
}

// TestRetryWaitBeyondDeadline: a Retry-After longer than what the agent's
// deadline leaves is not waited out to end in a bare deadline error: the
// agent stops at once and says the server's reason, the wait and its
// deadline.
func TestRetryWaitBeyondDeadline(t *testing.T) {
	s := &script{replies: []reply{{status: 503, retryAfter: "600", body: `{"reason":"RateLimited","detail":"come back later"}`}}}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { write(t, w, s.next()) }))
	defer srv.Close()
	c, waits, _ := tlsClient(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out api.ChallengeResponse
	_, err := c.post(ctx, api.PathChallenge, map[string]string{"kind": "tpm"}, &out)
	if err == nil || len(*waits) != 0 || !strings.Contains(err.Error(), "retry in 10m0s, after this agent's deadline") || !strings.Contains(err.Error(), "RateLimited") {
		t.Fatalf("err %v, waits %v; want an immediate error naming the wait, the deadline and the reason", err, *waits)
	}
}

// TestRetryConnectionRefused: no server at all is "not yet", retried
// until the context ends; the error says both why it gave up and the last
// failure.
func TestRetryConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	c, _, _ := tlsClient(t, srv)
	c.BaseURL = "https://" + addr
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var waits []time.Duration
	c.Sleep = func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		if len(waits) == 4 {
			cancel()
		}
		return ctx.Err()
	}
	attempts, err := c.post(ctx, api.PathChallenge, struct{}{}, new(api.ChallengeResponse))
	if attempts != 4 || !slices.Equal(waits, secs(1, 2, 4, 8)) {
		t.Errorf("%d attempts, waits %v; want 4 attempts with waits 1s 2s 4s 8s", attempts, waits)
	}
	var r *Refused
	if errors.As(err, &r) || !errors.Is(err, context.Canceled) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("err %v: want context.Canceled and ECONNREFUSED, not a refusal", err)
	}
}

// TestRetryRealSleep: without the test hook, the wait is a real timer that
// ends with the context.
func TestRetryRealSleep(t *testing.T) {
	s := &script{replies: []reply{serve503("1"), {status: http.StatusOK, body: `{"session":"s-1"}`}}}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { write(t, w, s.next()) }))
	defer srv.Close()
	c, _, _ := tlsClient(t, srv)
	c.Sleep = nil
	c.MinBackoff = 200 * time.Millisecond
	start := time.Now()
	if _, err := c.post(context.Background(), api.PathChallenge, struct{}{}, new(api.ChallengeResponse)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("took %s: Retry-After: 1 was not waited for", took)
	}

	s = &script{replies: []reply{serve503("60")}}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err := c.post(ctx, api.PathChallenge, struct{}{}, new(api.ChallengeResponse))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the context's deadline", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %s: the wait did not end with the context", took)
	}
}

// fakeTPM answers challenges without a TPM: the test server does not
// check evidence, only sessions.
type fakeTPM struct{ requests int }

func (f *fakeTPM) Request() (*tpm.ChallengeRequest, error) {
	f.requests++
	return &tpm.ChallengeRequest{EKPublic: []byte("ek")}, nil
}

func (f *fakeTPM) Answer(ch *tpm.Challenge, keySHA []byte) (*tpm.Evidence, error) {
	return &tpm.Evidence{KubeletKeySHA256: keySHA, ActivationSecret: []byte("secret")}, nil
}

// sessionServer hands out sessions s-1, s-2, … and answers verify per
// session from a script of its own.
type sessionServer struct {
	mu       sync.Mutex
	verify   map[string]*script
	sessions int
	seen     []string // the session of each verify request, in order
}

func (s *sessionServer) handler(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case api.PathChallenge:
			s.mu.Lock()
			s.sessions++
			id := fmt.Sprintf("s-%d", s.sessions)
			s.mu.Unlock()
			json.NewEncoder(w).Encode(api.ChallengeResponse{Session: id, Kind: attest.KindTPM, Challenge: api.Message(&tpm.Challenge{Nonce: []byte("nonce")})})
		case api.PathVerify:
			var req api.VerifyRequest
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				t.Errorf("verify body: %v", err)
			}
			s.mu.Lock()
			s.seen = append(s.seen, req.Session)
			sc := s.verify[req.Session]
			s.mu.Unlock()
			if sc == nil {
				write(t, w, refuse(http.StatusForbidden, attest.ReasonSessionInvalid))
				return
			}
			r := sc.next()
			if r.status == http.StatusOK {
				r.body = fmt.Sprintf(`{"configToken":"np1.%s","nodeName":"n","pool":"worker","record":"r-%s"}`, req.Session, req.Session)
			}
			write(t, w, r)
		default:
			t.Errorf("unexpected %s", r.URL.Path)
		}
	})
}

// TestSessionRestart: verify is retried with the same session while the
// server is unavailable; only when such a retry finds the session expired
// does the agent start over from the challenge (at most Restarts times),
// saying so on the console. Any other refusal, a SessionExpired on the
// first try, and SessionReused are final.
func TestSessionRestart(t *testing.T) {
	okReply := reply{status: http.StatusOK}
	expired := refuse(http.StatusForbidden, attest.ReasonSessionExpired)
	cases := []struct {
		name         string
		verify       map[string][]reply
		wantSessions []string // verify requests' sessions, in order
		wantRecord   string
		wantRefused  attest.Reason
		wantRestarts int
	}{
		{name: "lost answers: the same session is retried until it answers",
			verify:       map[string][]reply{"s-1": {serve503("1"), reset, okReply}},
			wantSessions: []string{"s-1", "s-1", "s-1"}, wantRecord: "r-s-1"},
		{name: "server down until the session expired: start over once",
			verify:       map[string][]reply{"s-1": {serve503("1"), reset, expired}, "s-2": {okReply}},
			wantSessions: []string{"s-1", "s-1", "s-1", "s-2"}, wantRecord: "r-s-2", wantRestarts: 1},
		{name: "expires again and again: gives up after three restarts",
			verify: map[string][]reply{
				"s-1": {serve503(""), expired}, "s-2": {serve503(""), expired}, "s-3": {reset, expired},
				"s-4": {serve503(""), expired}, "s-5": {okReply}},
			wantSessions: []string{"s-1", "s-1", "s-2", "s-2", "s-3", "s-3", "s-4", "s-4"},
			wantRefused:  attest.ReasonSessionExpired, wantRestarts: 3},
		{name: "SessionExpired at the first try is final (clock or a slow answer)",
			verify:       map[string][]reply{"s-1": {expired}, "s-2": {okReply}},
			wantSessions: []string{"s-1"}, wantRefused: attest.ReasonSessionExpired},
		{name: "SessionReused after retries is final",
			verify:       map[string][]reply{"s-1": {serve503(""), refuse(http.StatusForbidden, attest.ReasonSessionReused)}, "s-2": {okReply}},
			wantSessions: []string{"s-1", "s-1"}, wantRefused: attest.ReasonSessionReused},
		{name: "another refusal after retries is final",
			verify:       map[string][]reply{"s-1": {serve503(""), refuse(http.StatusForbidden, attest.ReasonQuoteBinding)}, "s-2": {okReply}},
			wantSessions: []string{"s-1", "s-1"}, wantRefused: attest.ReasonQuoteBinding},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ss := &sessionServer{verify: map[string]*script{}}
			for id, rs := range tc.verify {
				ss.verify[id] = &script{replies: rs}
			}
			srv := httptest.NewTLSServer(ss.handler(t))
			defer srv.Close()
			c, _, progress := tlsClient(t, srv)
			coll := &fakeTPM{}
			key := testKubeletKey(t)
			vr, err := c.AttestTPM(context.Background(), "worker", "n", coll, key)
			if tc.wantRefused == "" {
				if err != nil {
					t.Fatalf("err %v", err)
				}
				if vr.Record != tc.wantRecord {
					t.Errorf("record %s, want %s", vr.Record, tc.wantRecord)
				}
			} else {
				var r *Refused
				if !errors.As(err, &r) || r.Refusal.Reason != tc.wantRefused {
					t.Fatalf("err %v, want a refusal %s", err, tc.wantRefused)
				}
			}
			if !slices.Equal(ss.seen, tc.wantSessions) {
				t.Errorf("verify sessions %v, want %v", ss.seen, tc.wantSessions)
			}
			if ss.sessions != tc.wantRestarts+1 || coll.requests != tc.wantRestarts+1 {
				t.Errorf("%d challenges, %d TPM requests; want %d", ss.sessions, coll.requests, tc.wantRestarts+1)
			}
			var restarts int
			for _, l := range *progress {
				if strings.Contains(l, "starting over from the challenge") {
					restarts++
				}
			}
			if restarts != tc.wantRestarts {
				t.Errorf("console shows %d restarts, want %d:\n%s", restarts, tc.wantRestarts, strings.Join(*progress, "\n"))
			}
		})
	}
}

func testKubeletKey(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// TestNotReadyReason: a 5xx with the server's refusal body is retried, and
// the console line of each retry carries the server's reason and detail
// (control characters replaced, long details cut), so the operator sees
// what the server lacks; a 5xx without one says only the status.
func TestNotReadyReason(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       string
		not        string
	}{
		{"a refusal body", `{"reason":"ConfigUnavailable","detail":"the server lacks the CA bundle: /etc/mcs/bootstrap-token/ca.crt"}`,
			"server not ready (503 ConfigUnavailable: the server lacks the CA bundle: /etc/mcs/bootstrap-token/ca.crt)", ""},
		{"terminal escapes in the detail", `{"reason":"ConfigUnavailable","detail":"x\u001b[2Jy"}`,
			"(503 ConfigUnavailable: x [2Jy)", "\x1b"}, // safetext.Clean: a control character becomes a space
		{"a long detail", `{"reason":"ConfigUnavailable","detail":"` + strings.Repeat("a", 2000) + `"}`,
			strings.Repeat("a", 509) + "…)", strings.Repeat("a", 510)}, // safetext.Cut: 512 bytes, "…" included
		{"no body", ``, "server not ready (503); retrying", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &script{replies: []reply{{status: http.StatusServiceUnavailable, retryAfter: "1", body: tc.body}, {status: http.StatusOK, body: `{"session":"s-1"}`}}}
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { write(t, w, s.next()) }))
			defer srv.Close()
			c, _, progress := tlsClient(t, srv)
			var out api.ChallengeResponse
			if _, err := c.post(context.Background(), api.PathChallenge, map[string]string{"kind": "tpm"}, &out); err != nil {
				t.Fatal(err)
			}
			if len(*progress) != 1 || !strings.Contains((*progress)[0], tc.want) || (tc.not != "" && strings.Contains((*progress)[0], tc.not)) {
				t.Fatalf("console %q: want it to say %q (and not %q)", *progress, tc.want, tc.not)
			}
		})
	}
}
