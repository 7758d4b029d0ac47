package systemtest_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/serve"
)

// TestServePolicyReload: serve picks up an edited --policy without a
// restart; a bad edit (YAML that does not parse, a policy that does not
// check, a trust root that cannot be read) keeps the last good policy in
// force, says why in the log and is counted; fixing the file applies it.
func TestServePolicyReload(t *testing.T) {
	var policyFile, metrics string
	s := startServerWith(t, nil, func(c *serve.Config) {
		policyFile = c.Policy
		metrics = freeAddr(t)
		c.MetricsAddr = metrics
	})
	bundle, err := os.ReadFile(filepath.Join(s.stateDir, "certs", "current", certs.CABundleFileName))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(bundle)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	good, err := os.ReadFile(policyFile)
	if err != nil {
		t.Fatal(err)
	}
	// The master pool serves no public tier: 401 without credentials.
	master := func() int {
		resp, err := hc.Get(s.url + "/config/master")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s\n%s", what, s.log)
			}
		}
	}
	counter := func(result string) float64 {
		return scrape(t, "http://"+metrics+"/metrics")[fmt.Sprintf(`nodeproof_server_policy_reloads_total{result=%q}`, result)]
	}
	rejected := func() float64 { return scrape(t, "http://"+metrics+"/metrics")["nodeproof_server_policy_rejected"] }
	write := func(b []byte) {
		t.Helper()
		if err := os.WriteFile(policyFile, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if code := master(); code != http.StatusUnauthorized {
		t.Fatalf("GET /config/master: %d; want 401 before the edit", code)
	}
	status := func() string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := cli.Run(context.Background(), []string{"status", "--state-dir", s.stateDir}, &out, &errb); code != 0 {
			t.Fatalf("nodeproof status: exit %d\n%s%s", code, out.String(), errb.String())
		}
		return out.String()
	}
	if out := status(); !strings.Contains(out, "server:      running") || !strings.Contains(out, "reload:      no refusal stands") ||
		!strings.Contains(out, "serving:     [") || !strings.Contains(out, "store:       ok") || !strings.Contains(out, "records:     0 node bindings") {
		t.Errorf("nodeproof status of a running server:\n%s", out)
	} else if !regexp.MustCompile(`policy:      \S+policy.yaml version [0-9a-f]{16}, in force since`).MatchString(out) {
		t.Errorf("nodeproof status: no policy version in force:\n%s", out)
	}

	ekRoots, err := s.man.RootsDir()
	if err != nil {
		t.Fatal(err)
	}
	publicMaster, err := e2ePolicy(ekRoots).Pool("master", policytest.Public().Token()).YAML()
	if err != nil {
		t.Fatal(err)
	}
	write(publicMaster)
	waitFor("the edited policy (master's public tier) in force", func() bool { return master() == http.StatusOK })
	if counter("applied") != 1 || rejected() != 0 {
		t.Errorf("after a good edit: applied %v, rejected %v; want 1, 0", counter("applied"), rejected())
	}

	for i, bad := range []struct{ name, body string }{
		{"YAML that does not parse", "pools: [\n"},
		{"a policy that does not check", strings.Replace(string(publicMaster), "- aws\n", "- carrier-pigeon\n", 1)},
		{"a trust root that cannot be read", strings.Replace(string(publicMaster), "dir: ", "dir: /nonexistent", 1)},
	} {
		write([]byte(bad.body))
		waitFor(bad.name+": refused", func() bool { return counter("refused") == float64(i+1) })
		if rejected() != 1 {
			t.Errorf("%s: nodeproof_server_policy_rejected %v; want 1", bad.name, rejected())
		}
		if master() != http.StatusOK {
			t.Errorf("%s: the last good policy is not in force", bad.name)
		}
		// nodeproof status, without Prometheus, says the same.
		if out := status(); !strings.Contains(out, "reload:      REFUSED at") {
			t.Errorf("%s: nodeproof status does not show the refusal:\n%s", bad.name, out)
		}
	}
	if n := strings.Count(s.log.String(), "policy reload refused; the last good policy stays in force"); n != 3 {
		t.Errorf("%d log lines about refused reloads; want one per bad version", n)
	}
	// Back to the version in force: the refusal is over, said.
	write(publicMaster)
	waitFor("the refusal over", func() bool { return rejected() == 0 })
	// A trust file the policy points to is part of its version: the vendor's
	// root taken out of its directory is refused like a bad edit, and put
	// back ends the refusal.
	files, err := os.ReadDir(ekRoots)
	if err != nil {
		t.Fatal(err)
	}
	aside := t.TempDir()
	for _, f := range files {
		if err := os.Rename(filepath.Join(ekRoots, f.Name()), filepath.Join(aside, f.Name())); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("the emptied ek-roots directory refused", func() bool { return counter("refused") == 4 })
	for _, f := range files {
		if err := os.Rename(filepath.Join(aside, f.Name()), filepath.Join(ekRoots, f.Name())); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("the ek-roots directory restored: the refusal over", func() bool { return rejected() == 0 })
	for _, line := range []string{"policy in force", "the refusal is over", `"version":`} {
		if !strings.Contains(s.log.String(), line) {
			t.Errorf("the server's log does not say %q:\n%s", line, s.log)
		}
	}

	write(good)
	waitFor("the original policy in force again", func() bool { return master() == http.StatusUnauthorized })
	if counter("applied") != 2 || rejected() != 0 {
		t.Errorf("after fixing the file: applied %v, rejected %v; want 2, 0", counter("applied"), rejected())
	}
}
