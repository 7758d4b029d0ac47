package mcs

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// Metrics are the server's Prometheus metrics, registered on the registry
// the caller passes (no global registry). Every label takes values the
// server chooses (endpoints, typed reasons, tiers, status codes), never a
// path, pool or name a client sent, so no client can grow them.
//
//	nodeproof_server_requests_total{port,endpoint,code}         every request (endpoint report: nodes' failure reports)
//	nodeproof_server_request_duration_seconds{endpoint}         time to answer (verify: the verification)
//	nodeproof_server_attestations_total{kind,purpose,result,reason}  verifies: tpm|gcp|aws, enrol|reattest, passed|refused
//	nodeproof_server_config_fetches_total{tier,code}            config requests by the tier served (none when refused early)
//	nodeproof_server_limited_total{endpoint,reason}             requests refused RateLimited or Overloaded
//	nodeproof_server_token_uses_total{token,result}             config and provisioning tokens presented: accepted|refused
//	nodeproof_policy_audit_refusals_total{pool,rule,reason}     admitted attestations a rule in audit mode would have refused
//
// The audit counter's pool is one the policy names (an attestation the
// policy admitted), its rule one of policy.AuditRules.
type Metrics struct {
	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	attestations *prometheus.CounterVec
	configs      *prometheus.CounterVec
	limited      *prometheus.CounterVec
	tokens       *prometheus.CounterVec
	audits       *prometheus.CounterVec
}

// NewMetrics registers the server's metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeproof_server_requests_total", Help: "Requests by port (secure, insecure), endpoint (config, challenge, verify, healthz, other) and HTTP status.",
		}, []string{"port", "endpoint", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nodeproof_server_request_duration_seconds", Help: "Time to answer a request, by endpoint; for verify, the evidence's verification.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"endpoint"}),
		attestations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeproof_server_attestations_total", Help: "Verified attestations by evidence kind, purpose (enrol, reattest), result (passed, refused) and refusal reason.",
		}, []string{"kind", "purpose", "result", "reason"}),
		configs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeproof_server_config_fetches_total", Help: "Config requests by the tier served (public, token, attested, full-unauthenticated; none when refused before a tier) and HTTP status.",
		}, []string{"tier", "code"}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeproof_server_limited_total", Help: "Requests refused by an admission limit (RateLimited, Overloaded), by endpoint.",
		}, []string{"endpoint", "reason"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeproof_server_token_uses_total", Help: "Tokens presented for a config: config (single-use, from an attestation) or provisioning, accepted or refused.",
		}, []string{"token", "result"}),
		audits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeproof_policy_audit_refusals_total", Help: "Admitted attestations that a policy rule in audit mode would have refused, by pool, rule (policy.AuditRules) and the reason it would have given.",
		}, []string{"pool", "rule", "reason"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.attestations, m.configs, m.limited, m.tokens, m.audits} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// The series alerts and the dashboard read exist from the start.
	for _, e := range []string{"config", "challenge", "verify"} {
		for _, r := range []string{string(attest.ReasonRateLimited), string(attest.ReasonOverloaded)} {
			m.limited.WithLabelValues(e, r)
		}
	}
	for _, t := range []string{"config", "provisioning"} {
		for _, r := range []string{"accepted", "refused"} {
			m.tokens.WithLabelValues(t, r)
		}
	}
	return m, nil
}

// endpoint names a path by what it serves.
func endpoint(path string) string {
	switch {
	case path == api.PathVerify:
		return "verify"
	case path == api.PathChallenge:
		return "challenge"
	case strings.HasPrefix(path, api.PathConfig):
		return "config"
	case path == api.PathHealthz:
		return "healthz"
	case path == api.PathReport:
		return "report"
	}
	return "other"
}

// observe counts a request's decision; a nil Metrics counts nothing.
func (m *Metrics) observe(d *decision, took time.Duration) {
	if m == nil {
		return
	}
	e, code := endpoint(d.path), strconv.Itoa(d.status)
	m.requests.WithLabelValues(d.port.String(), e, code).Inc()
	m.duration.WithLabelValues(e).Observe(took.Seconds())
	if d.reason == attest.ReasonRateLimited || d.reason == attest.ReasonOverloaded {
		m.limited.WithLabelValues(e, string(d.reason)).Inc()
	}
	switch e {
	case "verify":
		if d.kind != "" {
			result := "passed"
			if d.status != 200 {
				result = "refused"
			}
			m.attestations.WithLabelValues(d.kind, d.purpose, result, string(d.reason)).Inc()
		}
	case "config":
		m.configs.WithLabelValues(d.tier, code).Inc()
		if d.cred != "" {
			result := "accepted"
			if d.status != 200 {
				result = "refused"
			}
			m.tokens.WithLabelValues(d.cred, result).Inc()
		}
	}
}

// AuditRefusals is nodeproof_policy_audit_refusals_total.
func (m *Metrics) AuditRefusals() *prometheus.CounterVec { return m.audits }

// audited counts an admitted attestation's audit reports; a nil Metrics
// counts nothing.
func (m *Metrics) audited(pool string, audits []policy.Audit) {
	if m == nil {
		return
	}
	for _, a := range audits {
		m.audits.WithLabelValues(pool, a.Rule, string(a.Reason)).Inc()
	}
}
