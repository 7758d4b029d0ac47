package metrics

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestServe: /metrics carries the command's own metrics beside the Go
// and process collectors, /healthz answers ok, and after stop nothing
// listens.
func TestServe(t *testing.T) {
	reg := NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "nodeproof_test_total", Help: "a test counter"})
	reg.MustRegister(c)
	c.Add(3)
	addr, stop, err := Serve("127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	m := get("/metrics")
	for _, want := range []string{"nodeproof_test_total 3", "go_goroutines", "process_cpu_seconds_total"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if h := get("/healthz"); h != "ok\n" {
		t.Errorf("/healthz = %q", h)
	}
	stop()
	if resp, err := http.Get("http://" + addr.String() + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatal("still serving after stop")
	}
}

// TestServeRefusesABusyAddress: the address in use is an error, not a
// server that never serves.
func TestServeRefusesABusyAddress(t *testing.T) {
	addr, stop, err := Serve("127.0.0.1:0", NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, _, err := Serve(addr.String(), NewRegistry()); err == nil {
		t.Fatal("a second Serve on the same address succeeded")
	}
}
