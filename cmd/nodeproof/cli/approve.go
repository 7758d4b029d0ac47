package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/leader"
	"github.com/nodeproof/nodeproof/metrics"
	"github.com/nodeproof/nodeproof/safetext"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// ApproveConfig is everything `nodeproof approve` needs; flags fill it.
type ApproveConfig struct {
	Kubeconfig     string // empty: in-cluster
	StoreNamespace string
	// LeaderElect runs the approver only while this replica holds the
	// Lease LeaseNamespace/nodeproof-approver.
	LeaderElect    bool
	LeaseNamespace string
	Identity       string
	// LeaseDuration, RenewDeadline and RetryPeriod time the Lease (zero:
	// leader.Run's defaults, 15 s, 10 s, 2 s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	MetricsAddr    string // serves /metrics and /healthz; empty: off
	DenyUnattested bool
	// Policy, when set, gives each pool's lifetime (freshness window and
	// taint effect); empty: the defaults (3 h, NoSchedule).
	Policy string
	// Nodes runs the node controller (the Attested condition and the
	// nodeproof.io/unattested taint) beside the CSR controller.
	Nodes        bool
	Workers      int
	PerNodeRate  float64
	PerNodeBurst int
	// QPS and Burst bound the approver's API calls (client-go's defaults,
	// 5 and 10, would hold a scale-up of hundreds of nodes to a few CSRs a
	// second: a decision takes three or four calls).
	QPS   float64
	Burst int
	Clock func() time.Time
	Log   *slog.Logger
	// Ready, if set, is called with the metrics address once it listens.
	Ready func(metrics net.Addr)
}

func approveFlags(fs *flag.FlagSet, c *ApproveConfig) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "the cluster's kubeconfig (default: the in-cluster service account)")
	fs.StringVar(&c.StoreNamespace, "store-namespace", defaultStoreNamespace, "kubernetes store: namespace of the NodeAttestation, AttestationMarker and NodeBinding objects (serve's --store-namespace)")
	fs.BoolVar(&c.LeaderElect, "leader-elect", true, "act only while holding the Lease (run several replicas)")
	fs.StringVar(&c.LeaseNamespace, "leader-elect-namespace", "nodeproof", "namespace of the Lease nodeproof-approver")
	fs.StringVar(&c.Identity, "leader-elect-id", "", "this replica's identity (default: $POD_NAME, else the host name)")
	fs.DurationVar(&c.LeaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long another replica waits after the leader's last renewal before it takes over")
	fs.DurationVar(&c.RenewDeadline, "leader-elect-renew-deadline", 10*time.Second, "the leader stops acting when it could not renew for this long (less than the lease duration)")
	fs.DurationVar(&c.RetryPeriod, "leader-elect-retry-period", 2*time.Second, "how often the Lease is tried")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", ":9090", "serve /metrics and /healthz here; empty: off")
	fs.BoolVar(&c.DenyUnattested, "deny-unattested", false, "deny kubelet CSRs without evidence instead of leaving them for another approver")
	fs.StringVar(&c.Policy, "policy", "", "the attestation policy (serve's --policy): each pool's lifetime — how long an attestation stays fresh, the taint effect (default: 3 h, NoSchedule)")
	fs.BoolVar(&c.Nodes, "manage-nodes", true, "keep each node's Attested condition and nodeproof.io/unattested taint")
	fs.IntVar(&c.Workers, "workers", approver.DefaultWorkers, "CSRs decided in parallel")
	fs.Float64Var(&c.PerNodeRate, "per-node-rate", approver.DefaultPerNodeRate, "decisions per second for the CSRs of one requester: a node, a per-node bootstrap token (a shared requester: per requester and node name)")
	fs.IntVar(&c.PerNodeBurst, "per-node-burst", approver.DefaultPerNodeBurst, "burst of the per-requester limit")
	fs.Float64Var(&c.QPS, "kube-api-qps", 100, "API calls per second (events have a budget of their own)")
	fs.IntVar(&c.Burst, "kube-api-burst", 200, "API call burst")
}

func cmdApprove(ctx context.Context, in *invocation) error {
	stderr := in.stderr
	var c ApproveConfig
	fs := in.flags()
	approveFlags(fs, &c)
	logFormat := fs.String("log-format", "json", "json or text")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	var h slog.Handler = slog.NewJSONHandler(stderr, nil)
	if *logFormat == "text" {
		h = slog.NewTextHandler(stderr, nil)
	}
	c.Log, c.Clock = slog.New(safetext.Handler(h)), time.Now
	// client-go's leader election logs through klog (process-wide): send
	// it to the same structured log.
	klog.SetSlogLogger(c.Log)
	return Approve(ctx, c)
}

// Approve runs the CSR approver until ctx ends. Under leader election it
// acts only while this replica holds the Lease: each term runs a fresh
// controller (new informers, caches and queue), and a term that ends
// before ctx does (the Lease lost, e.g. while the API server was
// unreachable) stops the controller and campaigns again in the same
// process (leader.Run), so an API server blip costs no restart.
func Approve(ctx context.Context, c ApproveConfig) error {
	if c.Clock == nil || c.Log == nil {
		return errors.New("approve: Clock and Log are required")
	}
	cfg, err := restConfig(c.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "nodeproof-approver"
	if c.QPS > 0 {
		cfg.QPS, cfg.Burst = float32(c.QPS), c.Burst
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	events, err := kubernetes.NewForConfig(cfg) // its own rate limiter
	if err != nil {
		return err
	}
	cl, err := kubestore.NewClient(cfg)
	if err != nil {
		return err
	}
	st, err := kubestore.New(cl, orDefault(c.StoreNamespace, "nodeproof"), c.Clock)
	if err != nil {
		return err
	}
	defer st.Close()
	// Certificate lineages are written through a client of their own (its
	// own rate limit, as events have): recording one machine's certificate
	// must not delay another's approval.
	lcl, err := kubestore.NewClient(cfg)
	if err != nil {
		return err
	}
	lineageStore, err := kubestore.New(lcl, orDefault(c.StoreNamespace, "nodeproof"), c.Clock)
	if err != nil {
		return err
	}

	var staleAfter func(string) time.Duration
	var lifetime func(string) (time.Duration, corev1.TaintEffect)
	if c.Policy != "" {
		pol, err := loadPolicy(c.Policy)
		if err != nil {
			return err
		}
		staleAfter = func(pool string) time.Duration { return pol.LifetimeOf(pool).StaleAfter.Duration }
		lifetime = func(pool string) (time.Duration, corev1.TaintEffect) {
			l := pol.LifetimeOf(pool)
			return l.StaleAfter.Duration, corev1.TaintEffect(l.TaintEffect)
		}
	}

	reg := metrics.NewRegistry()
	am, err := approver.NewMetrics(reg)
	if err != nil {
		return err
	}
	// newController makes a controller for one term: nothing of a previous
	// term's caches or queue is carried over.
	newController := func(reads, fresh store.Store, lineages store.Lineages) (*approver.Controller, error) {
		return approver.New(approver.Options{
			Client: kc, EventClient: events, Decider: &approver.Decider{Store: reads, Fresh: fresh, Lineages: lineages,
				Clock: c.Clock, DenyUnattested: c.DenyUnattested, StaleAfter: staleAfter},
			Workers: c.Workers, PerNodeRate: rate.Limit(c.PerNodeRate), PerNodeBurst: c.PerNodeBurst,
			Metrics: am, Clock: c.Clock, Log: c.Log,
		})
	}
	if _, err := newController(st, nil, nil); err != nil { // check the options before serving
		return err
	}
	// runTerm runs the CSR controller and, with c.Nodes, the node
	// controller, both on one watch of records and bindings, until ctx
	// ends or either stops.
	runTerm := func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// Decisions read records and bindings from a watch of their own
		// (kubestore.Cached): no GET or LIST per CSR.
		cached, err := kubestore.NewCached(cfg, st)
		if err != nil {
			return err
		}
		cacheErr := make(chan error, 1)
		go func() { cacheErr <- cached.Start(ctx) }()
		sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
		synced := cached.WaitForSync(sctx)
		scancel()
		if !synced {
			return errors.New("approve: the NodeAttestation and NodeBinding watch did not sync within 2 minutes (does the approver may list and watch them?)")
		}
		lineages, err := cached.LineagesWith(lineageStore)
		if err != nil {
			return err
		}
		ctl, err := newController(cached, st, lineages)
		if err != nil {
			return err
		}
		if !c.Nodes {
			go func() {
				if err := <-cacheErr; err != nil && ctx.Err() == nil {
					c.Log.Error("record and binding watch stopped", "err", err.Error())
					cancel()
				}
			}()
			return ctl.Run(ctx)
		}
		// The node controller reads the decisions' binding watch: one
		// watch of the bindings, not two.
		nc, err := approver.NewNodeController(approver.NodeOptions{Client: kc, EventClient: events, Bindings: cached,
			Lifetime: lifetime, Clock: c.Clock, Log: c.Log, Metrics: am})
		if err != nil {
			return err
		}
		errs := make(chan error, 3)
		go func() { errs <- <-cacheErr }()
		go func() { errs <- nc.Run(ctx) }()
		go func() { errs <- ctl.Run(ctx) }()
		err = <-errs
		cancel()
		return err
	}

	if c.MetricsAddr != "" {
		addr, stop, err := metrics.Serve(c.MetricsAddr, reg)
		if err != nil {
			return fmt.Errorf("approve: %w", err)
		}
		defer stop()
		c.Log.Info("metrics", "addr", addr.String())
		if c.Ready != nil {
			c.Ready(addr)
		}
	}

	if !c.LeaderElect {
		c.Log.Info("approver starting without leader election")
		return runTerm(ctx)
	}
	id, err := leader.Identity(c.Identity)
	if err != nil {
		return err
	}
	return leader.Run(ctx, leader.Options{
		Client: kc, Namespace: orDefault(c.LeaseNamespace, "nodeproof"), Name: "nodeproof-approver", Role: "approver", Identity: id,
		LeaseDuration: c.LeaseDuration, RenewDeadline: c.RenewDeadline, RetryPeriod: c.RetryPeriod,
		OnNewLeader: func(leader string) { c.Log.Info("approver leader", "leader", leader, "me", leader == id) },
		Log:         c.Log,
	}, func(lctx context.Context) {
		if err := runTerm(lctx); err != nil && lctx.Err() == nil {
			c.Log.Error("approver term ended with an error", "err", err.Error())
		}
	})
}
