package approver

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
)

var labelsEverything = labels.Everything()

// Metrics are the approver's Prometheus metrics, registered on the
// registry the caller passes (no global registry).
type Metrics struct {
	decisions *prometheus.CounterVec
	pending   prometheus.Gauge
	latency   prometheus.Histogram
	limited   prometheus.Counter
}

// NewMetrics registers the approver's metrics on reg:
//
//	nodeproof_approver_decisions_total{action,reason}  approve | deny | leave, by Reason
//	nodeproof_approver_pending_csrs                    kubelet CSRs without a decision
//	nodeproof_approver_decision_seconds                CSR creation to approval or denial
//	nodeproof_approver_rate_limited_total              decisions postponed by a per-node limit
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
			Help: "Decisions postponed because CSRs for one node name came too fast.",
		}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.pending, m.latency, m.limited} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
