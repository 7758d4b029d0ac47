// Command approver is the CSR approval benchmark (`make bench-approver`):
// from kubelet client CSR creation to approval, for N machines at once, on
// a real kube-apiserver and etcd.
//
// It starts etcd and kube-apiserver (mcs/cluster/clustertest: the binaries
// `make tools` builds, bootstrap token authentication, the CRDs of
// deploy/crds, a kubelet signer that issues approved CSRs as
// kube-controller-manager does) and, for each run, N fresh machines: what nodeproof's
// server writes when a machine attests (a per-node bootstrap token through
// mcs/cluster.Tokens, a NodeAttestation record binding a fresh ECDSA P-256
// kubelet key, with its session marker, through kubestore.CreateRecord),
// then every kubelet at once submits its client CSR with its bootstrap
// token, exactly as a kubelet does (client-go's csr.RequestCertificate,
// its own connection), and waits on its own watch until the CSR is
// approved.
//
// The approver runs as its own process (this binary, -approver), so its
// CPU time and peak RSS are its own (/proc). Two approvers are measured in
// the same run, on the same API server, alternating:
//   - nodeproof: approver.Controller with the Kubernetes store, metrics,
//     events and its JSON log, one replica (no leader election);
//   - baseline: a trivial approver built the same way (informer, work
//     queue, the same number of workers) that approves every pending
//     kubelet client CSR with UpdateApproval and nothing else.
//
// Each pair runs once per setting of the approver's client rate limits
// (-limits, per client: client-go's defaults QPS 5 / Burst 10, `nodeproof
// approve`'s 50/100, none), each run from an empty store and no CSRs.
// After each run it checks that every CSR was approved once, none denied
// or left pending, and (nodeproof) that every approved CSR consumed its own
// record and no record was consumed twice or by another CSR. It reports
// wall time, CSRs per second, latency percentiles (kubelet-observed and
// watch-observed), the approver's and the API server's CPU per CSR, the
// approver's peak RSS, and the approver's API calls by kind.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/bench/internal/proc"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

const namespace = "nodeproof"

func main() {
	// The approver process (internal).
	child := flag.String("approver", "", "internal: run as the approver process: nodeproof | trivial")
	kubeconfig := flag.String("approver-kubeconfig", "", "internal: the approver's kubeconfig")
	qps := flag.Float64("qps", 0, "internal: the approver's client QPS (0: client-go's default, -1: none)")
	burst := flag.Int("burst", 0, "internal: the approver's client burst (0: client-go's default)")
	cpuprofile := flag.String("cpuprofile", "", "internal: write the approver's CPU profile here")
	// The bench.
	n := flag.Int("n", 200, "machines per run, all at once")
	tokens := flag.Bool("tokens", true, "a bootstrap token per node (mcs/cluster.Tokens); false: one shared token, records name none")
	limits := flag.String("limits", "default,50/100,none", "the approver's client QPS/Burst settings to run, comma-separated: default (client-go's 5/10), none (no client-side limit) or QPS/BURST")
	workers := flag.Int("workers", 0, "approver workers, both approvers (0: approver.DefaultWorkers)")
	timeout := flag.Duration("timeout", 4*time.Minute, "give up on a run after this long")
	crds := flag.String("crds", "deploy/crds", "the NodeAttestation CRDs")
	profile := flag.String("profile", "", "directory: write the nodeproof approver process's CPU profile of each run here")
	out := flag.String("o", "", "also write the markdown tables here")
	verbose := flag.Bool("v", false, "log the control plane's start and stop")
	flag.Parse()

	if *child != "" {
		if err := runChild(*child, *kubeconfig, namespace, *qps, *burst, *workers, *cpuprofile); err != nil {
			fmt.Fprintln(os.Stderr, "approver:", err)
			os.Exit(1)
		}
		return
	}
	log.SetFlags(log.Ltime)
	log.SetPrefix("bench-approver: ")
	ls, err := parseLimits(*limits)
	if err != nil {
		log.Fatal(err)
	}
	t := &tb{verbose: *verbose}
	code := 0
	func() {
		defer func() {
			if r := recover(); r != nil {
				f, ok := r.(fatal)
				if !ok {
					panic(r)
				}
				log.Print(f.msg)
				code = 1
			}
		}()
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		b := &bench{t: t, n: *n, tokens: *tokens, workers: *workers, timeout: *timeout, profile: *profile}
		if err := b.main(ctx, *crds, ls, *out); err != nil {
			log.Print(err)
			code = 1
		}
	}()
	t.cleanup()
	os.Exit(code)
}

// limits is a client rate limit setting of the approver's clients.
type limits struct {
	qps   float64
	burst int
}

func (l limits) String() string {
	switch {
	case l.qps == 0:
		return "client-go default (5/10)"
	case l.qps < 0:
		return "none (QPS -1)"
	}
	return fmt.Sprintf("QPS %g / Burst %d", l.qps, l.burst)
}

func parseLimits(s string) ([]limits, error) {
	var ls []limits
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "default":
			ls = append(ls, limits{})
			continue
		case "none":
			ls = append(ls, limits{qps: -1})
			continue
		}
		q, b, ok := strings.Cut(f, "/")
		qv, err1 := strconv.ParseFloat(q, 64)
		bv, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || qv <= 0 || bv <= 0 {
			return nil, fmt.Errorf("-limits: %q is neither default nor QPS/BURST", f)
		}
		ls = append(ls, limits{qv, bv})
	}
	return ls, nil
}

type bench struct {
	t        *tb
	n        int
	tokens   bool
	workers  int
	timeout  time.Duration
	profile  string
	self     string
	dir      string
	kubecfg  string
	admin    kubernetes.Interface
	crc      client.Client
	fleet    *fleet
	obs      *observer
	apiPIDs  []int
	runIndex int
}

// result is one run's measurements.
type result struct {
	kind    string // nodeproof | baseline
	limits  limits
	n       int
	prep    time.Duration
	wall    time.Duration
	watchL  []time.Duration // observer: ADDED → approved
	clientL []time.Duration // kubelet: before create → its watch saw it approved
	stampL  []time.Duration // creationTimestamp → Approved lastUpdateTime (seconds)
	errors  int
	errMsgs []string
	dups    int
	// lineages is how many of the run's nodes have a KubeletLineage (the
	// approver saw their certificate issued), nodeproof only.
	lineages int
	cpu      time.Duration // approver process, during the run
	apiCPU   time.Duration // kube-apiserver + etcd, during the run
	rss      int64         // approver process peak RSS
	stats    childStats
}

func (b *bench) main(ctx context.Context, crds string, ls []limits, out string) error {
	var err error
	if b.self, err = os.Executable(); err != nil {
		return err
	}
	if _, err := os.Stat(crds); err != nil {
		return fmt.Errorf("the NodeAttestation CRDs (-crds): %w (run from the module root, as make bench-approver does)", err)
	}
	b.dir = b.t.TempDir()
	log.Printf("starting etcd %s and kube-apiserver %s (%s)", testenv.EtcdVersion, testenv.KubeVersion, testenv.KubebuilderAssets(b.t))
	t0 := time.Now()
	// With a kubelet signer, as in a cluster: approved CSRs get their
	// certificate, which nodeproof's approver then records in the node's
	// lineage (one write per machine, in the API calls below).
	cfg, _ := clustertest.StartSigning(b.t, crds)
	log.Printf("control plane up in %s", time.Since(t0).Round(time.Millisecond))
	if err := b.setup(ctx, cfg); err != nil {
		return err
	}

	// Warm-up, not reported: the API server's first CSRs, tokens and
	// records pay for cold caches.
	log.Printf("warm-up: 20 machines, baseline approver")
	if _, err := b.one(ctx, "baseline", limits{qps: 50, burst: 100}, 20, true); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	var results []*result
	for i, l := range ls {
		kinds := []string{"baseline", "nodeproof"}
		if i%2 == 1 {
			kinds[0], kinds[1] = kinds[1], kinds[0] // alternate, so drift hurts both alike
		}
		for _, k := range kinds {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r, err := b.one(ctx, k, l, b.n, false)
			if err != nil {
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err() // interrupted: the run's figures are not
			}
			results = append(results, r)
		}
	}
	table := b.table(results)
	fmt.Print("\n" + table)
	if out != "" {
		if err := os.WriteFile(out, []byte(table), 0o644); err != nil {
			return err
		}
	}
	for _, r := range results {
		if r.errors > 0 || r.dups > 0 {
			return errors.New("errors or duplicate approvals (see the table)")
		}
	}
	return nil
}

func (b *bench) setup(ctx context.Context, cfg *rest.Config) error {
	// The bench's own clients (the server's writes, the checks, the
	// observer) are not rate limited on the client side.
	bc := rest.CopyConfig(cfg)
	bc.QPS, bc.Burst = -1, 0
	admin, err := kubernetes.NewForConfig(bc)
	if err != nil {
		return err
	}
	b.admin = admin
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// deploy/cluster/node-bootstrap-rbac.yaml: nodeproof's tokens may
	// create CSRs (and read their own, as a kubelet's wait does).
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "nodeproof-node-bootstrapper"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-bootstrapper"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: cluster.NodeGroup}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if b.crc, err = kubestore.NewClient(bc); err != nil {
		return err
	}
	server, err := kubestore.New(b.crc, namespace, time.Now)
	if err != nil {
		return err
	}
	toks, err := cluster.NewTokens(cluster.TokenOptions{Client: admin, Server: cfg.Host,
		CABundle: func(context.Context) ([]byte, error) { return cfg.CAData, nil }, Clock: time.Now})
	if err != nil {
		return err
	}
	b.fleet = &fleet{server: server, tokens: toks}
	if !b.tokens {
		// One bootstrap token for every node, as OpenShift's stock
		// bootstrap kubeconfig; records name no token.
		shared := &store.Record{ID: randomHex(12), NodeName: "shared", Pool: "worker", Expires: time.Now().Add(2 * time.Hour)}
		if err := toks.Issue(ctx, shared); err != nil {
			return err
		}
		if err := toks.Activate(ctx, shared); err != nil {
			return err
		}
		kubeconfig, err := toks.Kubeconfig(ctx, shared)
		if err != nil {
			return err
		}
		if b.fleet.sharedToken, err = clientcmd.RESTConfigFromKubeConfig(kubeconfig); err != nil {
			return err
		}
		b.fleet.tokens = nil
	}
	// The approver processes' kubeconfig: the admin user (system:masters).
	kc := clientcmdapi.NewConfig()
	kc.Clusters["bench"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: "admin"}
	kc.CurrentContext = "bench"
	b.kubecfg = filepath.Join(b.dir, "admin.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, b.kubecfg); err != nil {
		return err
	}
	if b.obs, err = newObserver(ctx, admin); err != nil {
		return err
	}
	b.apiPIDs = proc.ChildrenNamed("kube-apiserver", "etcd")
	if len(b.apiPIDs) != 2 {
		log.Printf("warning: found %d kube-apiserver/etcd child processes, want 2: their CPU figure is incomplete", len(b.apiPIDs))
	}
	return nil
}

// one runs n machines against one approver process.
func (b *bench) one(ctx context.Context, kind string, l limits, n int, warm bool) (*result, error) {
	b.runIndex++
	short := map[string]string{"nodeproof": "np", "baseline": "bl"}[kind]
	prefix := fmt.Sprintf("r%d-%s", b.runIndex, short)
	r := &result{kind: kind, limits: l, n: n}
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	t0 := time.Now()
	ms, err := b.fleet.prepare(ctx, prefix, n)
	if err != nil {
		return nil, fmt.Errorf("preparing %d machines: %w", n, err)
	}
	r.prep = time.Since(t0)

	child := map[string]string{"nodeproof": "nodeproof", "baseline": "trivial"}[kind]
	prof := ""
	if b.profile != "" && kind == "nodeproof" {
		if err := os.MkdirAll(b.profile, 0o755); err != nil {
			return nil, err
		}
		prof, _ = filepath.Abs(filepath.Join(b.profile, fmt.Sprintf("approver-%s.pprof", limitsSlug(l))))
	}
	logPath := filepath.Join(b.dir, prefix+".log")
	ch, err := b.startChild(child, l, prof, logPath)
	if err != nil {
		return nil, err
	}
	defer ch.kill()

	cpu0, api0 := proc.CPU(ch.pid), proc.SumCPU(b.apiPIDs)
	rctx, cancel := context.WithTimeout(ctx, b.timeout)
	start := run(rctx, ms)
	cancel()
	var last time.Time
	for _, m := range ms {
		if m.seen.After(last) {
			last = m.seen
		}
	}
	if last.IsZero() {
		last = time.Now()
	}
	r.wall = last.Sub(start)
	if kind == "nodeproof" {
		// The certificates are issued after the approvals: wait for the
		// approver to record them, so its CPU and API calls include that.
		r.lineages = b.waitLineages(ctx, ms, 30*time.Second)
	}
	r.cpu, r.apiCPU = proc.CPU(ch.pid)-cpu0, proc.SumCPU(b.apiPIDs)-api0
	r.rss = proc.PeakRSS(ch.pid)
	if r.stats, err = ch.stop(); err != nil {
		return nil, err
	}
	b.check(ctx, r, ms)
	if r.stats.Errors > 0 {
		// Retried by the approver (the work queue's backoff); the outcome is
		// checked above. Show what they were.
		logged, _ := os.ReadFile(logPath)
		shown := 0
		for _, line := range strings.Split(string(logged), "\n") {
			if shown < 3 && (strings.HasPrefix(line, "error:") || strings.Contains(line, `"level":"ERROR"`)) {
				log.Printf("  %s approver, retried: %.300s", kind, line)
				shown++
			}
		}
	}
	what := kind
	if warm {
		what = "warm-up, " + kind
	}
	log.Printf("%s, %s: %d CSRs approved in %s (%.1f/s), %d errors, %d duplicates (machines prepared in %s)",
		what, l, n-r.errors, r.wall.Round(time.Millisecond), float64(n)/r.wall.Seconds(), r.errors, r.dups, r.prep.Round(time.Millisecond))
	for i, m := range r.errMsgs {
		if i == 5 {
			log.Printf("  … and %d more", len(r.errMsgs)-5)
			break
		}
		log.Printf("  error: %s", m)
	}
	return r, nil
}

// waitLineages waits up to d for every machine of ms to have a
// KubeletLineage and returns how many have one.
func (b *bench) waitLineages(ctx context.Context, ms []*machine, d time.Duration) int {
	want := map[string]bool{}
	for _, m := range ms {
		if m.err == nil {
			want[m.node] = true
		}
	}
	n := 0
	for deadline := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		var l v1alpha1.KubeletLineageList
		if err := b.crc.List(ctx, &l, client.InNamespace(namespace)); err == nil {
			n = 0
			for _, o := range l.Items {
				if want[o.Name] && len(o.Spec.Certificates) > 0 {
					n++
				}
			}
		}
		if n == len(want) || time.Now().After(deadline) {
			return n
		}
	}
}

// reset deletes the CSRs, records and markers of earlier runs, so every
// run starts from the same state: its own N records in the store (as after
// the store's GC) and only its own CSRs.
func (b *bench) reset(ctx context.Context) error {
	if err := b.admin.CertificatesV1().CertificateSigningRequests().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("reset: CSRs: %w", err)
	}
	for _, obj := range []client.Object{&v1alpha1.NodeAttestation{}, &v1alpha1.AttestationMarker{}, &v1alpha1.KubeletLineage{}} {
		if err := b.crc.DeleteAllOf(ctx, obj, client.InNamespace(namespace)); err != nil {
			return fmt.Errorf("reset: %T: %w", obj, err)
		}
	}
	return nil
}

func limitsSlug(l limits) string {
	switch {
	case l.qps == 0:
		return "default"
	case l.qps < 0:
		return "none"
	}
	return fmt.Sprintf("qps%g-burst%d", l.qps, l.burst)
}

// check reads back every CSR (and, for nodeproof, every record) of the run.
func (b *bench) check(ctx context.Context, r *result, ms []*machine) {
	fail := func(format string, args ...any) {
		r.errors++
		r.errMsgs = append(r.errMsgs, fmt.Sprintf(format, args...))
	}
	// The observer's watch may trail the kubelets' by a moment.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		all := true
		for _, m := range ms {
			if _, ok := b.obs.latency(m.name); m.err == nil && !ok {
				all = false
				break
			}
		}
		if all {
			break
		}
	}
	list, err := b.admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		fail("list CSRs: %v", err)
		return
	}
	csrs := map[string]*certv1.CertificateSigningRequest{}
	for i := range list.Items {
		csrs[list.Items[i].Name] = &list.Items[i]
	}
	approved := map[string]bool{}
	for _, m := range ms {
		if m.err != nil {
			fail("%s: %v", m.node, m.err)
			continue
		}
		c, ok := csrs[m.name]
		if !ok || c.UID != m.uid {
			fail("%s: CSR %s is gone", m.node, m.name)
			continue
		}
		nApproved := 0
		for _, cond := range c.Status.Conditions {
			switch cond.Type {
			case certv1.CertificateApproved:
				nApproved++
			case certv1.CertificateDenied, certv1.CertificateFailed:
				fail("%s: CSR %s %s (%s)", m.node, m.name, cond.Type, cond.Reason)
			}
		}
		switch {
		case len(c.Status.Conditions) == 0:
			fail("%s: CSR %s left pending", m.node, m.name)
		case nApproved > 1:
			r.dups += nApproved - 1
		}
		if nApproved == 0 {
			continue
		}
		approved[m.name] = true
		cond := approvedCond(c)
		r.stampL = append(r.stampL, cond.LastUpdateTime.Sub(c.CreationTimestamp.Time))
		r.clientL = append(r.clientL, m.seen.Sub(m.submitted))
		if d, ok := b.obs.latency(m.name); ok {
			r.watchL = append(r.watchL, d)
		}
	}
	approvals := 0.0
	for k, v := range r.stats.Decisions {
		if strings.HasPrefix(k, string(approver.Approve)+"/") {
			approvals += v
		} else {
			fail("approver decided %v CSR(s) %s", v, k)
		}
	}
	if int(approvals) > len(approved) {
		r.dups += int(approvals) - len(approved) // approval writes beyond one per CSR
	}
	if r.kind != "nodeproof" {
		return
	}
	// Every approved CSR consumed its own record; no record was consumed
	// by a CSR it was not made for, and none by two.
	var recs v1alpha1.NodeAttestationList
	if err := b.crc.List(ctx, &recs, client.InNamespace(namespace)); err != nil {
		fail("list records: %v", err)
		return
	}
	byID := map[string]*v1alpha1.NodeAttestation{}
	consumers := map[string]int{}
	for i := range recs.Items {
		rec := &recs.Items[i]
		byID[rec.Name] = rec
		if rec.Status.ConsumedBy != "" {
			consumers[rec.Status.ConsumedBy]++
		}
	}
	for _, m := range ms {
		if !approved[m.name] {
			continue
		}
		ref := m.name + "/" + string(m.uid)
		rec := byID[m.rec.ID]
		switch {
		case rec == nil:
			fail("%s: record %s is gone", m.node, m.rec.ID)
		case rec.Status.ConsumedAt == nil || rec.Status.ConsumedBy != ref:
			r.dups++ // approved without its record consumed by it
		case consumers[ref] > 1:
			r.dups += consumers[ref] - 1 // one CSR consumed several records
		}
	}
}

// child is an approver process.
type child struct {
	cmd   *exec.Cmd
	pid   int
	stdin io.WriteCloser
	lines chan string
}

func (b *bench) startChild(kind string, l limits, cpuprofile, logPath string) (*child, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := []string{"-approver", kind, "-approver-kubeconfig", b.kubecfg,
		"-qps", strconv.FormatFloat(l.qps, 'g', -1, 64), "-burst", strconv.Itoa(l.burst), "-workers", strconv.Itoa(b.workers)}
	if cpuprofile != "" {
		args = append(args, "-cpuprofile", cpuprofile)
	}
	cmd := exec.Command(b.self, args...)
	cmd.Stderr = logf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	logf.Close() // the child has it
	c := &child{cmd: cmd, pid: cmd.Process.Pid, stdin: stdin, lines: make(chan string, 4)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	select {
	case line, ok := <-c.lines:
		if ok && line == "ready" {
			return c, nil
		}
	case <-time.After(60 * time.Second):
	}
	c.kill()
	tail, _ := os.ReadFile(logPath)
	return nil, fmt.Errorf("%s approver did not start:\n%s", kind, lastLines(string(tail), 20))
}

// stop closes the approver's stdin and reads its stats.
func (c *child) stop() (childStats, error) {
	var s childStats
	c.stdin.Close()
	select {
	case line, ok := <-c.lines:
		if !ok {
			return s, fmt.Errorf("approver exited without stats: %v", c.cmd.Wait())
		}
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			return s, fmt.Errorf("approver stats %q: %w", line, err)
		}
	case <-time.After(30 * time.Second):
		return s, errors.New("approver did not stop")
	}
	return s, c.cmd.Wait()
}

func (c *child) kill() {
	if c.cmd.ProcessState == nil {
		c.cmd.Process.Kill()
		c.cmd.Wait()
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// pct is the nearest-rank percentile of sorted ds.
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(float64(len(ds))*p+0.999999) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

func dist(ds []time.Duration, unit time.Duration) string {
	ds = append([]time.Duration(nil), ds...)
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	f := func(d time.Duration) string {
		if unit == time.Second {
			return strconv.Itoa(int(d / time.Second))
		}
		return fmt.Sprintf("%.2f", d.Seconds())
	}
	return fmt.Sprintf("%s / %s / %s / %s", f(pct(ds, .5)), f(pct(ds, .9)), f(pct(ds, .99)), f(pct(ds, 1)))
}

func (b *bench) table(rs []*result) string {
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format+"\n", args...) }
	tok := "a bootstrap token per node"
	if !b.tokens {
		tok = "one shared bootstrap token"
	}
	workers := b.workers
	if workers <= 0 {
		workers = approver.DefaultWorkers
	}
	w("%d machines at once, %s, %d approver workers; %d CPUs (%s/%s), kube-apiserver %s + etcd %s on the same machine.",
		b.n, tok, workers, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, testenv.KubeVersion, testenv.EtcdVersion)
	w("")
	w("| approver client limits | approver | wall, all approved | CSRs/s | kubelet submit → saw approved, s (p50 / p90 / p99 / max) | watch: created → approved, s (p50 / p90 / p99 / max) | creationTimestamp → lastUpdateTime, whole s (p50 / p90 / p99 / max) | errors | duplicate approvals | approver API errors, retried |")
	w("|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		w("| %s | %s | %.2f s | %.1f | %s | %s | %s | %d | %d | %d |", r.limits, r.kind, r.wall.Seconds(), float64(r.n)/r.wall.Seconds(),
			dist(r.clientL, 0), dist(r.watchL, 0), dist(r.stampL, time.Second), r.errors, r.dups, r.stats.Errors)
	}
	w("")
	w("| approver client limits | approver | approver CPU per CSR | kube-apiserver + etcd CPU per CSR | approver peak RSS |")
	w("|---|---|---|---|---|")
	for _, r := range rs {
		w("| %s | %s | %.2f ms | %.2f ms | %d MB |", r.limits, r.kind, ms(r.cpu, r.n), ms(r.apiCPU, r.n), r.rss>>20)
	}
	w("")
	w("| approver client limits | nodeproof / baseline: wall | p99 (kubelet) | approver CPU per CSR | kube-apiserver + etcd CPU per CSR | peak RSS |")
	w("|---|---|---|---|---|---|")
	for _, l := range uniqLimits(rs) {
		var np, bl *result
		for _, r := range rs {
			if r.limits == l && r.kind == "nodeproof" {
				np = r
			}
			if r.limits == l && r.kind == "baseline" {
				bl = r
			}
		}
		if np == nil || bl == nil {
			continue
		}
		p99 := func(r *result) float64 {
			ds := append([]time.Duration(nil), r.clientL...)
			sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
			return float64(pct(ds, .99))
		}
		w("| %s | %.2f | %.2f | %.2f | %.2f | %.2f |", l, np.wall.Seconds()/bl.wall.Seconds(), p99(np)/p99(bl),
			float64(np.cpu)/float64(bl.cpu), float64(np.apiCPU)/float64(bl.apiCPU), float64(np.rss)/float64(bl.rss))
	}
	w("")
	w("The approver process's API calls during each run (count, mean latency on the wire, i.e. after client-side throttling), until every approved CSR's certificate was issued and, for nodeproof, recorded in its node's lineage (KubeletLineage: one create per machine):")
	w("")
	w("| approver client limits | approver | calls |")
	w("|---|---|---|")
	for _, r := range rs {
		calls := callSummary(r.stats.Calls)
		if r.kind == "nodeproof" {
			calls += fmt.Sprintf(" (lineages recorded: %d of %d)", r.lineages, r.n)
		}
		w("| %s | %s | %s |", r.limits, r.kind, calls)
	}
	w("")
	w("bench process peak RSS (control-plane client, %d kubelet clients with their watches, the record writer, the observer): %d MB",
		b.n, proc.PeakRSS(os.Getpid())>>20)
	return sb.String()
}

func callSummary(calls map[string]*callStat) string {
	keys := make([]string, 0, len(calls))
	for k := range calls {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return calls[keys[i]].N > calls[keys[j]].N || calls[keys[i]].N == calls[keys[j]].N && keys[i] < keys[j]
	})
	var parts []string
	for _, k := range keys {
		c := calls[k]
		parts = append(parts, fmt.Sprintf("%s %d × %.1f ms", k, c.N, ms(c.Total, c.N)))
	}
	return strings.Join(parts, "; ")
}

func ms(d time.Duration, n int) float64 { return float64(d) / float64(n) / 1e6 }

func uniqLimits(rs []*result) []limits {
	var out []limits
	for _, r := range rs {
		found := false
		for _, l := range out {
			found = found || l == r.limits
		}
		if !found {
			out = append(out, r.limits)
		}
	}
	return out
}
