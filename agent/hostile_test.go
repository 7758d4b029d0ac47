package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// counter is a server that only counts what reaches it and remembers the
// credentials it was sent.
type counter struct {
	hits atomic.Int32
	auth atomic.Value // string: the last Authorization header
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.hits.Add(1)
	c.auth.Store(r.Header.Get("Authorization"))
	w.Write([]byte(`{"tier":"full","redirected":true}`))
}

// hostile is a TLS server the agent trusts that answers challenge and
// verify honestly-looking, except where the test says otherwise.
type hostile struct {
	srv     *httptest.Server
	verify  http.HandlerFunc // nil: a config token
	config  http.HandlerFunc // nil: a config
	reports atomic.Int32
}

func newHostile(t *testing.T, verify, config http.HandlerFunc) *hostile {
	h := &hostile{verify: verify, config: config}
	h.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == api.PathChallenge:
			json.NewEncoder(w).Encode(api.ChallengeResponse{Session: "s-1", Kind: attest.KindTPM, Challenge: api.Message(&tpm.Challenge{Nonce: []byte("nonce")})})
		case r.URL.Path == api.PathVerify && h.verify != nil:
			h.verify(w, r)
		case r.URL.Path == api.PathVerify:
			w.Write([]byte(`{"configToken":"np1.the-config-token","nodeName":"n","pool":"worker","record":"r"}`))
		case strings.HasPrefix(r.URL.Path, api.PathConfig) && h.config != nil:
			h.config(w, r)
		case strings.HasPrefix(r.URL.Path, api.PathConfig):
			w.Write([]byte(`{"ignition":{"version":"3.2.0"}}`))
		case r.URL.Path == api.PathReport:
			h.reports.Add(1)
			w.Write([]byte(`{"authenticated":"no"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// run runs the agent (fetch mode, a fake TPM) against url trusting srv's
// certificate, and returns its error, console and the root it wrote to.
func runAgent(t *testing.T, url string, srv *httptest.Server) (error, string, string) {
	t.Helper()
	var console bytes.Buffer
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := Run(ctx, Config{
		Server: url, CABundle: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}),
		Pool: "worker", NodeName: "n", Evidence: TPMEvidence{Collector: &fakeTPM{}},
		KubeletKeyPath: filepath.Join(t.TempDir(), "kubelet.key"), Mode: ModeFetch, Root: root, Console: &console,
	})
	return err, console.String(), root
}

func reasonOf(err error) attest.Reason {
	var r *Refused
	if errors.As(err, &r) {
		return r.Refusal.Reason
	}
	return attest.Reason(fmt.Sprintf("not a refusal: %v", err))
}

func filesUnder(t *testing.T, root string) int {
	t.Helper()
	n := 0
	filepath.WalkDir(root, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return nil
	})
	return n
}

// consoleIsClean reports why console is not made only of the agent's own
// lines, free of control and format characters ("" when it is).
func consoleIsClean(console string) string {
	for i, line := range strings.Split(strings.TrimSuffix(console, "\n"), "\n") {
		if !strings.HasPrefix(line, "nodeproof-agent: ") {
			return fmt.Sprintf("line %d is not the agent's: %q", i+1, line)
		}
		if !utf8.ValidString(line) {
			return fmt.Sprintf("line %d is not UTF-8", i+1)
		}
		for _, r := range line {
			if unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) {
				return fmt.Sprintf("line %d holds %U", i+1, r)
			}
		}
	}
	return ""
}

// TestAttackHostileServer: the agent speaks only TLS to its server, with
// the CA it was given, follows no redirect, and shows a refusal's detail
// bounded and with its control and format characters replaced.
func TestAttackHostileServer(t *testing.T) {
	t.Run("plain http server URL", func(t *testing.T) {
		plain := &counter{}
		p := httptest.NewServer(plain)
		defer p.Close()
		tlsSrv := httptest.NewTLSServer(plain) // only for a CA bundle
		defer tlsSrv.Close()
		err, _, root := runAgent(t, p.URL, tlsSrv)
		got := "refused before any request"
		if !errors.Is(err, ErrServerNotHTTPS) || plain.hits.Load() != 0 || filesUnder(t, root) != 0 {
			got = fmt.Sprintf("%d requests, %d files, err %v", plain.hits.Load(), filesUnder(t, root), err)
		}
		attacktable.Check(t, "agent", "the server URL is http:// (a wrong or tampered agent.env, --server)", "refused before any request", got)
		// Whoever builds the Client: a literal with an http BaseURL is
		// refused at its first request too.
		c := &Client{BaseURL: p.URL, HTTP: p.Client()}
		if _, err := c.FetchConfig(context.Background(), "worker", "np1.x"); !errors.Is(err, ErrServerNotHTTPS) || plain.hits.Load() != 0 {
			t.Errorf("a Client literal with an http URL: %v, %d requests", err, plain.hits.Load())
		}
	})

	t.Run("307 on verify to another host", func(t *testing.T) {
		other := &counter{}
		o := httptest.NewTLSServer(other) // trusted too: the same test certificate
		defer o.Close()
		h := newHostile(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, o.URL+api.PathVerify, http.StatusTemporaryRedirect)
		}, nil)
		err, _, _ := runAgent(t, h.srv.URL, h.srv)
		got := fmt.Sprintf("%s, %d requests there", reasonOf(err), other.hits.Load())
		attacktable.Check(t, "agent", "a 307 on verify to another host (would re-send the session and kubelet key proof)", "Redirected, 0 requests there", got)
	})

	t.Run("302 on config fetch to plain http", func(t *testing.T) {
		other := &counter{}
		o := httptest.NewServer(other)
		defer o.Close()
		h := newHostile(t, nil, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, o.URL+r.URL.Path, http.StatusFound)
		})
		err, _, root := runAgent(t, h.srv.URL, h.srv)
		auth, _ := other.auth.Load().(string)
		got := fmt.Sprintf("%s, %d requests there, token sent: %v, %d files written", reasonOf(err), other.hits.Load(), strings.Contains(auth, "the-config-token"), filesUnder(t, root))
		attacktable.Check(t, "agent", "a 302 on the config fetch to plain http (would carry the config token and write the answer as the config)",
			"Redirected, 0 requests there, token sent: false, 0 files written", got)
	})

	t.Run("8 MiB refusal body", func(t *testing.T) {
		big := `{"reason":"Forbidden","detail":"` + strings.Repeat("A", 8<<20) + `"}`
		h := newHostile(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte(big))
		}, nil)
		err, console, _ := runAgent(t, h.srv.URL, h.srv)
		var r *Refused
		detail := -1
		if errors.As(err, &r) {
			detail = len(r.Refusal.Detail)
		}
		t.Logf("an 8 MiB refusal: detail %d bytes, console %d bytes, error %d bytes", detail, len(console), len(err.Error()))
		got := fmt.Sprintf("detail %s, console %s", atMost(detail, 4<<10), atMost(len(console), 16<<10))
		attacktable.Check(t, "agent", "a 403 whose body is 8 MiB (printed whole on the console before)", "detail ≤ 4096 bytes, console ≤ 16384 bytes", got)
	})

	t.Run("control and format characters in a refusal", func(t *testing.T) {
		detail := "policy says no\x1b[2J\x1b[31m\r\nnodeproof-agent: attested: node master-0, pool master\u2028" +
			"\u202egnp.exe\u2066hidden\u2069\u200b\u00ad\x00\xff"
		h := newHostile(t, func(w http.ResponseWriter, r *http.Request) {
			b, _ := json.Marshal(map[string]string{"reason": "Forbidden\x1b[0m", "detail": detail})
			w.WriteHeader(http.StatusForbidden)
			w.Write(b)
		}, nil)
		err, console, _ := runAgent(t, h.srv.URL, h.srv)
		got := consoleIsClean(console)
		if got == "" {
			got = "clean"
		}
		if reasonOf(err) != attest.ReasonUnknown {
			t.Errorf("a reason with an escape was kept: %q", reasonOf(err))
		}
		attacktable.Check(t, "agent", "a refusal whose reason and detail carry escapes, bidi overrides, line separators and a forged console line",
			"clean", got)
	})
}

// atMost says "≤ max bytes" when n ≤ max, else n.
func atMost(n, max int) string {
	if n >= 0 && n <= max {
		return fmt.Sprintf("≤ %d bytes", max)
	}
	return fmt.Sprintf("%d bytes", n)
}

// TestCheckServerURL: only https to a host, nothing else in the URL that
// could carry credentials or change what is asked.
func TestCheckServerURL(t *testing.T) {
	cases := []struct {
		name, url string
		ok        bool
	}{
		{"https with port", "https://api-int.example.com:22623", true},
		{"https, trailing slash", "https://10.0.0.1:22623/", true},
		{"https IPv6", "https://[fd00::1]:22623", true},
		{"http", "http://api-int.example.com:22623", false},
		{"no scheme", "api-int.example.com:22623", false},
		{"upper-case HTTP", "HTTP://api-int.example.com", false},
		{"no host", "https:///config", false},
		{"user information", "https://user:pass@api-int.example.com", false},
		{"query", "https://api-int.example.com?x=1", false},
		{"fragment", "https://api-int.example.com#f", false},
		{"file", "file:///etc/passwd", false},
		{"empty", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckServerURL(tc.url)
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrServerNotHTTPS)) {
				t.Fatalf("CheckServerURL(%q) = %v, want ok %v", tc.url, err, tc.ok)
			}
		})
	}
}
