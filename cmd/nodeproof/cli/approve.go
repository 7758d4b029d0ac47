package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/leader"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/metrics"
	"github.com/nodeproof/nodeproof/safetext"
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
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "the cluster's kubeconfig (default: $KUBECONFIG, else the in-cluster service account)")
	fs.StringVar(&c.StoreNamespace, "store-namespace", serve.DefaultStoreNamespace, "kubernetes store: namespace of the NodeAttestation, AttestationMarker and NodeBinding objects (serve's --store-namespace)")
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
	// client-go's leader election logs through klog, and controller-runtime's
	// caches through their package logger (both process-wide): send both to
	// the same structured log (unset, controller-runtime prints a stack
	// trace the first time it logs, as at shutdown).
	klog.SetSlogLogger(c.Log)
	ctrllog.SetLogger(logr.FromSlogHandler(c.Log.Handler()))
	return Approve(ctx, c)
}

// Approve runs the CSR approver (approver.Runner) until ctx ends, with its
// metrics served on MetricsAddr.
func Approve(ctx context.Context, c ApproveConfig) error {
	if c.Clock == nil || c.Log == nil {
		return errors.New("approve: Clock and Log are required")
	}
	cfg, err := serve.RESTConfig(c.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "nodeproof-approver"
	if c.QPS > 0 {
		cfg.QPS, cfg.Burst = float32(c.QPS), c.Burst
	}
	var pol *policy.Policy
	if c.Policy != "" {
		if pol, err = serve.LoadPolicy(c.Policy); err != nil {
			return err
		}
	}
	reg := metrics.NewRegistry()
	am, err := approver.NewMetrics(reg)
	if err != nil {
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
	id := ""
	if c.LeaderElect {
		if id, err = leader.Identity(c.Identity); err != nil {
			return err
		}
	}
	err = approver.Runner{
		REST: cfg, StoreNamespace: c.StoreNamespace,
		LeaderElect: c.LeaderElect, LeaseNamespace: c.LeaseNamespace, Identity: id,
		LeaseDuration: c.LeaseDuration, RenewDeadline: c.RenewDeadline, RetryPeriod: c.RetryPeriod,
		DenyUnattested: c.DenyUnattested, Policy: pol, Nodes: c.Nodes,
		Workers: c.Workers, PerNodeRate: rate.Limit(c.PerNodeRate), PerNodeBurst: c.PerNodeBurst,
		Metrics: am, Clock: c.Clock, Log: c.Log,
	}.Run(ctx)
	if err == nil {
		c.Log.Info("stopped", "clean", true)
	}
	return err
}
