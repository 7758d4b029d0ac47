package approver

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/leader"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// LeaseName is the Lease the approver's replicas elect a leader on.
const LeaseName = "nodeproof-approver"

// Runner runs the CSR approver (and, with Nodes, the node controller)
// until its context ends: the fields say where the cluster and its records
// are, who leads, and how the decisions go; Run runs it.
type Runner struct {
	// REST reaches the API server (required). Run makes its clients from
	// it, each with a rate limiter of its own (REST's QPS and Burst):
	// decisions, Events and certificate lineages never wait behind one
	// another.
	REST *rest.Config
	// StoreNamespace holds the NodeAttestation records, NodeBindings and
	// lineages (kubestore; default "nodeproof").
	StoreNamespace string
	// LeaderElect runs terms only while this replica holds the Lease
	// LeaseNamespace/LeaseName (default namespace "nodeproof"), as
	// Identity (required with LeaderElect). The timings are
	// leader.Options'.
	LeaderElect                               bool
	LeaseNamespace                            string
	Identity                                  string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// DenyUnattested is Decider.DenyUnattested.
	DenyUnattested bool
	// Policy, when set, gives each pool's lifetime: how long an
	// attestation stays fresh (Decider.StaleAfter) and the taint's effect
	// (NodeOptions.Lifetime). Nil: the defaults (3 h, NoSchedule).
	Policy *policy.Policy
	// Nodes runs the node controller (the Attested condition and the
	// nodeproof.io/unattested taint) beside the CSR controller.
	Nodes bool
	// Workers, PerNodeRate and PerNodeBurst are Options'.
	Workers      int
	PerNodeRate  rate.Limit
	PerNodeBurst int
	// Metrics, if set, counts decisions (NewMetrics).
	Metrics *Metrics
	Clock   func() time.Time
	Log     *slog.Logger
}

// running is one Run's clients and stores, shared by its terms.
type running struct {
	r            Runner
	kc, events   kubernetes.Interface
	st           *kubestore.Store
	lineageStore *kubestore.Store
}

// Run runs the approver until ctx ends. Under leader election it acts only
// while this replica holds the Lease: each term runs fresh controllers (new
// informers, caches and queue) on one watch of records and bindings
// (kubestore.Cached), and a term that ends before ctx does (the Lease
// lost, e.g. while the API server was unreachable) stops them and
// campaigns again in the same process (leader.Run), so an API server blip
// costs no restart.
func (r Runner) Run(ctx context.Context) error {
	if r.REST == nil || r.Clock == nil || r.Log == nil {
		return errors.New("approver: Runner: REST, Clock and Log are required")
	}
	if r.StoreNamespace == "" {
		r.StoreNamespace = "nodeproof"
	}
	if r.LeaseNamespace == "" {
		r.LeaseNamespace = "nodeproof"
	}
	kc, err := kubernetes.NewForConfig(r.REST)
	if err != nil {
		return err
	}
	events, err := kubernetes.NewForConfig(r.REST) // its own rate limiter
	if err != nil {
		return err
	}
	cl, err := kubestore.NewClient(r.REST)
	if err != nil {
		return err
	}
	st, err := kubestore.New(cl, r.StoreNamespace, r.Clock)
	if err != nil {
		return err
	}
	defer st.Close()
	// Certificate lineages are written through a client of their own (its
	// own rate limit, as events have): recording one machine's certificate
	// must not delay another's approval.
	lcl, err := kubestore.NewClient(r.REST)
	if err != nil {
		return err
	}
	lineageStore, err := kubestore.New(lcl, r.StoreNamespace, r.Clock)
	if err != nil {
		return err
	}
	run := &running{r: r, kc: kc, events: events, st: st, lineageStore: lineageStore}
	if _, err := run.newController(st, nil, st, nil, nil); err != nil { // check the options before campaigning
		return err
	}
	if !r.LeaderElect {
		r.Log.Info("approver starting without leader election")
		return run.term(ctx)
	}
	if r.Identity == "" {
		return errors.New("approver: Runner: leader election needs an Identity")
	}
	return leader.Run(ctx, leader.Options{
		Client: kc, Namespace: r.LeaseNamespace, Name: LeaseName, Role: "approver", Identity: r.Identity,
		LeaseDuration: r.LeaseDuration, RenewDeadline: r.RenewDeadline, RetryPeriod: r.RetryPeriod,
		OnNewLeader: func(id string) { r.Log.Info("approver leader", "leader", id, "me", id == r.Identity) },
		Log:         r.Log,
	}, func(lctx context.Context) {
		if err := run.term(lctx); err != nil && lctx.Err() == nil {
			r.Log.Error("approver term ended with an error", "err", err.Error())
		}
	})
}

// staleAfter is the policy's StaleAfter of a pool (nil without a policy:
// the Decider's default).
func (run *running) staleAfter() func(string) time.Duration {
	pol := run.r.Policy
	if pol == nil {
		return nil
	}
	return func(pool string) time.Duration { return pol.LifetimeOf(pool).StaleAfter.Duration }
}

// lifetime is the policy's StaleAfter and taint effect of a pool (nil
// without a policy: the node controller's defaults).
func (run *running) lifetime() func(string) (time.Duration, corev1.TaintEffect) {
	pol := run.r.Policy
	if pol == nil {
		return nil
	}
	return func(pool string) (time.Duration, corev1.TaintEffect) {
		l := pol.LifetimeOf(pool)
		return l.StaleAfter.Duration, corev1.TaintEffect(l.TaintEffect)
	}
}

// newController makes a controller for one term: nothing of a previous
// term's caches or queue is carried over.
func (run *running) newController(reads, fresh Store, lineages, freshLineages store.Lineages, tokens store.TokenIndex) (*Controller, error) {
	r := run.r
	return New(Options{
		Client: run.kc, EventClient: run.events, Decider: &Decider{Store: reads, Fresh: fresh, Lineages: lineages, FreshLineages: freshLineages,
			Tokens: tokens, Clock: r.Clock, DenyUnattested: r.DenyUnattested, StaleAfter: run.staleAfter()},
		Workers: r.Workers, PerNodeRate: r.PerNodeRate, PerNodeBurst: r.PerNodeBurst,
		Metrics: r.Metrics, Clock: r.Clock, Log: r.Log,
	})
}

// term runs the CSR controller and, with Nodes, the node controller, both
// on one watch of records and bindings, until ctx ends or either stops.
func (run *running) term(ctx context.Context) error {
	r := run.r
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Decisions read records and bindings from a watch of their own
	// (kubestore.Cached): no GET or LIST per CSR.
	cached, err := kubestore.NewCached(r.REST, run.st)
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
	lineages, err := cached.LineagesWith(run.lineageStore)
	if err != nil {
		return err
	}
	ctl, err := run.newController(cached, run.st, lineages, run.st, cached)
	if err != nil {
		return err
	}
	if !r.Nodes {
		go func() {
			if err := <-cacheErr; err != nil && ctx.Err() == nil {
				r.Log.Error("record and binding watch stopped", "err", err.Error())
				cancel()
			}
		}()
		return ctl.Run(ctx)
	}
	// The node controller reads the decisions' binding watch: one watch of
	// the bindings, not two.
	nc, err := NewNodeController(NodeOptions{Client: run.kc, EventClient: run.events, Bindings: cached,
		Lifetime: run.lifetime(), Clock: r.Clock, Log: r.Log, Metrics: r.Metrics})
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
