package deploy_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// rule is one alerting rule of deploy/monitoring/prometheusrule.yaml.
type rule struct {
	Alert       string
	Expr        string
	For         string
	Labels      map[string]string
	Annotations map[string]string
}

func readRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile("monitoring/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		APIVersion string `json:"apiVersion"`
		Kind       string
		Metadata   struct{ Name string }
		Spec       struct {
			Groups []struct {
				Name  string
				Rules []rule
			}
		}
	}
	if err := yaml.UnmarshalStrict(b, &doc); err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	var out []rule
	for _, g := range doc.Spec.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

var (
	metricRE    = regexp.MustCompile(`\bnodeproof_[a-z_]+`)
	labelRefRE  = regexp.MustCompile(`\$labels\.([a-z_]+)`)
	aggregateRE = regexp.MustCompile(`\b(?:min|max|sum|avg|count) by \(([a-z_, ]+)\)`)
)

// TestPrometheusRules: every alert of deploy/monitoring is named once,
// reads a nodeproof metric, says how bad it is and what happened, and
// only names in its annotations labels its expression keeps (an
// aggregation without them leaves {{ $labels.x }} empty). That the
// metrics are exported: internal/e2e TestMonitoring.
func TestPrometheusRules(t *testing.T) {
	rules := readRules(t)
	seen := map[string]bool{}
	for _, r := range rules {
		t.Run(r.Alert, func(t *testing.T) {
			if !strings.HasPrefix(r.Alert, "Nodeproof") || seen[r.Alert] {
				t.Errorf("alert name %q: want Nodeproof..., once", r.Alert)
			}
			seen[r.Alert] = true
			if len(metricRE.FindAllString(r.Expr, -1)) == 0 {
				t.Errorf("expr reads no nodeproof metric: %s", r.Expr)
			}
			if !slices.Contains([]string{"info", "warning", "critical"}, r.Labels["severity"]) {
				t.Errorf("severity %q", r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("annotations %v: want a summary and a description", r.Annotations)
			}
			for _, ref := range labelRefRE.FindAllStringSubmatch(r.Annotations["summary"]+r.Annotations["description"], -1) {
				kept := false
				for _, by := range aggregateRE.FindAllStringSubmatch(r.Expr, -1) {
					for _, l := range strings.Split(by[1], ",") {
						kept = kept || strings.TrimSpace(l) == ref[1]
					}
				}
				if !kept {
					t.Errorf("annotations name $labels.%s, which %s does not keep", ref[1], r.Expr)
				}
			}
		})
	}
	// The alerts the docs promise, each on its metric.
	for _, c := range []struct{ alert, metric, threshold string }{
		{"NodeproofPolicyRejected", "nodeproof_server_policy_rejected", "> 0"},
		{"NodeproofServingCertificateExpiring", "nodeproof_server_certificate_expiry_timestamp_seconds", "< 30 * 86400"},
		{"NodeproofTrustAnchorExpiring", "nodeproof_trust_anchor_expiry_timestamp_seconds", "< 30 * 86400"},
	} {
		i := slices.IndexFunc(rules, func(r rule) bool { return r.Alert == c.alert })
		if i < 0 {
			t.Errorf("no alert %s", c.alert)
			continue
		}
		if e := rules[i].Expr; !slices.Contains(metricRE.FindAllString(e, -1), c.metric) || !strings.HasSuffix(strings.TrimSpace(e), c.threshold) {
			t.Errorf("%s: %q, want %s and %q", c.alert, e, c.metric, c.threshold)
		}
	}
}
