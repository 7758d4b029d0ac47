package main

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/bench/fleet"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/mcs/rejudge"
)

// dayOptions shape a fleet's day after the enrolment burst (-hours):
// every hour, every node re-attests once, the round spread over a
// compressed hour.
type dayOptions struct {
	hours int
	// hour is a compressed hour: the round's re-attestations start evenly
	// within it.
	hour time.Duration
	// policyChangeAt is the hour before whose round the policy changes
	// and the fleet is re-judged (-1: none). See policyChange.
	policyChangeAt int
}

// policyChange is the day's policy change re-judging the fleet
// (mcs/rejudge, the server's pass at each applied version): the worker
// pool's policy changed three times, each judged before the next — a
// revocation no node booted (a digest none measured: every node judged,
// none written), the revocation of the kernel every TPM node booted (each
// failed: its status written, an Event), the policy put back (those
// cleared). For each: the pass's counts from the server's log line, the
// time from the file's write to that line, and the API writes meanwhile.
// A pass whose counts are not these is an error.
func policyChange(ctx context.Context, w *fleet.World, ms []*fleet.Machine) (string, error) {
	bs, err := tpm.LogBootState(firmwaretestdata.MustLog("rhel8-uefi"), crypto.SHA256)
	if err != nil {
		return "", err
	}
	kernels := bs.Kernels()
	if len(kernels) == 0 {
		return "", errors.New("policy change: the TPM machines' log names no kernel")
	}
	nTPM := 0
	for _, m := range ms {
		if m.Kind == attest.KindTPM && m.NodeName != "" {
			nTPM++
		}
	}
	steps := []struct {
		name            string
		pol             *policytest.Builder
		failed, cleared int
	}{
		{"a revocation no node booted (tpm.deniedDigests: a digest none measured)", fleet.PolicyDenying(w.RootsDir, strings.Repeat("ab", 32)), 0, 0},
		{"the revocation of the kernel every TPM node booted", fleet.PolicyDenying(w.RootsDir, kernels[len(kernels)-1]), nTPM, 0},
		{"the policy put back", fleet.Policy(w.RootsDir), 0, nTPM},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nThe policy changed before hour %%d's round, three times, the fleet re-judged at each (%d nodes, %d with TPM evidence):\n\n", len(ms), nTPM)
	fmt.Fprintf(&b, "| change | nodes judged / not judged | failed / cleared | the pass took (server) | file written → pass logged | API writes per node meanwhile (every writer) |\n|---|---|---|---|---|---|\n")
	for _, st := range steps {
		doc, err := st.pol.YAML()
		if err != nil {
			return "", err
		}
		calls0, err := apiCalls(ctx, w)
		if err != nil {
			return "", err
		}
		pass, took, err := applyPolicy(ctx, w, doc)
		if err != nil {
			return "", fmt.Errorf("policy change %q: %w", st.name, err)
		}
		calls1, err := apiCalls(ctx, w)
		if err != nil {
			return "", err
		}
		writes := 0.0
		for k, v := range delta(calls0, calls1) {
			if isWrite(k) && !perCluster(k) {
				writes += v
			}
		}
		if pass.Failed != st.failed || pass.Cleared != st.cleared || pass.Errors != 0 {
			return "", fmt.Errorf("policy change %q: the pass failed %d, cleared %d, %d errors; want %d, %d, 0", st.name, pass.Failed, pass.Cleared, pass.Errors, st.failed, st.cleared)
		}
		fmt.Fprintf(&b, "| %s | %d / %d | %d / %d | %s | %s | %.3f |\n", st.name, pass.Judged, pass.NotJudged, pass.Failed, pass.Cleared,
			pass.Took.Round(time.Millisecond), took.Round(time.Millisecond), writes/float64(len(ms)))
	}
	return b.String(), nil
}

// rejudgeLine is the server's log line of a re-judge pass.
const rejudgeLine = "policy re-judged the fleet"

// applyPolicy writes doc over the servers' policy file (a rename: a
// reload reads it whole) and waits for the server to apply it and judge
// the fleet by it: the pass's counts (from its log line, by the version
// the reload logged) and the time from the write to that line.
func applyPolicy(ctx context.Context, w *fleet.World, doc []byte) (rejudge.Counts, time.Duration, error) {
	reloads := len(logLines(w.Server.Log, "policy reloaded"))
	passes := len(logLines(w.Server.Log, rejudgeLine)) // a version put back was judged before
	tmp := w.PolicyFile + ".new"
	if err := os.WriteFile(tmp, doc, 0o600); err != nil {
		return rejudge.Counts{}, 0, err
	}
	start := time.Now()
	if err := os.Rename(tmp, w.PolicyFile); err != nil {
		return rejudge.Counts{}, 0, err
	}
	version := ""
	var err error
	for deadline := start.Add(10 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err := ctx.Err(); err != nil {
			return rejudge.Counts{}, 0, err
		}
		if version == "" {
			if rs := logLines(w.Server.Log, "policy reloaded"); len(rs) > reloads {
				version, _ = rs[reloads]["version"].(string)
			}
			continue
		}
		for _, l := range logLines(w.Server.Log, rejudgeLine)[passes:] {
			if l["version"] != version {
				continue
			}
			var c rejudge.Counts
			took, _ := l["took"].(string)
			delete(l, "took")
			b, _ := json.Marshal(l)
			if err := json.Unmarshal(b, &c); err != nil {
				return c, 0, fmt.Errorf("the pass's log line: %w", err)
			}
			if c.Took, err = time.ParseDuration(took); err != nil {
				return c, 0, fmt.Errorf("the pass's log line: took %q: %w", took, err)
			}
			return c, time.Since(start), nil
		}
	}
	return rejudge.Counts{}, 0, fmt.Errorf("the server did not apply and judge the policy within 10 minutes (version %q)", version)
}

// logLines are the JSON lines of a process's log whose msg is msg.
func logLines(path, msg string) []map[string]any {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []map[string]any
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// hourRound is one hour of the day: every node re-attests once.
type hourRound struct {
	count, errs int
	firstErr    error
	took        time.Duration
	lat         []time.Duration
	calls       map[string]float64 // API calls during the round, by verb and resource
	// bindingBytes is what the NodeBindings hold in etcd after the
	// round (each re-attestation rewrites its node's status).
	bindingBytes int64
	// serverHeap is the server's live heap after the round.
	serverHeap int64
}

// isWrite says whether an API verb writes.
func isWrite(verbResource string) bool {
	switch strings.SplitN(verbResource, " ", 2)[0] {
	case "POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION":
		return true
	}
	return false
}

// perCluster says whether writes to a resource come from the cluster's
// processes by the wall clock, not from nodes (leader elections' Lease
// renewals).
func perCluster(verbResource string) bool {
	return strings.HasSuffix(verbResource, " leases")
}

// runDay runs o.hours rounds over ms and reports each round, the API
// writes per node per day (enrolment, from enrolCalls, plus 24 rounds)
// and the re-attestations' latencies. It reports failed when any
// re-attestation failed.
func runDay(ctx context.Context, w *fleet.World, ms []*fleet.Machine, o dayOptions, enrolCalls map[string]float64, enrolWall time.Duration, debugAddr string) (string, bool, error) {
	if len(ms) == 0 {
		return "", true, errors.New("day: no machine was provisioned")
	}
	n := len(ms)
	var rounds []hourRound
	var extra strings.Builder
	dayBegin := time.Now()
	for h := 1; h <= o.hours; h++ {
		if h == o.policyChangeAt {
			row, err := policyChange(ctx, w, ms)
			if err != nil {
				return "", true, err
			}
			extra.WriteString(fmt.Sprintf(row, h))
		}
		calls0, err := apiCalls(ctx, w)
		if err != nil {
			return "", false, err
		}
		r := hourRound{count: n, lat: make([]time.Duration, n)}
		errs := make([]error, n)
		begin := time.Now()
		var wg sync.WaitGroup
		for i, m := range ms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i)*o.hour/time.Duration(n) - time.Since(begin))
				cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
				r.lat[i], errs[i] = w.Reattest(cctx, m, fleet.ProvisionOptions{})
			}()
		}
		wg.Wait()
		r.took = time.Since(begin)
		calls1, err := apiCalls(ctx, w)
		if err != nil {
			return "", false, err
		}
		r.calls = delta(calls0, calls1)
		if r.bindingBytes, err = bindingBytes(ctx, w); err != nil {
			return "", false, err
		}
		if r.serverHeap, err = liveHeap(ctx, debugAddr); err != nil {
			return "", false, err
		}
		var ok []time.Duration
		for i, e := range errs {
			if e != nil {
				r.errs++
				if r.firstErr == nil {
					r.firstErr = e
				}
				continue
			}
			ok = append(ok, r.lat[i])
		}
		r.lat = ok
		rounds = append(rounds, r)
		log.Printf("hour %d of %d: %d re-attestations in %s, %d errors", h, o.hours, n, r.took.Round(time.Millisecond), r.errs)
	}
	dayWall := time.Since(dayBegin)
	return dayReport(n, o, rounds, enrolCalls, enrolWall, dayWall) + extra.String(), failedRounds(rounds), nil
}

func failedRounds(rs []hourRound) bool {
	for _, r := range rs {
		if r.errs > 0 {
			return true
		}
	}
	return false
}

// delta is after − before, the keys that grew.
func delta(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// quantile is the p-quantile of d (sorted here), rounded.
func quantile(d []time.Duration, p float64) string {
	if len(d) == 0 {
		return "-"
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[int(float64(len(d)-1)*p)].Round(time.Millisecond).String()
}

func dayReport(n int, o dayOptions, rounds []hourRound, enrol map[string]float64, enrolWall, dayWall time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nA day: %d nodes, every node re-attesting once an hour for %d hours, each hour compressed into %s (the agent's --mode reattest, a new connection each):\n\n", n, len(rounds), o.hour)
	fmt.Fprintf(&b, "| hour | re-attestations | round took | p50 / p99 | errors | API writes per node (every writer) | NodeBinding bytes per node in etcd after it | server live heap after it |\n|---|---|---|---|---|---|---|---|\n")
	var all []time.Duration
	hourly := map[string]float64{}
	errs := 0
	var firstErr error
	for i, r := range rounds {
		w := 0.0
		for k, v := range r.calls {
			if isWrite(k) {
				w += v
				hourly[k] += v / float64(len(rounds))
			}
		}
		all = append(all, r.lat...)
		errs += r.errs
		if firstErr == nil {
			firstErr = r.firstErr
		}
		fmt.Fprintf(&b, "| %d | %d | %s | %s / %s | %d | %.3f | %s | %s |\n", i+1, r.count, r.took.Round(time.Millisecond), quantile(r.lat, .5), quantile(r.lat, .99), r.errs, w/float64(n), perNode(r.bindingBytes, n), mb(r.serverHeap))
	}
	fmt.Fprintf(&b, "| all %d hours | %d | | %s / %s | %d | | | |\n", len(rounds), len(all)+errs, quantile(all, .5), quantile(all, .99), errs)
	if firstErr != nil {
		fmt.Fprintf(&b, "\nfirst error: %v\n", firstErr)
	}

	// Writes per node per day: the enrolment's, then 24 hours of the
	// hours measured (their mean); leases by the wall clock.
	keys := map[string]bool{}
	for k := range enrol {
		if isWrite(k) {
			keys[k] = true
		}
	}
	for k := range hourly {
		keys[k] = true
	}
	fmt.Fprintf(&b, "\nAPI writes per node per day (the API server's apiserver_request_total; the enrolment burst's, then each hour's mean over the %d hours measured, times 24):\n\n", len(rounds))
	fmt.Fprintf(&b, "| verb resource | at enrolment | per hour | per day (enrolment + 24 hours) |\n|---|---|---|---|\n")
	dayTotal, enrolTotal, hourTotal := 0.0, 0.0, 0.0
	for _, k := range sortedKeys(keys) {
		e, h := enrol[k]/float64(n), hourly[k]/float64(n)
		if perCluster(k) {
			// By the wall clock: a compressed hour holds fewer renewals
			// than a real one. Scaled to a real day.
			rate := (enrol[k] + hourly[k]*float64(len(rounds))) / (enrolWall + dayWall).Seconds()
			d := rate * 86400 / float64(n)
			fmt.Fprintf(&b, "| %s (per cluster, by the wall clock: %.2f a second) | %.3f | %.3f | %.3f |\n", k, rate, e, h, d)
			dayTotal += d
			continue
		}
		d := e + 24*h
		enrolTotal += e
		hourTotal += h
		dayTotal += d
		fmt.Fprintf(&b, "| %s | %.3f | %.3f | %.3f |\n", k, e, h, d)
	}
	fmt.Fprintf(&b, "| **all, leases apart** | %.3f | %.3f | %.3f |\n", enrolTotal, hourTotal, enrolTotal+24*hourTotal)
	fmt.Fprintf(&b, "| **all, with leases over a real day** | | | %.3f |\n", dayTotal)
	return b.String()
}
