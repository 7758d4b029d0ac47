package serve

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/uefivar/microsoft"
	"github.com/nodeproof/nodeproof/mcs/rejudge"
	"github.com/nodeproof/nodeproof/store"
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
//     passed by the old policy meanwhile is judged again);
//   - the version in force again every hour (rejudgeEvery): a rule whose
//     date has come (tpm.microsoftCA2023.from, a reference set's
//     notAfter) judges the nodes that have not re-attested since, and the
//     fleet's gauges (nodeproof_secureboot_ca_nodes) stay current. A pass
//     that changes nothing writes nothing.
//
// A pass runs beside the maintenance (never two at once); a pass that
// fails (the list) is tried again at the next look.
type fleetJudge struct {
	o       rejudge.Options // Store, Events, Clock, Log; Policy and Version per pass
	leading func() bool     // nil: always
	settle  time.Duration
	nodes   *prometheus.CounterVec
	passes  prometheus.Counter
	cas     *prometheus.GaugeVec

	mu      sync.Mutex // guards what follows
	running bool
	judged  string    // the version last judged while leading
	again   time.Time // when to judge judged once more (zero: no)
	last    time.Time // when the last pass started
}

// rejudgeEvery is how often the leader judges the fleet by the policy in
// force when nothing else made it: one list of the bindings an hour.
const rejudgeEvery = time.Hour

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
		cas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodeproof_secureboot_ca_nodes",
			Help: "Enrolled nodes by where they stand in the move from Microsoft's 2011 Secure Boot CAs to the 2023 ones, from their last recorded claims (docs/tpm.md, The 2023 Secure Boot CAs): db and kek the generations the variable holds (2011, 2023, 2011+2023, none, unknown), chain the CA's that verified the shim (2011, 2023, 2011+2023, other, unknown). Counted at each re-judge of the fleet, by the replica that runs it.",
		}, []string{"db", "kek", "chain"}),
	}
	// The gauge is counted by the pass's policy (its trust.secureBootCAs).
	for _, r := range rejudgeResults {
		f.nodes.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{f.nodes, f.passes, f.cas} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// count sets the Secure Boot CA gauge from a pass's list, judged by cas.
func (f *fleetJudge) count(cas microsoft.Set, bs []*store.Binding) {
	n := map[microsoft.Transition]int{}
	for _, b := range bs {
		n[cas.TransitionOfRecorded(b.Status.Claims)]++
	}
	f.cas.Reset()
	for t, c := range n {
		f.cas.WithLabelValues(t.DB, t.KEK, t.Chain).Set(float64(c))
	}
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
	due := first || (!f.again.IsZero() && !now.Before(f.again)) || now.Sub(f.last) >= rejudgeEvery
	if f.running || !due {
		return
	}
	f.running, f.last = true, now
	go f.pass(ctx, pol, version, first)
}

// pass is one re-judge of the fleet by pol.
func (f *fleetJudge) pass(ctx context.Context, pol *policy.Policy, version string, first bool) {
	o := f.o
	o.Policy, o.Version = pol, version
	o.Seen = func(bs []*store.Binding) { f.count(pol.SecureBootCAs(), bs) }
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
