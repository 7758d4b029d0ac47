// Command scale is `make bench`: a thousand machines arrive at once, in
// a bench/fleet world: a real etcd and kube-apiserver, `nodeproof
// serve` (cluster mode, Kubernetes store, its default limits) and
// `nodeproof approve` as processes from their built binaries, and a load
// generator standing in for N machines, each from its own loopback
// address: most with a TPM (bench/simtpm, a software model producing the
// structures a TPM produces; every machine its own EK, EK certificate and
// AK), some with a GCP identity token or an AWS identity document from
// loopback metadata services. Each machine attests, fetches its ~500 KB
// rendered config with the config token, and submits its kubelet client
// CSR with the bootstrap token the config carried, exactly as a kubelet
// does; the approver approves on the real API server.
//
// It reports time until all are approved, p50/p99 time-to-config and
// time-to-approval, server and approver CPU per machine, peak RSS of each
// process, errors and lost or duplicated approvals, and the server's CPU
// per TPM attestation against the crypto floor measured in the same run.
// With -hours N it then runs a fleet's day instead of the re-attestation
// runs: every node re-attests once an hour for N compressed hours (-hour),
// and the report adds the API writes per node per day by verb, the bytes
// per node in etcd by kind (read from etcd itself) at enrolment and after
// the day, and the server's and approver's memory (docs/scaling.md).
//
// Run from the module root (make does). It exits non-zero when a machine
// or a re-attestation failed or an approval was lost or duplicated.
package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	legacytpm2 "github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/bench/fleet"
	"github.com/nodeproof/nodeproof/bench/internal/proc"
)

func main() {
	n := flag.Int("n", 1000, "machines")
	nGCP := flag.Int("gcp", 50, "of which with a GCP identity")
	nAWS := flag.Int("aws", 50, "of which with an AWS identity")
	spread := flag.Duration("spread", 3*time.Second, "the machines arrive within this")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after")
	attestOnly := flag.Int("attest-only", 200, "TPM attestations (no config, no CSR) for the server-CPU-per-attestation figure")
	steadyRate := flag.Float64("steady-rate", 20, "re-attestations per second of the steady re-attestation run (0: skip both re-attestation runs)")
	steadyFor := flag.Duration("steady-for", 30*time.Second, "length of the steady re-attestation run")
	out := flag.String("o", "", "also write the report (markdown) here")
	replicas := flag.Int("replicas", 1, "servers (more than one: sharing the keyring and the state kept in the cluster; each request to the next in turn; the re-attestation runs are skipped)")
	approvers := flag.Int("approvers", 1, "approvers, leader elected")
	var day dayOptions
	flag.IntVar(&day.hours, "hours", 0, "a day after the burst: every node re-attests once an hour for this many hours (the attestation-only and re-attestation runs are skipped), and the report adds the bytes per node in etcd and the processes' memory")
	flag.DurationVar(&day.hour, "hour", time.Minute, "a compressed hour of -hours: each hour's re-attestations start evenly within it")
	flag.IntVar(&day.policyChangeAt, "policy-change-at", -1, "the hour of -hours (2 or later: the nodes' claims are recorded at their first re-attestation) before whose round the policy changes three times and the fleet is re-judged each time: a revocation no node booted, the revocation of the TPM nodes' kernel, the policy put back (-1: none)")
	flag.Parse()
	log.SetFlags(log.Ltime)
	if *replicas > 1 {
		*steadyRate = 0
	}
	if day.policyChangeAt >= 0 && (day.policyChangeAt < 2 || day.policyChangeAt > day.hours) {
		log.Fatalf("-policy-change-at %d: want an hour from 2 to -hours (%d): the first round records the claims a re-judge reads", day.policyChangeAt, day.hours)
	}
	if day.hours > 0 {
		if *replicas > 1 {
			log.Fatal("-hours runs with one server replica")
		}
		*attestOnly, *steadyRate = 0, 0
	}
	r, failed, err := run(*n, *nGCP, *nAWS, *spread, *timeout, *attestOnly, *steadyRate, *steadyFor, *replicas, *approvers, day)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(r)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(r), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	if failed {
		log.Fatal("errors, lost or duplicated approvals: see the report")
	}
}

// tb lets the metadata fakes (written for tests) run here.
type tb struct {
	mu       sync.Mutex
	cleanups []func()
}

func (*tb) Helper()            {}
func (*tb) Fatal(args ...any)  { log.Fatal(args...) }
func (t *tb) Cleanup(f func()) { t.mu.Lock(); t.cleanups = append(t.cleanups, f); t.mu.Unlock() }
func (t *tb) close() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

// outcome is what happened to one machine.
type outcome struct {
	m        *fleet.Machine
	approved time.Duration // arrival → CSR approved (seen by the watcher)
	err      error
}

func run(n, nGCP, nAWS int, spread, timeout time.Duration, attestOnly int, steadyRate float64, steadyFor time.Duration, replicas, approvers int, day dayOptions) (string, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Minute+time.Duration(day.hours)*(3*day.hour+2*time.Minute))
	defer cancel()
	if nGCP+nAWS > n {
		return "", false, errors.New("-gcp + -aws exceed -n")
	}
	dir, err := os.MkdirTemp("", "nodeproof-scale-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(dir)
	fakes := new(tb)
	defer fakes.close()

	log.Print("building nodeproof")
	bin := filepath.Join(dir, "nodeproof")
	if b, err := exec.Command("go", "build", "-o", bin, "./cmd/nodeproof").CombinedOutput(); err != nil {
		return "", false, fmt.Errorf("go build (run from the module root): %v\n%s", err, b)
	}
	debug, err := fleet.FreePort()
	if err != nil {
		return "", false, err
	}
	approverMetrics, err := fleet.FreePort()
	if err != nil {
		return "", false, err
	}
	debugAddr, approverMetricsAddr := fmt.Sprintf("127.0.0.1:%d", debug), fmt.Sprintf("127.0.0.1:%d", approverMetrics)
	w, err := fleet.Start(ctx, fakes, fleet.Options{
		Dir: dir, Nodeproof: bin, GrowConfig: true,
		// As deploy/ runs them: a soft memory limit under the container's
		// (GOMEMLIMIT), so the garbage collector works before memory grows.
		Env:            []string{"GOMEMLIMIT=160MiB"},
		FirstServeArgs: []string{"--debug-addr", debugAddr},
		ApproveArgs:    []string{"--metrics-addr", approverMetricsAddr},
		Log:            log.Printf,
		Replicas:       replicas, Approvers: approvers,
	})
	if err != nil {
		return "", false, err
	}
	defer w.Close()

	log.Printf("making %d TPM machines (software model), %d GCP and %d AWS identities", n-nGCP-nAWS, nGCP, nAWS)
	ms, err := w.Machines("scale", n-nGCP-nAWS, nGCP, nAWS)
	if err != nil {
		return "", false, err
	}
	approvals := w.WatchApprovals(ctx)
	var memS, memA []memory
	if day.hours > 0 {
		s, a, err := memoryOf(ctx, w, debugAddr, approverMetricsAddr)
		if err != nil {
			return "", false, err
		}
		memS, memA = append(memS, s), append(memA, a)
	}

	// CPU profiles over the burst: the server's, the API server's, and
	// this load generator's own.
	secs := int(spread.Seconds()) + 15
	profile := filepath.Join(os.TempDir(), "nodeproof-scale-server.pprof")
	apiProfile := filepath.Join(os.TempDir(), "nodeproof-scale-apiserver.pprof")
	loadProfile := filepath.Join(os.TempDir(), "nodeproof-scale-loadgen.pprof")
	profiled, apiProfiled := make(chan error, 1), make(chan error, 1)
	go func() {
		profiled <- fetchProfile(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", debug, secs), profile)
	}()
	go func() {
		b, err := w.KC.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", fmt.Sprint(secs)).DoRaw(ctx)
		if err == nil {
			err = os.WriteFile(apiProfile, b, 0o644)
		}
		apiProfiled <- err
	}()
	lf, err := os.Create(loadProfile)
	if err != nil {
		return "", false, err
	}
	if err := pprof.StartCPUProfile(lf); err != nil {
		return "", false, err
	}
	calls0, err := apiCalls(ctx, w)
	if err != nil {
		return "", false, err
	}
	server := w.Server.PID()
	servers, approverPIDs := pids(w.Servers), pids(w.Approvers)
	cpuS0, cpuA0 := cpuOf(servers), cpuOf(approverPIDs)
	apiPID, etcdPID := proc.Find("kube-apiserver", w.CPDir), proc.Find("etcd", w.CPDir)
	cpuAPI0, cpuEtcd0, cpuSelf0 := proc.CPU(apiPID), proc.CPU(etcdPID), proc.CPU(os.Getpid())
	log.Printf("go: %d machines within %s", n, spread)
	begin := time.Now()
	outs := make([]*outcome, n)
	var wg sync.WaitGroup
	for i, m := range ms {
		outs[i] = &outcome{m: m}
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * spread / time.Duration(n))
			outs[i].err = w.Provision(ctx, m, fleet.ProvisionOptions{})
		}()
	}
	wg.Wait()
	approvals.WaitAll(ms, timeout-time.Since(begin))
	all := time.Since(begin)
	for _, o := range outs {
		if o.err == nil {
			if t, ok := approvals.Approved(o.m.CSRName); ok {
				o.approved = t.Sub(o.m.Start)
			} else if why, ok := approvals.Denied(o.m.CSRName); ok {
				o.err = fmt.Errorf("CSR denied: %s", why)
			} else {
				o.err = errors.New("CSR not decided before the timeout")
			}
		}
	}
	pprof.StopCPUProfile()
	lf.Close()
	calls1, err := apiCalls(ctx, w)
	if err != nil {
		return "", false, err
	}
	cpuS, cpuA := cpuOf(servers)-cpuS0, cpuOf(approverPIDs)-cpuA0
	others := map[string]time.Duration{
		"kube-apiserver": proc.CPU(apiPID) - cpuAPI0, "etcd": proc.CPU(etcdPID) - cpuEtcd0,
		"load generator (this process: the machines' TPM model, TLS, JSON, metadata fakes)": proc.CPU(os.Getpid()) - cpuSelf0,
	}

	// Lost or duplicated approvals.
	audit, err := w.Audit(ctx, ms)
	if err != nil {
		return "", false, err
	}
	var fpEnrol footprint
	if day.hours > 0 {
		if fpEnrol, err = measureFootprint(ctx, w); err != nil {
			return "", false, err
		}
		s, a, err := memoryOf(ctx, w, debugAddr, approverMetricsAddr)
		if err != nil {
			return "", false, err
		}
		memS, memA = append(memS, s), append(memA, a)
	}

	// Server CPU per TPM attestation, and the floor, in the same run.
	// The attestation-only run's profile, once the burst's is in (one
	// CPU profile at a time).
	burstProfiled := <-profiled
	attestProfile := filepath.Join(os.TempDir(), "nodeproof-scale-attest.pprof")
	attestProfiled := make(chan error, 1)
	attestProfiled <- errors.New("no attestation-only run")
	perAttest, floor, err := attestCost(ctx, w, attestOnly, server, func() {
		<-attestProfiled
		go func() {
			// The run is paced by this program (the TPM model): about 25 ms a machine.
			attestProfiled <- fetchProfile(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", debug, max(2, attestOnly/40)), attestProfile)
		}()
	})
	if err != nil {
		return "", false, err
	}

	top := profileTop("nodeproof serve", bin, profile, burstProfiled) +
		strings.Replace(profileTop("nodeproof serve", bin, attestProfile, <-attestProfiled), "over the burst", "over the attestation-only run", 1) +
		profileTop("kube-apiserver", "", apiProfile, <-apiProfiled) +
		profileTop("load generator", "", loadProfile, nil)
	r, failed := report(n, nGCP, nAWS, w.GrownBytes, spread, all, outs, cpuS, cpuA, peakOf(servers), peakOf(approverPIDs),
		audit, perAttest, floor)
	if replicas > 1 || approvers > 1 {
		r = fmt.Sprintf("\n%d server replicas (each request to the next in turn; CPU summed, RSS the largest) and %d approvers (leader elected; CPU summed)\n", replicas, approvers) + r
	}
	var provisioned []*fleet.Machine
	for _, o := range outs {
		if o.err == nil {
			provisioned = append(provisioned, o.m)
		}
	}
	re, reFailed := "", false
	if steadyRate > 0 {
		log.Printf("re-attestation: %d nodes at once, then %.0f a second for %s", len(provisioned), steadyRate, steadyFor)
		if re, reFailed, err = reattestRuns(ctx, w, provisioned, server, floor, steadyRate, steadyFor); err != nil {
			return "", false, err
		}
	}
	if day.hours > 0 {
		log.Printf("a day: %d nodes re-attest once an hour for %d hours of %s", len(provisioned), day.hours, day.hour)
		if re, reFailed, err = runDay(ctx, w, provisioned, day, delta(calls0, calls1), all, debugAddr); err != nil {
			return "", false, err
		}
		fpDay, err := measureFootprint(ctx, w)
		if err != nil {
			return "", false, err
		}
		// The day's hours took minutes: the API server's compaction (every
		// 5 minutes, of what is older than the last one) has not caught
		// up. Compacted as it would be, the database's in-use size.
		rev, err := compact(ctx, w)
		if err != nil {
			return "", false, err
		}
		time.Sleep(5 * time.Second)
		fpCompacted, err := measureFootprint(ctx, w)
		if err != nil {
			return "", false, err
		}
		s, a, err := memoryOf(ctx, w, debugAddr, approverMetricsAddr)
		if err != nil {
			return "", false, err
		}
		memS, memA = append(memS, s), append(memA, a)
		after := fmt.Sprintf("%d hours", day.hours)
		re += footprintReport(len(provisioned), fpEnrol, fpDay, after) +
			fmt.Sprintf("| etcd, compacted to revision %d (as the API server does every 5 minutes): database size / in use | | | | %s / %s | |\n",
				rev, mb(fpCompacted.dbSize), mb(fpCompacted.dbSizeInUse)) +
			memoryReport(len(provisioned), []string{"no node", "at enrolment", "after " + after}, memS, memA) +
			heapTop(debugAddr, bin)
	}
	return r + cpuSplit(all, cpuS, cpuA, others) + callsPerMachine(calls0, calls1, n) + re + "\n" + top, failed || reFailed, nil
}

// profileTop is the top of a CPU profile over the burst (bin, when set,
// symbolizes it), or why there is none.
func profileTop(what, bin, file string, err error) string {
	if err != nil {
		return what + " profile: " + err.Error() + "\n"
	}
	args := []string{"tool", "pprof", "-top", "-nodecount=20"}
	if bin != "" {
		args = append(args, bin)
	}
	b, err := exec.Command("go", append(args, file)...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s profile: %v\n%s", what, err, b)
	}
	return fmt.Sprintf("\n%s CPU profile over the burst (%s):\n%s", what, file, b)
}

// apiCalls reads the API server's request counters (apiserver_request_total),
// summed per verb and resource.
func apiCalls(ctx context.Context, w *fleet.World) (map[string]float64, error) {
	b, err := w.KC.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		labels, value, ok := strings.Cut(strings.TrimPrefix(line, "apiserver_request_total{"), "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		l := map[string]string{}
		for _, kv := range strings.Split(labels, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				l[k] = strings.Trim(v, `"`)
			}
		}
		res := l["resource"]
		if l["subresource"] != "" {
			res += "/" + l["subresource"]
		}
		out[l["verb"]+" "+res] += v
	}
	return out, nil
}

// callsPerMachine is the API calls the burst made, per machine, by verb
// and resource (everything on the API server: the server, the approver,
// the kubelets' CSRs and their watches, and this program's watch).
func callsPerMachine(before, after map[string]float64, n int) string {
	type row struct {
		key string
		per float64
	}
	var rows, rest []row
	total, listed := 0.0, 0.0
	for k, v := range after {
		d := v - before[k]
		if d <= 0 {
			continue
		}
		total += d
		if d >= float64(n)/10 {
			rows = append(rows, row{k, d / float64(n)})
			listed += d
		} else {
			rest = append(rest, row{k, d / float64(n)})
		}
	}
	byPer := func(rs []row) {
		sort.Slice(rs, func(i, j int) bool { return rs[i].per > rs[j].per || rs[i].per == rs[j].per && rs[i].key < rs[j].key })
	}
	byPer(rows)
	byPer(rest)
	var b strings.Builder
	fmt.Fprintf(&b, "\nAPI calls per machine, measured (apiserver_request_total, every verb): %.2f in all, %.2f in the verbs with at least one call per ten machines\n\n| verb resource | per machine |\n|---|---|\n",
		total/float64(n), listed/float64(n))
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %.2f |\n", r.key, r.per)
	}
	if len(rest) > 0 {
		var parts []string
		for i, r := range rest {
			if i == 8 {
				parts = append(parts, fmt.Sprintf("and %d more", len(rest)-i))
				break
			}
			parts = append(parts, fmt.Sprintf("%s %.3f", r.key, r.per))
		}
		fmt.Fprintf(&b, "\nThe rest, per machine: %s.\n", strings.Join(parts, ", "))
	}
	return b.String()
}

// cpuSplit shows where the machine's CPU went during the burst.
func cpuSplit(wall, server, approver time.Duration, others map[string]time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nCPU during the burst (%s wall, %.0f CPU-seconds available on %d cores):\n\n| process | CPU-seconds |\n|---|---|\n",
		wall.Round(time.Second), wall.Seconds()*float64(runtime.NumCPU()), runtime.NumCPU())
	fmt.Fprintf(&b, "| nodeproof serve | %.1f |\n| nodeproof approve | %.1f |\n", server.Seconds(), approver.Seconds())
	names := make([]string, 0, len(others))
	for k := range others {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, "| %s | %.1f |\n", k, others[k].Seconds())
	}
	return b.String()
}

func fetchProfile(url, file string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// attestCost runs k TPM attestations (no config, no CSR) against the
// server and returns its CPU per attestation, and the crypto floor of one
// attestation measured here, in the same run: the EK certificate's
// signature, the AK creation signature and the quote signature (ECDSA
// P-256), RSA-OAEP to the EK, SHA-256 of the event log and its PCR
// extends, 64 random bytes — what no verifier can skip.
//
// profile, called once the machines are made, starts the server's CPU
// profile of the run.
func attestCost(ctx context.Context, w *fleet.World, k, pid int, profile func()) (time.Duration, time.Duration, error) {
	if k == 0 {
		return 0, 0, nil
	}
	vendor, rootsDir := w.Vendor()
	ms, err := w.TPMMachines(k)
	if err != nil {
		return 0, 0, err
	}
	kub, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return 0, 0, err
	}
	pub, _ := x509.MarshalPKIXPublicKey(&kub.PublicKey)
	c, err := agent.NewClient(w.URL, w.Bundle)
	if err != nil {
		return 0, 0, err
	}
	profile()
	cpu0 := proc.CPU(pid)
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Pointer[error]
	sem := make(chan struct{}, 8)
	for i, m := range ms {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := c.AttestTPM(ctx, "worker", fmt.Sprintf("cost-%04d", i), m, pub); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, &err)
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return 0, 0, fmt.Errorf("%d of %d cost-run attestations failed, the first: %w", n, k, *firstErr.Load())
	}
	perAttest := (proc.CPU(pid) - cpu0) / time.Duration(k)

	// The floor, on one machine's evidence.
	v, err := tpm.NewVerifier(tpm.Options{Roots: []tpm.RootSet{mustRoots(rootsDir)}, Clock: time.Now})
	if err != nil {
		return 0, 0, err
	}
	req, err := ms[0].Request()
	if err != nil {
		return 0, 0, err
	}
	sum := sha256.Sum256(pub)
	ch, sess, err := v.Challenge("worker", sum[:], req)
	if err != nil {
		return 0, 0, err
	}
	ev, err := ms[0].Answer(ch, sum[:])
	if err != nil {
		return 0, 0, err
	}
	claims, err := v.Verify(sess, ev)
	if err != nil {
		return 0, 0, err
	}
	ekCert, err := x509.ParseCertificate(req.EKCertificate)
	if err != nil {
		return 0, 0, err
	}
	akPub, err := legacytpm2.DecodePublic(req.AK.Public)
	if err != nil {
		return 0, 0, err
	}
	ak, err := akPub.Key()
	if err != nil {
		return 0, 0, err
	}
	cs, err := legacytpm2.DecodeSignature(bytes.NewBuffer(req.AK.CreateSignature))
	if err != nil {
		return 0, 0, err
	}
	qs, err := legacytpm2.DecodeSignature(bytes.NewBuffer(ev.Quotes[0].Signature))
	if err != nil {
		return 0, 0, err
	}
	ekPub := ekCert.PublicKey.(*rsa.PublicKey)
	const rounds = 200
	start := time.Now()
	for range rounds {
		if err := ekCert.CheckSignatureFrom(vendor.Intermediate); err != nil {
			return 0, 0, err
		}
		d := sha256.Sum256(req.AK.CreateAttestation)
		if !ecdsa.Verify(ak.(*ecdsa.PublicKey), d[:], cs.ECC.R, cs.ECC.S) {
			return 0, 0, errors.New("floor: creation signature")
		}
		d = sha256.Sum256(ev.Quotes[0].Quote)
		if !ecdsa.Verify(ak.(*ecdsa.PublicKey), d[:], qs.ECC.R, qs.ECC.S) {
			return 0, 0, errors.New("floor: quote signature")
		}
		var seed [32]byte
		if _, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, ekPub, seed[:], []byte("IDENTITY\x00")); err != nil {
			return 0, 0, err
		}
		_ = sha256.Sum256(ev.EventLog)
		var pcr [64]byte
		for range claims.TPM.Boot.LogEvents {
			s := sha256.Sum256(pcr[:])
			copy(pcr[:32], s[:])
		}
		var rnd [64]byte
		rand.Read(rnd[:])
	}
	return perAttest, time.Since(start) / rounds, nil
}

func mustRoots(dir string) tpm.RootSet {
	rs, err := tpm.LoadRootSet("fleet-vendor", dir)
	if err != nil {
		log.Fatal(err)
	}
	return rs
}

func report(n, nGCP, nAWS, grown int, spread, all time.Duration, outs []*outcome, cpuS, cpuA time.Duration, rssS, rssA int64,
	audit fleet.Audit, perAttest, floor time.Duration) (string, bool) {
	var toConfig, toApproval []time.Duration
	var errs []string
	retried := 0
	for _, o := range outs {
		if o.m.Attestations > 1 {
			retried++
		}
		if o.err != nil {
			errs = append(errs, fmt.Sprintf("%s (%s): %v", o.m.Name, o.m.Kind, o.err))
			continue
		}
		toConfig = append(toConfig, o.m.Config)
		if o.approved > 0 {
			toApproval = append(toApproval, o.approved)
		}
	}
	q := func(d []time.Duration, p float64) string {
		if len(d) == 0 {
			return "-"
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[min(len(d)-1, int(float64(len(d))*p))].Round(time.Millisecond).String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d machines (%d TPM, %d GCP, %d AWS) arriving within %s, each from its own address; rendered worker config grown by %d KB of file contents\n\n",
		n, n-nGCP-nAWS, nGCP, nAWS, spread, grown>>10)
	fmt.Fprintf(&b, "| figure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| all approved after | %s |\n", all.Round(time.Millisecond))
	fmt.Fprintf(&b, "| approved | %d of %d |\n", len(toApproval), n)
	fmt.Fprintf(&b, "| time to config p50 / p99 | %s / %s |\n", q(toConfig, .5), q(toConfig, .99))
	fmt.Fprintf(&b, "| time to approval p50 / p99 | %s / %s |\n", q(toApproval, .5), q(toApproval, .99))
	fmt.Fprintf(&b, "| server CPU per machine | %s |\n", (cpuS / time.Duration(n)).Round(time.Microsecond))
	fmt.Fprintf(&b, "| approver CPU per machine | %s |\n", (cpuA / time.Duration(n)).Round(time.Microsecond))
	fmt.Fprintf(&b, "| server peak RSS | %d MB |\n", rssS>>20)
	fmt.Fprintf(&b, "| approver peak RSS | %d MB |\n", rssA>>20)
	fmt.Fprintf(&b, "| errors | %d |\n", len(errs))
	fmt.Fprintf(&b, "| machines that attested more than once | %d |\n", retried)
	fmt.Fprintf(&b, "| lost / duplicated approvals | %d / %d |\n", audit.Lost, audit.Duplicated)
	if floor > 0 {
		fmt.Fprintf(&b, "| server CPU per TPM attestation / crypto floor | %s / %s = %.2fx |\n", perAttest.Round(time.Microsecond), floor.Round(time.Microsecond), float64(perAttest)/float64(floor))
	}
	for i, e := range append(errs, audit.Problems...) {
		if i == 10 {
			fmt.Fprintf(&b, "… and %d more\n", len(errs)+len(audit.Problems)-10)
			break
		}
		fmt.Fprintln(&b, "problem:", e)
	}
	return b.String(), len(errs) > 0 || audit.Lost > 0 || audit.Duplicated > 0
}

// reattestRuns re-attests the provisioned machines: all at once (a
// reboot storm), then steadily at rate a second for d, round robin. It
// reports, per run, the time until the last was confirmed, p50/p99
// latency, the server's CPU per re-attestation against the crypto floor
// of one attestation, and the API server's requests per re-attestation
// (writes apart), read from its own counters.
func reattestRuns(ctx context.Context, w *fleet.World, ms []*fleet.Machine, server int, floor time.Duration, rate float64, d time.Duration) (string, bool, error) {
	var b strings.Builder
	failed := false
	fmt.Fprintf(&b, "\nRe-attestation (the agent's --mode reattest: the same exchange, nothing released, the outcome written to the node's binding):\n\n")
	fmt.Fprintf(&b, "| run | re-attestations | confirmed after | p50 / p99 | errors | server CPU per re-attestation / floor | API requests per re-attestation | of which writes |\n|---|---|---|---|---|---|---|---|\n")
	one := func(name string, schedule func(i int) time.Duration, count int) error {
		calls0, err := apiCalls(ctx, w)
		if err != nil {
			return err
		}
		cpu0 := proc.CPU(server)
		lat := make([]time.Duration, count)
		errs := make([]error, count)
		begin := time.Now()
		var wg sync.WaitGroup
		for i := range count {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(schedule(i) - time.Since(begin))
				lat[i], errs[i] = w.Reattest(ctx, ms[i%len(ms)], fleet.ProvisionOptions{})
			}()
		}
		wg.Wait()
		all := time.Since(begin)
		cpu := proc.CPU(server) - cpu0
		calls1, err := apiCalls(ctx, w)
		if err != nil {
			return err
		}
		var ok []time.Duration
		var firstErr error
		nErr := 0
		for i, e := range errs {
			if e != nil {
				nErr++
				if firstErr == nil {
					firstErr = e
				}
				continue
			}
			ok = append(ok, lat[i])
		}
		sort.Slice(ok, func(i, j int) bool { return ok[i] < ok[j] })
		q := func(f float64) string {
			if len(ok) == 0 {
				return "-"
			}
			return ok[int(float64(len(ok)-1)*f)].Round(time.Millisecond).String()
		}
		total, writes := 0.0, 0.0
		for k, v := range calls1 {
			dv := v - calls0[k]
			total += dv
			switch strings.SplitN(k, " ", 2)[0] {
			case "POST", "PUT", "PATCH", "DELETE", "APPLY":
				writes += dv
			}
		}
		per := cpu / time.Duration(count)
		ratio := "-"
		if floor > 0 {
			ratio = fmt.Sprintf("%s / %s = %.2fx", per.Round(time.Microsecond), floor.Round(time.Microsecond), float64(per)/float64(floor))
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s / %s | %d | %s | %.2f | %.2f |\n", name, count, all.Round(time.Millisecond), q(.5), q(.99), nErr,
			ratio, total/float64(count), writes/float64(count))
		if nErr > 0 {
			failed = true
			fmt.Fprintf(&b, "\nfirst error: %v\n\n", firstErr)
		}
		return nil
	}
	if len(ms) == 0 {
		return "", true, errors.New("re-attestation: no machine was provisioned")
	}
	if err := one("storm: every node at once", func(int) time.Duration { return 0 }, len(ms)); err != nil {
		return "", false, err
	}
	steady := int(rate * d.Seconds())
	if err := one(fmt.Sprintf("steady: %.0f a second for %s", rate, d), func(i int) time.Duration { return time.Duration(float64(i) / rate * float64(time.Second)) }, steady); err != nil {
		return "", false, err
	}
	b.WriteString("\nAPI requests are everything the API server counted during the run (the server's, the approver's and node controller's, this program's), per re-attestation.\n")
	return b.String(), failed, nil
}

func pids(ps []*fleet.Process) []int {
	var out []int
	for _, p := range ps {
		out = append(out, p.PID())
	}
	return out
}

// cpuOf sums the processes' CPU time.
func cpuOf(pids []int) time.Duration {
	var t time.Duration
	for _, p := range pids {
		t += proc.CPU(p)
	}
	return t
}

// peakOf is the largest peak RSS of the processes.
func peakOf(pids []int) int64 {
	var m int64
	for _, p := range pids {
		m = max(m, proc.PeakRSS(p))
	}
	return m
}
