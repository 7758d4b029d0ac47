package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"sigs.k8s.io/yaml"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
)

// metricsAddr is the address a process logged its metrics at.
func metricsAddr(t *testing.T, log fmt.Stringer) string {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for _, line := range strings.Split(log.String(), "\n") {
			var l struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "metrics" && l.Addr != "" {
				return l.Addr
			}
		}
	}
	t.Fatalf("no metrics address logged:\n%s", log)
	return ""
}

func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return fams
}

// value is the sum of family name's samples whose labels include want.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	var sum float64
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range want {
			ok = ok && labels[k] == v
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

// monitoringMetrics are the metric names deploy/monitoring's rules and
// dashboard read (histograms by family: _bucket, _sum, _count stripped).
func monitoringMetrics(t *testing.T) []string {
	t.Helper()
	var exprs []string
	b, err := os.ReadFile("../../deploy/monitoring/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct{ Alert, Expr string }
			}
		}
	}
	if err := yaml.Unmarshal(b, &rule); err != nil {
		t.Fatal(err)
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	b, err = os.ReadFile("../../deploy/monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	if len(exprs) < 10 {
		t.Fatalf("read %d expressions from deploy/monitoring; want the rules' and the dashboard's", len(exprs))
	}
	names := map[string]bool{}
	for _, e := range exprs {
		for _, n := range regexp.MustCompile(`\bnodeproof_[a-z_]+`).FindAllString(e, -1) {
			names[regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(n, "")] = true
		}
	}
	var out []string
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// TestMonitoring: after a machine enrols and becomes an attested node and
// another is refused, the real server and approver processes export what
// happened, and every metric deploy/monitoring's alerts and dashboard read.
func TestMonitoring(t *testing.T) {
	w := start(t)
	const node = "mon-1"
	a := w.bootedMachine(t, "rhel8-uefi")
	w.enrolNode(t, a, node, filepath.Join(t.TempDir(), "kubelet.key"))
	b := w.bootedMachine(t, "ubuntu-2104-no-secure-boot")
	out, code := w.runAgent(t, nil, "--mode", "fetch", "--pool", "worker", "--node-name", "mon-2", "--tpm", b.tpmArg,
		"--event-log", b.logFile, "--kubelet-key", filepath.Join(t.TempDir(), "kubelet.key"), "--root", t.TempDir())
	if code != 3 {
		t.Fatalf("a Secure Boot off machine: exit %d, want 3 (refused)\n%s", code, out)
	}
	// The refused machine reported why, authenticated by its session, and
	// the operator sees it without its console.
	if !strings.Contains(out, "reported this failure to the server as node mon-2 (authenticated: session)") {
		t.Errorf("the refused agent did not report its failure:\n%s", out)
	}
	w.inspectUntil(t, "mon-2", 10*time.Second, func(s *inspect.Story) string {
		if s.Cluster == nil {
			return "the cluster's part"
		}
		for _, e := range s.Cluster.Events {
			if e.Object == "NodeBinding/mon-2" && e.Reason == string(attest.ReasonNodeReport) && strings.Contains(e.Message, "SecureBootDisabled") {
				return ""
			}
		}
		return "the node's report of its refusal (SecureBootDisabled) as an Event"
	})

	// Which MachineConfigs a machine gets before it is approved, read
	// from the cluster.
	var pool struct {
		MachineConfigs []struct{ Name, Place string }
	}
	if err := json.Unmarshal([]byte(w.nodeproofCmd(t, "inspect", "pool", "worker", "-o", "json")), &pool); err != nil {
		t.Fatal(err)
	}
	var public []string
	for _, m := range pool.MachineConfigs {
		if m.Place == "public" {
			public = append(public, m.Name)
		}
	}
	if strings.Join(public, " ") != "50-worker-chrony 50-worker-nodeproof-agent 99-worker-ssh" || len(pool.MachineConfigs) != 7 {
		t.Errorf("nodeproof inspect pool worker: public %v of %d", public, len(pool.MachineConfigs))
	}

	srv := scrape(t, metricsAddr(t, w.serverLog))
	var apr map[string]*dto.MetricFamily
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		apr = scrape(t, metricsAddr(t, w.approverLog))
		if value(apr, "nodeproof_approver_nodes", map[string]string{"reason": string(attest.ReasonNodeAttested)}) == 1 || time.Now().After(deadline) {
			break
		}
	}
	checks := []struct {
		what string
		fams map[string]*dto.MetricFamily
		name string
		l    map[string]string
		want float64
	}{
		{"the enrolment", srv, "nodeproof_server_attestations_total", map[string]string{"kind": "tpm", "purpose": "enrol", "result": "passed"}, 1},
		{"the Secure Boot off refusal", srv, "nodeproof_server_attestations_total", map[string]string{"kind": "tpm", "result": "refused", "reason": "SecureBootDisabled"}, 1},
		{"the refused machine's report", srv, "nodeproof_server_requests_total", map[string]string{"endpoint": "report", "code": "200"}, 1},
		{"the config token spent", srv, "nodeproof_server_token_uses_total", map[string]string{"token": "config", "result": "accepted"}, 1},
		{"the attested config", srv, "nodeproof_server_config_fetches_total", map[string]string{"tier": "attested", "code": "200"}, 1},
		{"two verifications timed", srv, "nodeproof_server_request_duration_seconds", map[string]string{"endpoint": "verify"}, 2},
		{"the CSR approved", apr, "nodeproof_approver_decisions_total", map[string]string{"action": "approve"}, 1},
		{"the attested node", apr, "nodeproof_approver_nodes", map[string]string{"reason": string(attest.ReasonNodeAttested)}, 1},
		{"no unattested node", apr, "nodeproof_approver_nodes", map[string]string{"reason": "AttestationFailed"}, 0},
	}
	for _, c := range checks {
		if got := value(c.fams, c.name, c.l); got != c.want {
			t.Errorf("%s: %s%v = %v, want %v", c.what, c.name, c.l, got, c.want)
		}
	}
	if ca := value(srv, "nodeproof_server_certificate_expiry_timestamp_seconds", map[string]string{"cert": "ca"}); ca < float64(time.Now().AddDate(9, 0, 0).Unix()) {
		t.Errorf("the CA's expiry %v: want nodeproof's new CA, ten years out", ca)
	}

	// The cloud kinds' trust anchors, exported whatever the policy takes:
	// the Nitro root G1 (2049) and the AWS Region certificates.
	if g1 := value(srv, "nodeproof_trust_anchor_expiry_timestamp_seconds", map[string]string{"kind": "aws-nitrotpm", "role": "root"}); g1 != float64(time.Date(2049, 10, 28, 14, 28, 5, 0, time.UTC).Unix()) {
		t.Errorf("the Nitro root G1's expiry: %v, want 2049-10-28T14:28:05Z", g1)
	}

	var missing []string
	used := monitoringMetrics(t)
	for _, n := range used {
		if srv[n] == nil && apr[n] == nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		t.Errorf("deploy/monitoring reads metrics that neither process exports: %v", missing)
	}
	t.Logf("deploy/monitoring reads %d metrics, all exported: %v", len(used), used)
}
