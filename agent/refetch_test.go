package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// fetchServer is a sessionServer whose config fetches follow a script per
// config token, and which checks every verify's kubelet key proof.
type fetchServer struct {
	sessionServer
	pub      []byte // the kubelet key the proofs must verify with
	mu       sync.Mutex
	fetch    map[string]*script
	fetched  []string
	badProof int
}

func (f *fetchServer) handler(t *testing.T) http.Handler {
	sessions := f.sessionServer.handler(t)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, api.PathConfig) {
			tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			f.mu.Lock()
			f.fetched = append(f.fetched, tok)
			sc := f.fetch[tok]
			f.mu.Unlock()
			if sc == nil {
				write(t, w, reply{status: http.StatusOK, body: `{"ignition":{"version":"3.5.0"}}`})
				return
			}
			write(t, w, sc.next())
			return
		}
		if r.URL.Path == api.PathVerify {
			// Peek at the proof, then let the session server answer.
			body, req := peekVerify(t, r)
			if attest.VerifyKeyProof(f.pub, req.Session, req.KubeletKeyProof) != nil {
				f.mu.Lock()
				f.badProof++
				f.mu.Unlock()
			}
			r.Body = body
		}
		sessions.ServeHTTP(w, r)
	})
}

// TestAttestAndFetch: a config token spent by a delivery that never
// arrived (the server died mid-answer: the retry finds it used) makes the
// agent attest again, at most Restarts times; other refusals are final.
// Every verify proves the kubelet key.
func TestAttestAndFetch(t *testing.T) {
	used := refuse(http.StatusForbidden, attest.ReasonTokenUsed)
	okReply := reply{status: http.StatusOK}
	cases := []struct {
		name        string
		fetch       map[string][]reply // per config token
		wantTokens  []string           // tokens fetched with, in order
		wantRefused attest.Reason
	}{
		{"fetched at once", nil, []string{"np1.s-1"}, ""},
		{"delivery cut, token spent: attest again",
			map[string][]reply{"np1.s-1": {reset, used}},
			[]string{"np1.s-1", "np1.s-1", "np1.s-2"}, ""},
		{"spent again and again: gives up after three",
			map[string][]reply{"np1.s-1": {reset, used}, "np1.s-2": {reset, used}, "np1.s-3": {serve503(""), used}, "np1.s-4": {reset, used}},
			[]string{"np1.s-1", "np1.s-1", "np1.s-2", "np1.s-2", "np1.s-3", "np1.s-3", "np1.s-4", "np1.s-4"}, attest.ReasonTokenUsed},
		{"spent on what looks like the first try (Go's transport retried the reset GET): attest again",
			map[string][]reply{"np1.s-1": {used}},
			[]string{"np1.s-1", "np1.s-2"}, ""},
		{"another refusal of the fetch is final",
			map[string][]reply{"np1.s-1": {reset, refuse(http.StatusForbidden, "TokenForAnotherPool")}},
			[]string{"np1.s-1", "np1.s-1"}, "TokenForAnotherPool"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
			fs := &fetchServer{sessionServer: sessionServer{verify: map[string]*script{}}, pub: pub, fetch: map[string]*script{}}
			for i := 1; i <= 5; i++ {
				fs.verify[fmt.Sprintf("s-%d", i)] = &script{replies: []reply{okReply}}
			}
			for tok, rs := range tc.fetch {
				fs.fetch[tok] = &script{replies: rs}
			}
			srv := httptest.NewTLSServer(fs.handler(t))
			defer srv.Close()
			c, _, _ := tlsClient(t, srv)
			c.KubeletKey = key
			_, full, err := c.AttestAndFetch(context.Background(), TPMEvidence{Collector: &fakeTPM{}}, "worker", "n", pub)
			if tc.wantRefused == "" && (err != nil || len(full) == 0) {
				t.Fatalf("err %v, %d bytes", err, len(full))
			}
			if tc.wantRefused != "" {
				var r *Refused
				if !errors.As(err, &r) || r.Refusal.Reason != tc.wantRefused {
					t.Fatalf("err %v, want refusal %s", err, tc.wantRefused)
				}
			}
			if strings.Join(fs.fetched, " ") != strings.Join(tc.wantTokens, " ") {
				t.Errorf("fetched with %v, want %v", fs.fetched, tc.wantTokens)
			}
			if c.Challenges != fs.sessions {
				t.Errorf("Challenges = %d, the server opened %d sessions", c.Challenges, fs.sessions)
			}
			if fs.badProof != 0 || len(fs.seen) == 0 {
				t.Errorf("%d of %d verifies without a valid kubelet key proof", fs.badProof, len(fs.seen))
			}
		})
	}
}

// TestProofNeedsTheBoundKey: a client whose kubelet key is not the one the
// evidence binds refuses to attest rather than send a proof that cannot
// verify.
func TestProofNeedsTheBoundKey(t *testing.T) {
	fs := &fetchServer{sessionServer: sessionServer{verify: map[string]*script{"s-1": {replies: []reply{{status: http.StatusOK}}}}}}
	srv := httptest.NewTLSServer(fs.handler(t))
	defer srv.Close()
	c, _, _ := tlsClient(t, srv)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	c.KubeletKey = other
	if _, err := c.AttestTPM(context.Background(), "worker", "n", &fakeTPM{}, testKubeletKey(t)); err == nil || !strings.Contains(err.Error(), "not the one the evidence binds") {
		t.Fatalf("err %v", err)
	}
	if len(fs.seen) != 0 {
		t.Fatal("a verify was sent")
	}
}

// peekVerify decodes a verify body and returns a reader of the same bytes.
func peekVerify(t *testing.T, r *http.Request) (io.ReadCloser, api.VerifyRequest) {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	var req api.VerifyRequest
	if err := json.Unmarshal(b, &req); err != nil {
		t.Errorf("verify body: %v", err)
	}
	return io.NopCloser(bytes.NewReader(b)), req
}
