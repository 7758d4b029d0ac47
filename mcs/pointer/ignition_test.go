package pointer

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/certs"
)

// The real Ignition client follows pointer configs made by Build to a
// server using the certs package — including a pointer config written
// before a CA rotation, which trusts only the old CA.
//
// Ignition checks certificates against the real time, so the state is
// created 8.1 years in the past and rotated now.
func TestIgnitionFollowsPointerConfig(t *testing.T) {
	testenv.IgnitionBinary(t) // fail early, with the install hint, if it is missing
	now := time.Now()
	clock := func() time.Time { return now }
	const token = "q+8/Zk1w3XyZ0mN5vP2rT7uB9cD4eF6gH8iJ0kL2mN4="
	hosts := []string{"127.0.0.1"}

	dir := t.TempDir()
	now = time.Now().Add(-time.Duration(8.1 * 365.25 * 24 * float64(time.Hour)))
	before, err := certs.Ensure(dir, certs.Options{Clock: clock, Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	now = time.Now()
	after, err := certs.Ensure(dir, certs.Options{Clock: clock, Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	if after.CACert.Equal(before.CACert) || after.CrossSignedCA == nil {
		t.Fatalf("no rotation: %q", after.Changes)
	}
	other, err := certs.Ensure(t.TempDir(), certs.Options{Clock: clock, Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}

	r, err := certs.NewReloader(after.ServingCertFile, after.ServingKeyFile, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		got := req.URL.Query().Get("token")
		if h, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer "); ok {
			got = h
		}
		if req.URL.Path != "/config/worker" || got != token {
			http.Error(w, "no", http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"/etc/nodeproof-pointer","contents":{"source":"data:,hello"}}]}}`)
	})
	// As the MCS serves: the TLS listener from certs.TLSConfig, nothing else
	// (httptest would add a certificate of its own for clients without SNI).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(tls.NewListener(ln, certs.TLSConfig(r, 0, nil)))
	defer srv.Close()
	url := "https://" + ln.Addr().String() + "/config/worker"

	cases := []struct {
		name       string
		bundle     []byte
		tokenInURL bool
		version    string
		timeout    time.Duration
		wantOK     bool
	}{
		{name: "new pointer config, token header", bundle: after.CABundlePEM, wantOK: true},
		{name: "new pointer config, token in URL, spec 3.4", bundle: after.CABundlePEM, tokenInURL: true, version: "3.4.0", wantOK: true},
		{name: "pointer config from before the rotation (old CA only)", bundle: before.CABundlePEM, wantOK: true},
		{name: "pointer config trusting another CA is refused", bundle: other.CABundlePEM, timeout: 3 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			timeout := c.timeout
			if timeout == 0 {
				timeout = 20 * time.Second
			}
			raw, err := Build(Options{URL: url, CABundle: c.bundle, Token: token, TokenInURL: c.tokenInURL, Version: c.version, HTTPTotal: timeout})
			if err != nil {
				t.Fatal(err)
			}
			out, cached, err := runFetch(t, raw)
			if !c.wantOK {
				if err == nil {
					t.Fatalf("ignition fetched through an untrusted certificate\n%s", out)
				}
				if !strings.Contains(string(out), "certificate signed by unknown authority") {
					t.Errorf("ignition failed for another reason:\n%s", out)
				}
				return
			}
			if err != nil {
				t.Fatalf("ignition fetch: %v\n%s", err, out)
			}
			if !strings.Contains(string(cached), "/etc/nodeproof-pointer") {
				t.Fatalf("cached config lacks the served file: %s", cached)
			}
		})
	}
}

// runFetch runs Ignition's fetch stage, unprivileged, on pointer.
func runFetch(t *testing.T, pointer []byte) (out, cached []byte, err error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pointer.ign")
	if err := os.WriteFile(p, pointer, 0o600); err != nil {
		t.Fatal(err)
	}
	cached, output, err := testenv.IgnitionFetch(t, p, "")
	return []byte(output), cached, err
}
