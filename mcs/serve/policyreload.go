package serve

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeproof/nodeproof/mcs"
)

// policyReloader re-reads --policy at every maintenance tick and, when
// its bytes changed, builds the policy and its verifiers (EK roots and
// inventory, GCP and AWS trust) and swaps them into the server. A file
// that does not load — a YAML error, a policy that does not check, a trust
// root that cannot be read — changes nothing: the last good policy stays
// in force, the log says why (once per bad version of the file), and
// nodeproof_server_policy_reloads_total{result="refused"} counts it, with
// nodeproof_server_policy_rejected at 1 until a good version is applied.
type policyReloader struct {
	c       Config
	srv     *mcs.Server
	applied [sha256.Size]byte // the file's hash when last applied
	tried   [sha256.Size]byte // the last version tried, good or bad
	reloads *prometheus.CounterVec
	bad     prometheus.Gauge
}

// newPolicyReloader starts from the policy the server was made with (the
// file's bytes now; nil when serve runs with the default policy: nothing
// to reload).
func newPolicyReloader(c Config, srv *mcs.Server, reg prometheus.Registerer) (*policyReloader, error) {
	if c.Policy == "" {
		return nil, nil
	}
	b, err := os.ReadFile(c.Policy)
	if err != nil {
		return nil, err
	}
	p := &policyReloader{c: c, srv: srv,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeproof_server_policy_reloads_total",
			Help: "Changes of the --policy file the server read: applied (now in force) or refused (did not load; the last good policy stays in force, the log says why).",
		}, []string{"result"}),
		bad: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodeproof_server_policy_rejected",
			Help: "1 while the --policy file holds a version that does not load (the server judges by the last good one), else 0.",
		}),
	}
	p.applied, p.tried = sha256.Sum256(b), sha256.Sum256(b)
	p.reloads.WithLabelValues("applied")
	p.reloads.WithLabelValues("refused")
	if err := errors.Join(reg.Register(p.reloads), reg.Register(p.bad)); err != nil {
		return nil, err
	}
	return p, nil
}

// check reloads the policy if the file changed since it was last tried.
func (p *policyReloader) check(ctx context.Context) {
	if p == nil {
		return
	}
	b, err := os.ReadFile(p.c.Policy)
	if err != nil {
		p.refuse(sha256.Sum256([]byte(err.Error())), err)
		return
	}
	sum := sha256.Sum256(b)
	if bytes.Equal(sum[:], p.tried[:]) {
		return
	}
	p.tried = sum
	if bytes.Equal(sum[:], p.applied[:]) {
		// Edited back to the policy in force.
		p.bad.Set(0)
		return
	}
	j, err := p.c.judge(ctx)
	if err != nil {
		p.refuse(sum, err)
		return
	}
	if err := p.srv.SetPolicy(j); err != nil {
		p.refuse(sum, err)
		return
	}
	for _, w := range j.Policy.Warnings() {
		p.c.Log.Warn("policy: " + w)
	}
	p.applied = sum
	p.bad.Set(0)
	p.reloads.WithLabelValues("applied").Inc()
	p.c.Log.Info("policy reloaded", "file", p.c.Policy, "pools", len(j.Policy.Pools))
}

func (p *policyReloader) refuse(sum [sha256.Size]byte, err error) {
	p.tried = sum
	p.bad.Set(1)
	p.reloads.WithLabelValues("refused").Inc()
	p.c.Log.Error("policy reload refused; the last good policy stays in force", "file", p.c.Policy, "err", err.Error())
}
