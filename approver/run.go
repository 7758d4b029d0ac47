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

// RunOptions is everything Run needs: where the cluster and its records
// are, who leads, and how the decisions go.
type RunOptions struct {
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

// Run runs the CSR approver (and, with Nodes, the node controller) until
// ctx ends. Under leader election it acts only while this replica holds
// the Lease: each term runs fresh controllers (new informers, caches and
// queue) on one watch of records and bindings (kubestore.Cached), and a
// term that ends before ctx does (the Lease lost, e.g. while the API
// server was unreachable) stops them and campaigns again in the same
// process (leader.Run), so an API server blip costs no restart.
func Run(ctx context.Context, o RunOptions) error {
	if o.REST == nil || o.Clock == nil || o.Log == nil {
		return errors.New("approver: RunOptions: REST, Clock and Log are required")
	}
	if o.StoreNamespace == "" {
		o.StoreNamespace = "nodeproof"
	}
	if o.LeaseNamespace == "" {
		o.LeaseNamespace = "nodeproof"
	}
	kc, err := kubernetes.NewForConfig(o.REST)
	if err != nil {
		return err
	}
	events, err := kubernetes.NewForConfig(o.REST) // its own rate limiter
	if err != nil {
		return err
	}
	cl, err := kubestore.NewClient(o.REST)
	if err != nil {
		return err
	}
	st, err := kubestore.New(cl, o.StoreNamespace, o.Clock)
	if err != nil {
		return err
	}
	defer st.Close()
	// Certificate lineages are written through a client of their own (its
	// own rate limit, as events have): recording one machine's certificate
	// must not delay another's approval.
	lcl, err := kubestore.NewClient(o.REST)
	if err != nil {
		return err
	}
	lineageStore, err := kubestore.New(lcl, o.StoreNamespace, o.Clock)
	if err != nil {
		return err
	}

	var staleAfter func(string) time.Duration
	var lifetime func(string) (time.Duration, corev1.TaintEffect)
	if pol := o.Policy; pol != nil {
		staleAfter = func(pool string) time.Duration { return pol.LifetimeOf(pool).StaleAfter.Duration }
		lifetime = func(pool string) (time.Duration, corev1.TaintEffect) {
			l := pol.LifetimeOf(pool)
			return l.StaleAfter.Duration, corev1.TaintEffect(l.TaintEffect)
		}
	}
	// newController makes a controller for one term: nothing of a previous
	// term's caches or queue is carried over.
	newController := func(reads, fresh Store, lineages, freshLineages store.Lineages, tokens store.TokenIndex) (*Controller, error) {
		return New(Options{
			Client: kc, EventClient: events, Decider: &Decider{Store: reads, Fresh: fresh, Lineages: lineages, FreshLineages: freshLineages,
				Tokens: tokens, Clock: o.Clock, DenyUnattested: o.DenyUnattested, StaleAfter: staleAfter},
			Workers: o.Workers, PerNodeRate: o.PerNodeRate, PerNodeBurst: o.PerNodeBurst,
			Metrics: o.Metrics, Clock: o.Clock, Log: o.Log,
		})
	}
	if _, err := newController(st, nil, st, nil, nil); err != nil { // check the options before campaigning
		return err
	}
	// term runs the CSR controller and, with Nodes, the node controller,
	// both on one watch of records and bindings, until ctx ends or either
	// stops.
	term := func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// Decisions read records and bindings from a watch of their own
		// (kubestore.Cached): no GET or LIST per CSR.
		cached, err := kubestore.NewCached(o.REST, st)
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
		ctl, err := newController(cached, st, lineages, st, cached)
		if err != nil {
			return err
		}
		if !o.Nodes {
			go func() {
				if err := <-cacheErr; err != nil && ctx.Err() == nil {
					o.Log.Error("record and binding watch stopped", "err", err.Error())
					cancel()
				}
			}()
			return ctl.Run(ctx)
		}
		// The node controller reads the decisions' binding watch: one
		// watch of the bindings, not two.
		nc, err := NewNodeController(NodeOptions{Client: kc, EventClient: events, Bindings: cached,
			Lifetime: lifetime, Clock: o.Clock, Log: o.Log, Metrics: o.Metrics})
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

	if !o.LeaderElect {
		o.Log.Info("approver starting without leader election")
		return term(ctx)
	}
	if o.Identity == "" {
		return errors.New("approver: RunOptions: leader election needs an Identity")
	}
	return leader.Run(ctx, leader.Options{
		Client: kc, Namespace: o.LeaseNamespace, Name: LeaseName, Role: "approver", Identity: o.Identity,
		LeaseDuration: o.LeaseDuration, RenewDeadline: o.RenewDeadline, RetryPeriod: o.RetryPeriod,
		OnNewLeader: func(id string) { o.Log.Info("approver leader", "leader", id, "me", id == o.Identity) },
		Log:         o.Log,
	}, func(lctx context.Context) {
		if err := term(lctx); err != nil && lctx.Err() == nil {
			o.Log.Error("approver term ended with an error", "err", err.Error())
		}
	})
}
