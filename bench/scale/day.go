package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nodeproof/nodeproof/bench/fleet"
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

// errNoRejudge is why -policy-change-at cannot run yet.
var errNoRejudge = errors.New("-policy-change-at needs the fleet re-judge (issue 42, item 4: a policy change re-judging every node), which this build does not have yet")

// policyChange is the day's policy change re-judging the fleet: the step
// -policy-change-at names. It needs the fleet re-judge, built on another
// branch; until it is merged this step refuses (and main refuses the flag
// before starting anything), rather than pretend.
//
// TODO(fleet re-judge): change the worker pool's policy in the cluster,
// wait until every node in ms has been re-judged under it, and return a
// report row: how long the fleet took, p50/p99 per node, errors, and the
// API writes per node (apiCalls before and after, as an hour's round).
func policyChange(context.Context, *fleet.World, []*fleet.Machine) (string, error) {
	return "", errNoRejudge
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
			extra.WriteString(row)
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
