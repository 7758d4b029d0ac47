package serve

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/mcs"
)

// A policy's version is the SHA-256 of everything that decides it: the
// --policy file's bytes and every trust file it and the server's flags
// point to — the EK root directories' files, the EK inventory, the GCE
// vTPM roots and intermediates, the Nitro roots, the AWS region
// certificates. Removing a stolen machine's EK from the inventory, or a
// vendor CA from its directory, is a new version like an edit of the
// policy itself.

// policyVersion is the policy in pol, parsed from doc (the bytes read from
// c.Policy), with its trust files: their hash, short.
type policyVersion struct {
	doc     []byte
	pol     *policy.Policy
	version string
}

// readPolicy reads --policy once and hashes it with what it points to.
// The policy is parsed from exactly the bytes hashed.
func (c Config) readPolicy() (*policyVersion, error) {
	if c.Policy == "" {
		pol, err := LoadPolicy("")
		return &policyVersion{pol: pol, version: "default"}, err
	}
	doc, err := os.ReadFile(c.Policy)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	v := &policyVersion{doc: doc}
	v.pol, err = policy.ParseFile(doc, c.Policy)
	if err != nil {
		// A version too: a refused one is said once, not every tick.
		v.version = c.trustVersion(doc, nil)
		return v, err
	}
	v.version = c.trustVersion(doc, v.pol)
	return v, nil
}

// trustVersion hashes doc and the trust files pol (nil: none of the
// policy's) and the flags point to, as they are now.
func (c Config) trustVersion(doc []byte, pol *policy.Policy) string {
	h := sha256.New()
	put := func(kind, name string, b []byte, err error) {
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00", kind, name, len(b))
		h.Write(b)
		if err != nil {
			fmt.Fprintf(h, "\x00error %s", err)
		}
	}
	file := func(path string) {
		if path == "" {
			return
		}
		b, err := os.ReadFile(path)
		put("file", path, b, err)
	}
	dir := func(path string) {
		if path == "" {
			return
		}
		entries, err := os.ReadDir(path)
		put("dir", path, nil, err)
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			if !e.IsDir() {
				names = append(names, e.Name())
			}
		}
		slices.Sort(names)
		for _, n := range names {
			file(filepath.Join(path, n))
		}
	}
	put("policy", c.Policy, doc, nil)
	if pol != nil {
		for _, r := range pol.Trust.EKRoots {
			dir(r.Dir)
		}
		file(pol.Trust.EKInventory)
	}
	file(c.GCEVTPMRoots)
	dir(c.GCEVTPMIntermediatesDir)
	file(c.NitroTPMRoots)
	file(c.AzureVTPMRoots)
	dir(c.AzureVTPMIntermediatesDir)
	file(c.AzureIMDSRoots)
	dir(c.AzureIMDSIntermediatesDir)
	dir(c.AWSCertsDir)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// judgeVersion builds the judge of v: its policy and the verifiers of the
// kinds it takes, which read the trust files. Those files must be what v
// hashed when the build is done: a file replaced during the build is
// errChangedWhileRead, and nothing is applied.
func (c Config) judgeVersion(ctx context.Context, v *policyVersion) (mcs.Judge, error) {
	j := mcs.Judge{Policy: v.pol}
	var err error
	if j.Verifiers, err = c.verifiers(ctx, v.pol); err != nil {
		return j, err
	}
	if c.Policy != "" && c.trustVersion(v.doc, v.pol) != v.version {
		return j, errChangedWhileRead
	}
	return j, nil
}

// errChangedWhileRead: a trust file changed while the policy was built
// from it; the next look builds it again.
var errChangedWhileRead = errors.New("a trust file of the policy changed while it was read; read again")

// policyReloader looks at the policy's version at every maintenance tick
// and, when it changed, builds the policy and its verifiers from exactly
// the bytes it hashed and swaps them into the server. A version that does
// not load — a YAML error, a policy that does not check, a trust root that
// cannot be read — changes nothing: the last good version stays in force,
// the log says why (once per bad version), and
// nodeproof_server_policy_reloads_total{result="refused"} counts it, with
// nodeproof_server_policy_rejected at 1 until a good version is applied
// (which the log says ended the refusal).
type policyReloader struct {
	c       Config
	srv     *mcs.Server
	applied string // the version in force
	tried   string // the last version tried, good or bad
	refused bool   // the last version tried was refused
	reloads *prometheus.CounterVec
	bad     prometheus.Gauge
	info    *prometheus.GaugeVec

	mu     sync.Mutex   // guards status, which the admin socket reads
	status PolicyStatus // what nodeproof status shows

	fleet *fleetJudge // re-judges the fleet by the version in force
}

// PolicyStatus is the policy a server judges by, as `nodeproof status`
// shows it.
type PolicyStatus struct {
	// File is --policy ("" for the public tier only); Version the
	// version in force (policy.go: the file and every trust file it
	// points to), and since when.
	File    string    `json:"file,omitempty"`
	Version string    `json:"version"`
	Since   time.Time `json:"since"`
	// Refused is the last version that did not load, when the files hold
	// it now (the server judges by Version meanwhile), with why and when.
	Refused   string    `json:"refused,omitempty"`
	Error     string    `json:"error,omitempty"`
	RefusedAt time.Time `json:"refusedAt,omitzero"`
}

// Status is the policy in force and the last refusal that stands.
func (p *policyReloader) Status() PolicyStatus {
	if p == nil {
		return PolicyStatus{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// newPolicyReloader starts from the version the server was made with
// (applied: what serverOptions built; "" with the default policy: nothing
// to reload).
func newPolicyReloader(c Config, srv *mcs.Server, applied string, fleet *fleetJudge, reg prometheus.Registerer) (*policyReloader, error) {
	if c.Policy == "" {
		return nil, nil
	}
	p := &policyReloader{c: c, srv: srv, applied: applied, tried: applied, fleet: fleet,
		status: PolicyStatus{File: c.Policy, Version: applied, Since: c.Clock()},
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodeproof_server_policy_info",
			Help: "1 for the version of the policy in force (the --policy file and every trust file it points to; docs/operations.md, Editing the policy).",
		}, []string{"version"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeproof_server_policy_reloads_total",
			Help: "Changes of the policy (the --policy file or a trust file it points to) the server saw: applied (now in force) or refused (did not load; the last good policy stays in force, the log says why).",
		}, []string{"result"}),
		bad: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodeproof_server_policy_rejected",
			Help: "1 while the policy's files hold a version that does not load (the server judges by the last good one), else 0.",
		}),
	}
	p.reloads.WithLabelValues("applied")
	p.reloads.WithLabelValues("refused")
	p.info.WithLabelValues(applied).Set(1)
	if err := errors.Join(reg.Register(p.reloads), reg.Register(p.bad), reg.Register(p.info)); err != nil {
		return nil, err
	}
	return p, nil
}

// check reloads the policy if its version changed since it was last
// tried, then has the fleet re-judged by the version in force when that is
// due (fleetJudge).
func (p *policyReloader) check(ctx context.Context) {
	if p == nil {
		return
	}
	applied := p.applied
	p.reload(ctx)
	p.fleet.look(ctx, p.srv.Policy(), p.applied, p.applied != applied)
}

// reload reloads the policy if its version changed since it was last
// tried.
func (p *policyReloader) reload(ctx context.Context) {
	v, err := p.c.readPolicy()
	if v == nil {
		p.refuse("", err) // the file cannot be read at all
		return
	}
	if v.version == p.tried {
		return
	}
	if v.version == p.applied {
		// Edited back to the version in force.
		p.tried = v.version
		p.recovered("the policy's files are back to the version in force", v.version)
		return
	}
	if err != nil {
		p.refuse(v.version, err)
		return
	}
	j, err := p.c.judgeVersion(ctx, v)
	if errors.Is(err, errChangedWhileRead) {
		p.c.Log.Info("policy: a trust file changed while it was read; reading it again at the next look", "file", p.c.Policy)
		return
	}
	if err != nil {
		p.refuse(v.version, err)
		return
	}
	if err := p.srv.SetPolicy(j); err != nil {
		p.refuse(v.version, err)
		return
	}
	for _, w := range j.Policy.Warnings() {
		p.c.Log.Warn("policy: " + w)
	}
	was := p.applied
	p.applied, p.tried = v.version, v.version
	p.info.Reset()
	p.info.WithLabelValues(v.version).Set(1)
	p.mu.Lock()
	p.status.Version, p.status.Since = v.version, p.c.Clock()
	p.mu.Unlock()
	p.reloads.WithLabelValues("applied").Inc()
	p.recovered("", v.version)
	p.c.Log.Info("policy reloaded", "file", p.c.Policy, "version", v.version, "was", was, "pools", len(j.Policy.Pools))
}

// recovered ends a refusal: the gauge back to 0, and the log says so.
func (p *policyReloader) recovered(why, version string) {
	if why == "" {
		why = "a good version is in force again"
	}
	if p.refused {
		p.c.Log.Info("policy: the refusal is over: "+why, "file", p.c.Policy, "version", version)
	}
	p.refused = false
	p.bad.Set(0)
	p.mu.Lock()
	p.status.Refused, p.status.Error, p.status.RefusedAt = "", "", time.Time{}
	p.mu.Unlock()
}

func (p *policyReloader) refuse(version string, err error) {
	if version != "" && version == p.tried {
		return
	}
	p.tried, p.refused = version, true
	p.bad.Set(1)
	p.mu.Lock()
	p.status.Refused, p.status.Error, p.status.RefusedAt = version, err.Error(), p.c.Clock()
	p.mu.Unlock()
	p.reloads.WithLabelValues("refused").Inc()
	p.c.Log.Error("policy reload refused; the last good policy stays in force", "file", p.c.Policy, "version", version, "in force", p.applied, "err", err.Error())
}
