package systemtest_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/systemtest"
)

// TestServeClusterModeStartupChecks: cluster mode refuses to start without
// the API server's CA bundle every served kubeconfig carries (naming where
// it looks and the flag that moves it), and without the node-bootstrapper
// token when a pool serves the shared kubeconfig; once running, losing the
// CA makes /healthz answer 503 NotReady with what is missing, and getting
// it back makes it ready again.
func TestServeClusterModeStartupChecks(t *testing.T) {
	w := systemtest.New(t, "..", systemtest.Options{Cluster: true, NoExamples: true})
	cfg, ctx := w.Config, context.Background()
	tokenDir, kubeconfig := w.TokenDir, w.Admin
	tokenTierDoc, err := policytest.New().Pool("worker", policytest.Public().Token()).YAML()
	if err != nil {
		t.Fatal(err)
	}
	tokenTier := string(tokenTierDoc)
	config := func(tokenDir, pol string) (serve.Config, *testenv.LockedBuffer) {
		dir := t.TempDir()
		var policyFile string
		if pol != "" {
			policyFile = filepath.Join(dir, "policy.yaml")
			if err := os.WriteFile(policyFile, []byte(pol), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		log := new(testenv.LockedBuffer)
		return serve.Config{
			Listen: "127.0.0.1", TLSMinVersion: "VersionTLS12",
			Kubeconfig: kubeconfig, APIServerURL: cfg.Host, TokenDir: tokenDir,
			CertStore: "state-dir", TokenStore: "file", StateDir: filepath.Join(dir, "state"), Policy: policyFile,
			Hosts: []string{"127.0.0.1"}, TokenTTL: time.Minute, Grace: time.Hour, Reload: time.Second, Clock: time.Now,
			Log: slog.New(slog.NewJSONHandler(log, nil)),
		}, log
	}
	only := func(t *testing.T, name string) string {
		d := t.TempDir()
		b, err := os.ReadFile(filepath.Join(tokenDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return d
	}

	for _, tc := range []struct {
		name     string
		tokenDir func(t *testing.T) string
		policy   string
		says     []string // what the refusal names: what is missing, where, and the flag
	}{
		{"no ca.crt, no kubeconfig-data ConfigMap", func(t *testing.T) string { return only(t, "token") }, "",
			[]string{"CA bundle", "kubeconfig-data", "ca.crt", "--bootstrap-token-dir"}},
		{"no token, and the token tier serves the shared kubeconfig", func(t *testing.T) string { return only(t, "ca.crt") }, tokenTier,
			[]string{"node-bootstrapper token", "token", "--bootstrap-token-dir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := config(tc.tokenDir(t), tc.policy)
			c.Ready = func(net.Addr, net.Addr) { t.Error("it started") }
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			err := serve.Run(sctx, c)
			if err == nil {
				t.Fatal("serve started and stopped without an error")
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the refusal does not name %q: %v", s, err)
				}
			}
		})
	}

	t.Run("the CA lost and found while running: /healthz says so", func(t *testing.T) {
		dir := t.TempDir()
		for _, name := range []string{"token", "ca.crt"} {
			b, err := os.ReadFile(filepath.Join(tokenDir, name))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		c, log := config(dir, "")
		c.InsecurePort = 0
		ready := make(chan net.Addr, 1)
		c.Ready = func(a, _ net.Addr) { ready <- a }
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- serve.Run(sctx, c) }()
		defer func() { cancel(); <-done }()
		var url string
		select {
		case a := <-ready:
			url = "https://" + a.String() + api.PathHealthz
		case err := <-done:
			done <- err
			t.Fatalf("serve: %v\n%s", err, log)
		}
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		health := func() (int, api.Refusal) {
			resp, err := hc.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var r api.Refusal
			json.Unmarshal(b, &r)
			return resp.StatusCode, r
		}
		wait := func(what string, cond func(int, api.Refusal) bool) {
			t.Helper()
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
				code, r := health()
				if cond(code, r) {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("waited a minute for %s: /healthz %d %+v\n%s", what, code, r, log)
				}
			}
		}
		if code, r := health(); code != http.StatusOK {
			t.Fatalf("/healthz of a server with what it needs: %d %+v", code, r)
		}
		if err := os.Remove(filepath.Join(dir, "ca.crt")); err != nil {
			t.Fatal(err)
		}
		wait("/healthz to say NotReady, naming the CA bundle", func(code int, r api.Refusal) bool {
			return code == http.StatusServiceUnavailable && r.Reason == attest.ReasonNotReady && strings.Contains(r.Detail, "ca.crt")
		})
		if !strings.Contains(log.String(), "cannot serve full configs now") {
			t.Errorf("the log does not say it:\n%s", log)
		}
		b, _ := os.ReadFile(filepath.Join(tokenDir, "ca.crt"))
		if err := os.WriteFile(filepath.Join(dir, "ca.crt"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		wait("/healthz to be ready again", func(code int, _ api.Refusal) bool { return code == http.StatusOK })
	})
}
