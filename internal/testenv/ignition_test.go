package testenv_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/testenv"
)

// The versions the Go side expects are the ones hack/tools.sh builds.
func TestVersionsMatchToolsScript(t *testing.T) {
	script, err := os.ReadFile(filepath.Join("..", "..", "hack", "tools.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"IGNITION_VERSION": testenv.IgnitionVersion,
		"KUBE_VERSION":     testenv.KubeVersion,
		"ETCD_VERSION":     testenv.EtcdVersion,
	} {
		m := regexp.MustCompile(`(?m)^` + name + `=(\S+)`).FindSubmatch(script)
		if m == nil {
			t.Errorf("hack/tools.sh sets no %s", name)
		} else if got := string(m[1]); got != want {
			t.Errorf("hack/tools.sh %s=%s, testenv has %s", name, got, want)
		}
	}
}

func TestIgnitionVersion(t *testing.T) {
	out, err := exec.Command(testenv.IgnitionBinary(t), "-version").CombinedOutput()
	if err != nil {
		t.Fatalf("ignition -version: %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "Ignition "+testenv.IgnitionVersion; got != want {
		t.Fatalf("ignition -version = %q, want %q", got, want)
	}
}

// The real client's fetch stage, unprivileged, against a local server: it
// follows the pointer config, sends its usual headers, and caches the merged
// config — touching nothing outside the test's directory.
func TestIgnitionFetchStage(t *testing.T) {
	seen := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/config/worker" {
			http.NotFound(w, r)
			return
		}
		select {
		case seen <- r.Header.Clone():
		default:
		}
		w.Header().Set("Content-Type", "application/vnd.coreos.ignition+json")
		fmt.Fprint(w, `{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/nodeproof-testenv","contents":{"source":"data:,hello"}}]}}`)
	}))
	defer srv.Close()

	dir := t.TempDir()
	pointer := filepath.Join(dir, "pointer.ign")
	if err := os.WriteFile(pointer, fmt.Appendf(nil,
		`{"ignition":{"version":"3.4.0","config":{"replace":{"source":%q}},"timeouts":{"httpTotal":10}}}`,
		srv.URL+"/config/worker"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cached, out, err := testenv.IgnitionFetch(t, pointer, "")
	if err != nil {
		t.Fatalf("ignition fetch: %v\n%s", err, out)
	}
	t.Logf("ignition fetch stage took %s", time.Since(start).Round(time.Millisecond))

	select {
	case h := <-seen:
		if ua, want := h.Get("User-Agent"), "Ignition/"+testenv.IgnitionVersion; ua != want {
			t.Errorf("User-Agent = %q, want %q", ua, want)
		}
		if a := h.Get("Accept"); !strings.Contains(a, "application/vnd.coreos.ignition+json") {
			t.Errorf("Accept = %q", a)
		}
	default:
		t.Fatalf("ignition never fetched /config/worker\n%s", out)
	}
	if !strings.Contains(string(cached), "/etc/nodeproof-testenv") {
		t.Fatalf("cached config lacks the served file: %s", cached)
	}
}
