package approver

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nodeproof/nodeproof/attest"
)

var labelsEverything = labels.Everything()

// Metrics are the approver's Prometheus metrics, registered on the
// registry the caller passes (no global registry).
type Metrics struct {
	decisions *prometheus.CounterVec
	pending   prometheus.Gauge
	latency   prometheus.Histogram
	limited   prometheus.Counter
	recorded  prometheus.Counter
	nodes     *prometheus.GaugeVec

	mu        sync.Mutex
	nodeState map[string]string // node name → its condition's reason
}

// NewMetrics registers the approver's metrics on reg:
//
//	nodeproof_approver_decisions_total{action,reason}  approve | deny | leave, by Reason
//	nodeproof_approver_pending_csrs                    kubelet CSRs without a decision
//	nodeproof_approver_decision_seconds                CSR creation to approval or denial
//	nodeproof_approver_rate_limited_total              decisions postponed by a requester's limit
//	nodeproof_approver_certificates_recorded_total     kubelet client certificates added to their owner's lineage
//	nodeproof_approver_nodes{reason}                   nodeproof's nodes by their Attested condition's reason
//	                                                   (Attested, or why not), as the leader judged them; 0 on a standby
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeproof_approver_decisions_total",
			Help: "CSR decisions by action (approve, deny, leave) and reason.",
		}, []string{"action", "reason"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodeproof_approver_pending_csrs",
			Help: "Kubelet client and serving CSRs with no Approved, Denied or Failed condition.",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nodeproof_approver_decision_seconds",
			Help:    "Time from a CSR's creation to its approval or denial.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
		}),
		limited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeproof_approver_rate_limited_total",
			Help: "Decisions postponed because CSRs from one requester (a node, a per-node bootstrap token) came too fast.",
		}),
		recorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeproof_approver_certificates_recorded_total",
			Help: "Kubelet client certificates seen issued and added to the lineage of their node name's owner.",
		}),
		nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodeproof_approver_nodes",
			Help: "nodeproof's nodes by the reason of their Attested condition (Attested, AttestationFailed, AttestationStale, Revoked, NotEnrolled), as this replica judged them while it led; 0 on a standby.",
		}, []string{"reason"}),
		nodeState: map[string]string{},
	}
	for _, r := range []attest.Reason{attest.ReasonNodeAttested, attest.ReasonAttestationFailed, attest.ReasonAttestationStale, attest.ReasonRevoked, attest.ReasonNotEnrolled} {
		m.nodes.WithLabelValues(string(r))
	}
	for _, c := range []prometheus.Collector{m.decisions, m.pending, m.latency, m.limited, m.recorded, m.nodes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// node records node's judgement (reason ""): forget it.
func (m *Metrics) node(name, reason string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old, had := m.nodeState[name]
	if had && old == reason {
		return
	}
	if had {
		m.nodes.WithLabelValues(old).Dec()
		delete(m.nodeState, name)
	}
	if reason != "" {
		m.nodeState[name] = reason
		m.nodes.WithLabelValues(reason).Inc()
	}
}

// resetNodes forgets every node (a term begins or ends).
func (m *Metrics) resetNodes() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, r := range m.nodeState {
		m.nodes.WithLabelValues(r).Dec()
		delete(m.nodeState, name)
	}
}
