package serve

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/mcs/rejudge"
)

// fleetJudge re-judges every enrolled node's last verified claims when
// the policy in force changes (mcs/rejudge.Run), on one replica: the
// holder of the cluster keeper's Lease (Keeper.Leading), or the one server
// of directory mode, or, in cluster mode without a keeper, every replica
// (their passes write the same changes, and a node already written is not
// written again). It judges:
//   - the version in force once this replica leads: at its start, and
//     when it wins the Lease (a policy changed while no server ran, or
//     while another led, is judged);
//   - each version applied, at once, and once more settle later, when
//     every replica judges by it (a re-attestation that another replica
//     passed by the old policy meanwhile is judged again).
//
// A pass runs beside the maintenance (never two at once); a pass that
// fails (the list) is tried again at the next look.
type fleetJudge struct {
	o       rejudge.Options // Store, Events, Clock, Log; Policy and Version per pass
	leading func() bool     // nil: always
	settle  time.Duration
	nodes   *prometheus.CounterVec
	passes  prometheus.Counter

	mu      sync.Mutex // guards what follows
	running bool
	judged  string    // the version last judged while leading
	again   time.Time // when to judge judged once more (zero: no)
}

// Results of nodeproof_server_policy_rejudged_nodes_total.
var rejudgeResults = []string{"judged", "failed", "refailed", "cleared", "audited", "not_judged", "errors"}

func newFleetJudge(o rejudge.Options, leading func() bool, settle time.Duration, reg prometheus.Registerer) (*fleetJudge, error) {
	f := &fleetJudge{o: o, leading: leading, settle: settle,
		nodes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeproof_server_policy_rejudged_nodes_total",
			Help: "Nodes the re-judges of the fleet at a policy change saw (docs/lifetime.md, When the policy changes): judged (pass or fail), failed (newly failing: tainted), refailed (failing by another rule), cleared (failed by a re-judge, passing again), audited (audits changed), not_judged (nothing recorded decides it), errors (a write failed).",
		}, []string{"result"}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeproof_server_policy_rejudges_total",
			Help: "Re-judges of the fleet this replica ran (one list of the bindings each).",
		}),
	}
	for _, r := range rejudgeResults {
		f.nodes.WithLabelValues(r)
	}
	if err := reg.Register(f.nodes); err != nil {
		return nil, err
	}
	return f, reg.Register(f.passes)
}

// look starts a pass of pol (version) when one is due; applied says the
// version was applied just now.
func (f *fleetJudge) look(ctx context.Context, pol *policy.Policy, version string, applied bool) {
	if f == nil {
		return
	}
	if f.leading != nil && !f.leading() {
		f.mu.Lock()
		f.judged, f.again = "", time.Time{} // judged anew when leading again
		f.mu.Unlock()
		return
	}
	now := f.o.Clock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if applied && version == f.judged {
		f.again = now.Add(f.settle) // edited back to a version judged: judge it again, settled
	}
	first := version != f.judged
	due := first || (!f.again.IsZero() && !now.Before(f.again))
	if f.running || !due {
		return
	}
	f.running = true
	go f.pass(ctx, pol, version, first)
}

// pass is one re-judge of the fleet by pol.
func (f *fleetJudge) pass(ctx context.Context, pol *policy.Policy, version string, first bool) {
	o := f.o
	o.Policy, o.Version = pol, version
	c, err := rejudge.Run(ctx, o)
	f.passes.Inc()
	for r, n := range map[string]int{"judged": c.Judged, "failed": c.Failed, "refailed": c.Refailed, "cleared": c.Cleared,
		"audited": c.Audited, "not_judged": c.NotJudged, "errors": c.Errors} {
		f.nodes.WithLabelValues(r).Add(float64(n))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running = false
	switch {
	case err != nil:
		o.Log.Error("policy re-judge of the fleet failed; trying again at the next look", "version", version, "err", err.Error())
	case first:
		f.judged, f.again = version, o.Clock().Add(f.settle)
	default:
		f.again = time.Time{}
	}
}
