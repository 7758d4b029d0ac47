// Package faults breaks a running deployment while machines provision —
// the server and the approver killed with SIGKILL and restarted, the API
// server unreachable for 30 seconds, every key and certificate rotated —
// and checks that nothing is lost: every machine gets its config and its
// kubelet certificate approved, exactly once, no record is lost and no
// config token works twice. It runs bench/fleet worlds: real etcd and
// kube-apiserver, `nodeproof serve` and `nodeproof approve` as processes,
// TPM-model, GCP and AWS machines.
package faults

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/bench/fleet"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/api"
)

var nodeproofBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nodeproof-faults-")
	if err != nil {
		panic(err)
	}
	nodeproofBin = filepath.Join(dir, "nodeproof")
	if out, err := exec.Command("go", "build", "-o", nodeproofBin, "../../cmd/nodeproof").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build nodeproof: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func world(t *testing.T, o fleet.Options) *fleet.World {
	t.Helper()
	o.Dir, o.Root, o.Nodeproof = t.TempDir(), "../..", nodeproofBin
	o.Log = t.Logf
	w, err := fleet.Start(context.Background(), t, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Close()
		if t.Failed() {
			t.Logf("--- serve ---\n%s\n--- approve ---\n%s", w.Server.Tail(), w.Approver.Tail())
		}
	})
	return w
}

// burst is machines provisioning.
type burst struct {
	// finished counts the machines done (with or without error).
	finished atomic.Int64
	errs     []error
	done     chan struct{}
}

// startBurst provisions ms, arriving within spread.
func startBurst(ctx context.Context, w *fleet.World, ms []*fleet.Machine, spread time.Duration) *burst {
	b := &burst{errs: make([]error, len(ms)), done: make(chan struct{})}
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * spread / time.Duration(len(ms)))
			b.errs[i] = w.Provision(ctx, m, fleet.ProvisionOptions{})
			b.finished.Add(1)
		}()
	}
	go func() { wg.Wait(); close(b.done) }()
	return b
}

// wait returns each machine's error once all have finished.
func (b *burst) wait() []error {
	<-b.done
	return b.errs
}

// settle checks the end state of a fault test and reports it as rows:
// every machine provisioned and approved, nothing lost or duplicated, no
// config token good twice.
func settle(t *testing.T, w *fleet.World, fault string, ms []*fleet.Machine, errs []error, approvals *fleet.Approvals) {
	t.Helper()
	ctx := context.Background()
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			t.Logf("%s: %v", ms[i].Name, err)
		}
	}
	approved := approvals.WaitAll(ms, 3*time.Minute)
	audit, err := w.Audit(ctx, ms)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range audit.Problems {
		t.Log(p)
	}
	again := 0
	reattested := 0
	for _, m := range ms {
		if m.Attestations > 1 {
			reattested++
		}
		if m.ConfigToken == "" {
			continue
		}
		c, err := agent.NewClient(w.URL, w.Bundle)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.FetchConfig(ctx, "worker", m.ConfigToken)
		var r *agent.Refused
		if !errors.As(err, &r) || r.Refusal.Reason != attest.ReasonTokenUsed {
			again++
			t.Logf("%s: its config token again: %v", m.Name, err)
		}
	}
	t.Logf("%s: %d machines, %d failed, %d approved, %d attested more than once", fault, len(ms), failed, approved, reattested)
	n := len(ms)
	attacktable.Check(t, "faults", fault+": machines provisioned", fmt.Sprintf("%d of %d", n, n), fmt.Sprintf("%d of %d", n-failed, n))
	attacktable.Check(t, "faults", fault+": kubelet CSRs approved", fmt.Sprintf("%d of %d", n, n), fmt.Sprintf("%d of %d", approved, n))
	attacktable.Check(t, "faults", fault+": records lost or attested machines left unapproved", "0", fmt.Sprint(audit.Lost))
	attacktable.Check(t, "faults", fault+": CSRs approved twice or records used twice", "0", fmt.Sprint(audit.Duplicated))
	attacktable.Check(t, "faults", fault+": config tokens that work a second time", "0", fmt.Sprint(again))
}

// TestFaultKillDuringBurst: 48 machines arrive within 2 s and fetch ~1 MB
// configs; the server is killed with SIGKILL twice and the approver once
// in the middle, each restarted half a second later.
func TestFaultKillDuringBurst(t *testing.T) {
	w := world(t, fleet.Options{GrowConfig: true})
	ms, err := w.Machines("kill", 32, 8, 8)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	approvals := w.WatchApprovals(ctx)
	b := startBurst(ctx, w, ms, 2*time.Second)

	kill := func(p *fleet.Process, at time.Duration) {
		time.Sleep(at)
		p.Kill()
		through := b.finished.Load()
		t.Logf("killed %s (-9) with %d of %d machines through", p.Name, through, len(ms))
		if through == int64(len(ms)) {
			t.Errorf("%s killed after the burst", p.Name)
		}
		time.Sleep(500 * time.Millisecond)
		if err := p.Start(); err != nil {
			t.Error(err)
		}
	}
	kill(w.Server, 800*time.Millisecond)
	kill(w.Approver, 700*time.Millisecond)
	kill(w.Server, 500*time.Millisecond)
	settle(t, w, "kill -9 of the server (twice) and the approver mid-burst", ms, b.wait(), approvals)
}

// TestFaultAPIServerOutage: the API server is unreachable for 30 s while 20
// machines provision and the real Ignition binary fetches a config: the
// server answers 503 with Retry-After meanwhile; the agent and Ignition
// retry; everything completes when the API server is back.
func TestFaultAPIServerOutage(t *testing.T) {
	w := world(t, fleet.Options{APIProxy: true})
	ms, err := w.Machines("outage", 12, 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	approvals := w.WatchApprovals(ctx)

	// A machine attested before the outage, whose Ignition fetches during
	// it.
	probe, err := w.Machines("ignition", 0, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := agent.NewClient(w.URL, w.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	vr, err := probe[0].Evidence.Attest(ctx, c, "worker", probe[0].Name, probe[0].Pub)
	if err != nil {
		t.Fatal(err)
	}
	pointer := pointerConfig(t, w, vr.ConfigToken)

	b := startBurst(ctx, w, ms, 2*time.Second)
	time.Sleep(time.Second)
	w.Proxy.Cut()
	cut := time.Now()
	t.Logf("API server unreachable (%d of %d machines through)", b.finished.Load(), len(ms))

	attacktable.Check(t, "faults", "API server unreachable: a config fetch with a valid config token", "503 with Retry-After", probeFetch(t, w, vr.ConfigToken))
	type result struct {
		cached []byte
		out    string
		err    error
	}
	ign := make(chan result, 1)
	go func() {
		cached, out, err := testenv.RunIgnitionFetchContext(ctx, testenv.IgnitionBinary(t), t.TempDir(), pointer, "")
		ign <- result{cached, out, err}
	}()

	time.Sleep(30*time.Second - time.Since(cut))
	if err := w.Proxy.Restore(); err != nil {
		t.Fatal(err)
	}
	t.Log("API server reachable again")
	r := <-ign
	got := "fetched the full config after the API server came back"
	switch {
	case r.err != nil:
		got = fmt.Sprintf("failed: %v", r.err)
		t.Log(r.out)
	case !strings.Contains(string(r.cached), api.FirstBootFiles[0]):
		got = "fetched something else"
	case !strings.Contains(r.out, "503") && !strings.Contains(r.out, "Service Unavailable"):
		got = "fetched without having met the outage"
		t.Log(r.out)
	}
	attacktable.Check(t, "faults", "API server unreachable: the real Ignition fetching with a config token", "fetched the full config after the API server came back", got)
	settle(t, w, "API server unreachable for 30 s mid-burst", ms, b.wait(), approvals)
}

// pointerConfig writes a pointer config (nodeproof pointer) that carries
// token and gives Ignition 90 s in all.
func pointerConfig(t *testing.T, w *fleet.World, token string) string {
	t.Helper()
	dir := t.TempDir()
	bundle, tok, out := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "token"), filepath.Join(dir, "pointer.ign")
	os.WriteFile(bundle, w.Bundle, 0o600)
	os.WriteFile(tok, []byte(token), 0o600)
	if b, err := exec.Command(nodeproofBin, "pointer", "--url", w.URL, "--ca-bundle", bundle, "--pool", "worker",
		"--token-file", tok, "--http-total", "90s", "-o", out).CombinedOutput(); err != nil {
		t.Fatalf("nodeproof pointer: %v\n%s", err, b)
	}
	return out
}

// probeFetch asks for the config with token once and says how the server
// answered.
func probeFetch(t *testing.T, w *fleet.World, token string) string {
	t.Helper()
	c, err := agent.NewClient(w.URL, w.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodGet, w.URL+"/config/worker", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode == http.StatusServiceUnavailable && err == nil && secs > 0 {
		return "503 with Retry-After"
	}
	return fmt.Sprintf("%d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
}

// TestFaultRotationUnderLoad: while 40 machines provision (over 8 s) and the
// real Ignition fetches with pointer configs written before any rotation
// (the old CA bundle; the old provisioning token, or a config token), the
// CA is rotated, the serving certificate reissued, the provisioning token
// rotated and the sealing key rotated twice: no machine fails.
func TestFaultRotationUnderLoad(t *testing.T) {
	w := world(t, fleet.Options{ServeArgs: []string{"--reload-interval", "500ms"}})
	ms, err := w.Machines("rotate", 24, 8, 8)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	approvals := w.WatchApprovals(ctx)

	// What machines created before the rotations hold: the CA bundle (in
	// w.Bundle, which every fleet machine trusts), the provisioning token,
	// and config tokens of machines attested now.
	oldToken := strings.TrimSpace(run(t, "token", "show", "--state-dir", w.StateDir))
	probes, err := w.Machines("ignition", 0, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	var pointers []string
	for _, p := range probes {
		c, err := agent.NewClient(w.URL, w.Bundle)
		if err != nil {
			t.Fatal(err)
		}
		vr, err := p.Evidence.Attest(ctx, c, "worker", p.Name, p.Pub)
		if err != nil {
			t.Fatal(err)
		}
		pointers = append(pointers, pointerConfig(t, w, vr.ConfigToken))
	}
	pointers = append(pointers, pointerConfig(t, w, oldToken), pointerConfig(t, w, oldToken))

	b := startBurst(ctx, w, ms, 8*time.Second)
	ignition := make(chan string, len(pointers))
	var iwg sync.WaitGroup
	start := time.Now()
	for i, p := range pointers {
		iwg.Add(1)
		go func() {
			defer iwg.Done()
			time.Sleep(time.Duration(i+1) * 1500 * time.Millisecond)
			cached, out, err := testenv.RunIgnitionFetchContext(ctx, testenv.IgnitionBinary(t), t.TempDir(), p, "")
			switch {
			case err != nil:
				ignition <- fmt.Sprintf("pointer %d: %v\n%s", i, err, out)
			case !strings.Contains(string(cached), api.FirstBootFiles[0]):
				ignition <- fmt.Sprintf("pointer %d: no full config", i)
			}
		}()
	}
	rotations := []struct {
		at   time.Duration
		args []string
	}{
		{time.Second, []string{"keys", "rotate", "--activate-after", "0"}},
		{2 * time.Second, []string{"ca", "rotate", "--hosts", "127.0.0.1"}},
		{3 * time.Second, []string{"token", "rotate"}},
		{4500 * time.Millisecond, []string{"ca", "rotate", "--serving-only", "--hosts", "127.0.0.1"}},
		{6 * time.Second, []string{"keys", "rotate", "--activate-after", "0"}},
	}
	for _, r := range rotations {
		time.Sleep(time.Until(start.Add(r.at)))
		out := run(t, append(r.args, "--state-dir", w.StateDir)...)
		t.Logf("%s (%d of %d machines through): %s", strings.Join(r.args[:2], " "), b.finished.Load(), len(ms), strings.TrimSpace(out))
	}
	if newToken := strings.TrimSpace(run(t, "token", "show", "--state-dir", w.StateDir)); newToken == oldToken {
		t.Fatal("the provisioning token did not rotate")
	}
	// The rotations took effect in the running server.
	time.Sleep(time.Second) // its reload interval is 500 ms
	bundle := []byte(run(t, "ca", "show", "--print-bundle", "--state-dir", w.StateDir))
	active, _ := pem.Decode(bundle)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(w.URL, "https://"), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	chain := conn.ConnectionState().PeerCertificates
	conn.Close()
	if active == nil || len(chain) != 2 || !bytes.Equal(chain[0].RawIssuer, mustCert(t, active.Bytes).RawSubject) {
		t.Fatalf("the server does not serve a certificate of the rotated CA (chain of %d)", len(chain))
	}
	for _, want := range []string{"sealing keys reloaded", "provisioning tokens reloaded"} {
		if !strings.Contains(readFile(t, w.Server.Log), want) {
			t.Fatalf("the server never logged %q", want)
		}
	}
	iwg.Wait()
	close(ignition)
	failures := 0
	for msg := range ignition {
		failures++
		t.Log(msg)
	}
	attacktable.Check(t, "faults", "rotation under load: the real Ignition with pointer configs written before the rotations (old CA bundle; old provisioning token or a config token)",
		fmt.Sprintf("%d of %d fetched", len(pointers), len(pointers)), fmt.Sprintf("%d of %d fetched", len(pointers)-failures, len(pointers)))
	settle(t, w, "CA, serving certificate, provisioning token and sealing key rotated mid-burst", ms, b.wait(), approvals)
}

// run runs the nodeproof binary and returns its output, failing the test
// on a non-zero exit.
func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(nodeproofBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nodeproof %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func mustCert(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
