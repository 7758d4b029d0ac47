package mcs

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodeproof/nodeproof/attest"
)

// TestMetricsLabels: what a client sends (paths, pools, names) never
// becomes a label value, so no client can grow the series.
func TestMetricsLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	for i, path := range []string{"/config/worker", "/config/" + strings.Repeat("x", 100), "/attest/v1/verify", "/etc/passwd", "/a/b/c", "/healthz"} {
		m.observe(&decision{port: Secure, path: path, pool: path, node: path, status: 404 + i%2}, time.Millisecond)
	}
	m.observe(&decision{port: Insecure, path: "/config/worker", tier: "public", status: 200}, time.Millisecond)
	m.observe(&decision{port: Secure, path: "/attest/v1/verify", kind: "tpm", purpose: "enrol", status: 403, reason: "SecureBootDisabled"}, time.Millisecond)
	m.observe(&decision{port: Secure, path: "/config/worker", cred: "config", tier: "attested", status: 200}, time.Millisecond)
	m.observe(&decision{port: Secure, path: "/attest/v1/challenge", status: 503, reason: attest.ReasonRateLimited}, time.Millisecond)
	var nil_ *Metrics
	nil_.observe(&decision{}, 0) // no metrics: nothing, no panic

	endpoints := map[string]bool{}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, mm := range f.Metric {
			for _, l := range mm.Label {
				if strings.Contains(l.GetValue(), "/") || len(l.GetValue()) > 40 {
					t.Errorf("%s: label %s=%q comes from the request", f.GetName(), l.GetName(), l.GetValue())
				}
				if l.GetName() == "endpoint" {
					endpoints[l.GetValue()] = true
				}
			}
		}
	}
	for _, e := range []string{"config", "verify", "challenge", "healthz", "other"} {
		if !endpoints[e] {
			t.Errorf("endpoint %q not counted (%v)", e, endpoints)
		}
	}
	cases := []struct {
		c    prometheus.Collector
		want float64
	}{
		{m.attestations.WithLabelValues("tpm", "enrol", "refused", "SecureBootDisabled"), 1},
		{m.tokens.WithLabelValues("config", "accepted"), 1},
		{m.configs.WithLabelValues("public", "200"), 1},
		{m.limited.WithLabelValues("challenge", string(attest.ReasonRateLimited)), 1},
	}
	for i, c := range cases {
		if got := testutil.ToFloat64(c.c); got != c.want {
			t.Errorf("case %d: %v, want %v", i, got, c.want)
		}
	}
}
