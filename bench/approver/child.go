package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// childStats is what an approver process reports on stdout when it stops.
type childStats struct {
	// Decisions counts nodeproof_approver_decisions_total by
	// "action/reason"; the trivial approver reports "approve/AutoApproved".
	Decisions   map[string]float64 `json:"decisions"`
	RateLimited float64            `json:"rateLimited"`
	// Errors counts failed approval writes (the trivial approver) or
	// decision errors logged by the controller (nodeproof).
	Errors int64 `json:"errors"`
	// Calls are the approver's API calls by kind (timing).
	Calls map[string]*callStat `json:"calls"`
}

// runChild is an approver process: "nodeproof" (approver.Controller with
// the Kubernetes store) or "trivial" (the baseline). It prints "ready" on
// stdout once its CSR informer has synced, runs until stdin closes, then
// prints its childStats as one JSON line.
func runChild(kind, kubeconfig, namespace string, qps float64, burst, workers int, cpuprofile string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	// 0 leaves client-go's defaults (QPS 5, Burst 10), per client.
	cfg.QPS, cfg.Burst = float32(qps), burst
	tm := &timing{by: map[string]*callStat{}}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &timed{next: rt, t: tm} })
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	var once sync.Once
	ready := func() { once.Do(func() { fmt.Println("ready") }) }

	var stats childStats
	switch kind {
	case "nodeproof":
		c, err := kubestore.NewClient(cfg)
		if err != nil {
			return err
		}
		st, err := kubestore.New(c, namespace, time.Now)
		if err != nil {
			return err
		}
		cached, err := kubestore.NewCached(cfg, st)
		if err != nil {
			return err
		}
		go cached.Start(ctx)
		if !cached.WaitForSync(ctx) {
			return ctx.Err()
		}
		// As `nodeproof approve`: lineages written through a client (and a
		// rate limit) of their own.
		lc, err := kubestore.NewClient(cfg)
		if err != nil {
			return err
		}
		lst, err := kubestore.New(lc, namespace, time.Now)
		if err != nil {
			return err
		}
		lineages, err := cached.LineagesWith(lst)
		if err != nil {
			return err
		}
		reg := prometheus.NewRegistry()
		m, err := approver.NewMetrics(reg)
		if err != nil {
			return err
		}
		h := &watchHandler{Handler: slog.NewJSONHandler(os.Stderr, nil), ready: ready, errors: new(atomic.Int64)}
		ctl, err := approver.New(approver.Options{
			Client: kc, Decider: &approver.Decider{Store: cached, Fresh: st, Lineages: lineages, FreshLineages: st, Tokens: cached, Clock: time.Now},
			Workers: workers, Metrics: m, Clock: time.Now, Log: slog.New(h),
		})
		if err != nil {
			return err
		}
		if err := ctl.Run(ctx); err != nil {
			return err
		}
		stats = gather(reg)
		stats.Errors = h.errors.Load()
	case "trivial":
		n, errs, err := runTrivial(ctx, kc, workers, ready)
		if err != nil {
			return err
		}
		stats = childStats{Decisions: map[string]float64{"approve/AutoApproved": float64(n)}, Errors: errs}
	default:
		return fmt.Errorf("unknown approver %q", kind)
	}
	tm.mu.Lock()
	stats.Calls = tm.by
	tm.mu.Unlock()
	return json.NewEncoder(os.Stdout).Encode(stats)
}

// watchHandler passes the controller's log on and notices the line that
// says it runs (its informer synced) and decision errors.
type watchHandler struct {
	slog.Handler
	ready  func()
	errors *atomic.Int64
}

func (h *watchHandler) Handle(ctx context.Context, r slog.Record) error {
	switch {
	case r.Message == "approver running":
		h.ready()
	case r.Level >= slog.LevelError:
		h.errors.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h *watchHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &watchHandler{Handler: h.Handler.WithAttrs(as), ready: h.ready, errors: h.errors}
}

func (h *watchHandler) WithGroup(g string) slog.Handler {
	return &watchHandler{Handler: h.Handler.WithGroup(g), ready: h.ready, errors: h.errors}
}

func gather(reg *prometheus.Registry) childStats {
	s := childStats{Decisions: map[string]float64{}}
	mfs, err := reg.Gather()
	if err != nil {
		return s
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "nodeproof_approver_decisions_total":
				var action, reason string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "action":
						action = l.GetValue()
					case "reason":
						reason = l.GetValue()
					}
				}
				s.Decisions[action+"/"+reason] += m.GetCounter().GetValue()
			case "nodeproof_approver_rate_limited_total":
				s.RateLimited += m.GetCounter().GetValue()
			}
		}
	}
	return s
}

// runTrivial is the baseline approver: built like approver.Controller (a
// CSR informer, a rate-limited work queue, the same number of workers, an
// Approved condition written through the approval subresource) but it
// approves every pending kubelet client CSR with no store lookup, no
// parsing, no event and no log line.
func runTrivial(ctx context.Context, kc kubernetes.Interface, workers int, ready func()) (approved, errs int64, err error) {
	if workers <= 0 {
		workers = approver.DefaultWorkers
	}
	factory := informers.NewSharedInformerFactory(kc, approver.DefaultResync)
	inf := factory.Certificates().V1().CertificateSigningRequests()
	lister := inf.Lister()
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "trivial-approver"})
	defer q.ShutDown()
	enqueue := func(obj any) {
		if c, ok := obj.(*certv1.CertificateSigningRequest); ok && c.Spec.SignerName == approver.SignerKubeletClient && pending(c) {
			q.Add(c.Name)
		}
	}
	if _, err := inf.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return 0, 0, err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return 0, 0, fmt.Errorf("trivial approver: informer did not sync")
	}
	ready()
	var nApproved, nErrs atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				name, quit := q.Get()
				if quit {
					return
				}
				c, err := lister.Get(name)
				if err != nil || !pending(c) {
					q.Forget(name)
					q.Done(name)
					continue
				}
				c = c.DeepCopy()
				c.Status.Conditions = append(c.Status.Conditions, certv1.CertificateSigningRequestCondition{
					Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "AutoApproved",
					Message: "approved without evidence (benchmark baseline)", LastUpdateTime: metav1.Now(),
				})
				cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				_, err = kc.CertificatesV1().CertificateSigningRequests().UpdateApproval(cctx, c.Name, c, metav1.UpdateOptions{})
				cancel()
				if err != nil {
					nErrs.Add(1)
					fmt.Fprintf(os.Stderr, "error: approve %s (retried): %v\n", name, err)
					q.AddRateLimited(name)
				} else {
					nApproved.Add(1)
					q.Forget(name)
				}
				q.Done(name)
			}
		}()
	}
	<-ctx.Done()
	q.ShutDown()
	wg.Wait()
	return nApproved.Load(), nErrs.Load(), nil
}

// pending reports whether c has no Approved, Denied or Failed condition.
func pending(c *certv1.CertificateSigningRequest) bool {
	for _, cond := range c.Status.Conditions {
		switch cond.Type {
		case certv1.CertificateApproved, certv1.CertificateDenied, certv1.CertificateFailed:
			return false
		}
	}
	return true
}

// timing records the latency of every API call the approver process makes,
// by kind, on the wire (after client-go's client-side rate limiter: time
// a worker spends throttled is not in it).
type timing struct {
	mu sync.Mutex
	by map[string]*callStat
}

// timed is one client's transport, timed.
type timed struct {
	next http.RoundTripper
	t    *timing
}

// callStat is the calls of one kind: how many, and their total latency.
type callStat struct {
	N     int           `json:"n"`
	Total time.Duration `json:"total"`
}

func (tt *timed) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Query().Get("watch") == "true" {
		return tt.next.RoundTrip(req)
	}
	start := time.Now()
	resp, err := tt.next.RoundTrip(req)
	d := time.Since(start)
	k := callKind(req)
	t := tt.t
	t.mu.Lock()
	s := t.by[k]
	if s == nil {
		s = new(callStat)
		t.by[k] = s
	}
	s.N++
	s.Total += d
	t.mu.Unlock()
	return resp, err
}

// callKind names a request: its verb and what it acts on.
func callKind(req *http.Request) string {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	last := parts[len(parts)-1]
	res := last
	switch {
	case last == "status" || last == "approval":
		res = parts[len(parts)-3] + "/" + last
	case len(parts) >= 2 && (parts[len(parts)-2] == "nodeattestations" || parts[len(parts)-2] == "certificatesigningrequests" || parts[len(parts)-2] == "events"):
		res = parts[len(parts)-2] + " (one)"
	}
	return req.Method + " " + res
}
