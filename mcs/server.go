// Package mcs is nodeproof's Machine Config Server: a drop-in for the
// OpenShift MCS (GET|HEAD /config/<pool> with Ignition spec negotiation,
// /healthz) that releases configs by tier — public without credentials,
// full with a provisioning token or with a config token earned by
// attestation (POST /attest/v1/challenge, /attest/v1/verify).
//
// Refusals are attest.Denials, mapped to HTTP once (status.go): 4xx is
// final, 5xx with Retry-After means "not yet" — Ignition's retry rules.
// Every request ends in one structured log line, except refusals for being
// over a limit, which are sampled (a flood must not flood the log); no
// secret is logged.
package mcs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/limit"
	"github.com/nodeproof/nodeproof/mcs/seal"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/safetext"
	"github.com/nodeproof/nodeproof/store"
)

// Configs is where served bytes come from (mcs/render behind an adapter).
// Errors: ErrUnknownPool (404), ErrSpecVersion (400), ErrNotReady (503,
// quietly), or anything else (a 503, logged).
type Configs interface {
	// Public returns the public tier of pool for the Accept header.
	Public(pool, accept string) ([]byte, error)
	// Full returns the full config of pool for the Accept header, for the
	// node a record describes (nil: no particular node, e.g. the token
	// tier).
	Full(pool, accept string, node *store.Record) ([]byte, error)
	// Pools lists the pools there are configs for.
	Pools() []string
}

// PartsConfigs is a Configs that can give a full config in pieces, shared
// between requests and not to be modified, whose concatenation is the
// config; the server then writes them without assembling a copy.
type PartsConfigs interface {
	Configs
	FullParts(pool, accept string, node *store.Record) ([][]byte, error)
}

// BootstrapTokens issues per-node Kubernetes bootstrap tokens. A token is
// drawn at verify (Issue, into the record and the config token) and made
// real at the config's delivery (Activate), which is the config token's
// single-use marker: no marker object of its own.
type BootstrapTokens interface {
	// Issue draws a token for rec's node, expiring with rec, and sets
	// rec.BootstrapTokenID (and its secret). An error that is not an
	// attest.Denial is a 503.
	Issue(ctx context.Context, rec *store.Record) error
	// Activate makes rec's token usable, once: a second Activate for the
	// same record is store.ErrUsed.
	Activate(ctx context.Context, rec *store.Record) error
	// Delivered reports whether Activate has made rec's token.
	Delivered(ctx context.Context, rec *store.Record) (bool, error)
	// Revoke deletes rec's token: a delivery that sent nothing.
	Revoke(ctx context.Context, rec *store.Record) error
}

// Nodes says which Nodes exist in the cluster (cluster.Nodes: a watch of
// their names, not a read per enrolment).
type Nodes interface {
	// Exists reports whether a Node named name exists; an error when the
	// watch cannot tell (not synced), which refuses with a 503.
	Exists(name string) (bool, error)
}

// EnrolmentEvents publishes what happens to a node name
// (store/kubestore.BindingEvents), on two paths that must not share a
// budget: what anyone may send (a report) cannot bury a decision. Neither
// may block (events are best effort; every decision is logged too).
type EnrolmentEvents interface {
	// Decision reports a security decision about nodeName concerning
	// identity ("" for none): a warning for a refusal. Its budget is per
	// name, reason and identity.
	Decision(identity, nodeName string, warning bool, reason, message string)
	// Report records a node's failure report (a warning).
	Report(nodeName, reason, message string)
}

// Errors a Configs returns.
var (
	ErrUnknownPool = errors.New("unknown pool")
	ErrSpecVersion = errors.New("unsupported Ignition spec version")
	// ErrNotReady: the pool's config is not ready yet (cluster mode: the
	// watch has not synced, the pool does not exist yet, or objects its
	// config is built from have not arrived). A 503 with Retry-After, not
	// logged per request: the Configs' owner says once what is missing.
	ErrNotReady = errors.New("config not ready yet")
)

// Store is what the server uses of the store: enrolment and the
// bindings' status, the records it reads back, the single-use markers, and
// the bans and names' histories (read).
type Store interface {
	store.Bindings
	store.RecordReader
	store.Markers
	store.BanReader
	store.NameReader
}

// Options configure a Server. Each field says what it changes.
type Options struct {
	// Policy decides, per pool, what evidence is enough and what is served.
	Policy *policy.Policy
	// Configs supplies the bytes. Swappable at run time with SetConfigs.
	Configs Configs
	// Store keeps records, bindings and single-use markers.
	Store Store
	// Keys seal sessions and config tokens.
	Keys *seal.Keyring
	// Provisioning are the token-tier tokens; nil disables the token tier
	// whatever the policy says.
	Provisioning *tokens.Provisioning
	// Verifiers verify the kinds of evidence this server takes (each
	// kind's Seam: tpm.Verifier, gcp.Verifier, …); a kind absent from it
	// is refused (EvidenceKindNotAllowed).
	Verifiers attest.Registry
	// Events, when set, receives the enrolment decisions an operator must
	// see — a node name taken, an identity refused (enrolled already,
	// revoked, by policy) or enrolled again — and nodes' failure reports,
	// as Kubernetes Events on the node's NodeBinding; nil: the log only.
	Events EnrolmentEvents
	// Metrics, when set, counts every request (NewMetrics).
	Metrics *Metrics
	// Bootstrap, when set (cluster mode), gives each attested node its own
	// short-lived Kubernetes bootstrap token: Issue runs before the record
	// is written and sets Record.BootstrapTokenID.
	Bootstrap BootstrapTokens
	// Nodes, when set (cluster mode), are the cluster's Nodes: a pool
	// with requested names cannot bind the name of a Node that nodeproof
	// never owned (no binding, no history) unless an operator adopted it
	// (NodeNotAdopted).
	Nodes Nodes
	// MaxLiveEnrolments bounds the unexpired records — each with its own
	// bootstrap token in cluster mode — one identity may hold for its node
	// name: enrolling again past it is refused RateLimited until the
	// oldest expires (default 4: the enrolment and three more).
	MaxLiveEnrolments int
	// Health, when set, says whether the server can serve configs now (nil)
	// or what it lacks: /healthz answers 503 NotReady with it, and a
	// config that cannot be rendered is refused with it.
	Health func() error
	// ConfigTokenTTL bounds a config token's life (default
	// DefaultConfigTokenTTL). The sealing keyring must keep a key for at
	// least this long after it stopped sealing (seal.Keyring.SetMaxLife).
	ConfigTokenTTL time.Duration
	// RecordTTL bounds how long a record may approve a CSR (default 1 hour).
	RecordTTL time.Duration
	// Limits bound what one source address or one identity may ask of the
	// server; the zero value limits nothing.
	Limits Limits
	// Clock tells the time (required).
	Clock func() time.Time
	// Log receives one line per decision (required).
	Log *slog.Logger
}

// Limits are the server's request-level admission limits (connection
// limits are the listener's: limit.Listener). Refusals are RateLimited or
// Overloaded: 503 with Retry-After, so Ignition and the agent come back
// (Ignition treats every 4xx as final, and a machine behind the same NAT
// as a flood must not fail its boot).
type Limits struct {
	// AttestPerSource limits /attest/v1 requests per source address
	// (limit.SourceKey), checked before the body is read.
	AttestPerSource *limit.Buckets
	// ConfigPerSource limits /config requests per source address.
	ConfigPerSource *limit.Buckets
	// PerIdentity limits, per identity, challenges that claim it (a TPM's
	// EK, before any cryptography) and successful attestations that proved
	// it (every kind, before a record is written): a flood for one
	// identity from many sources is held to its rate, and one machine
	// cannot mint records without bound.
	PerIdentity *limit.Buckets
	// Attestations caps attestation requests in flight (each may carry a
	// 2 MiB body and costs signature checks and store writes); a request
	// waits briefly for a slot, then is refused Overloaded.
	Attestations *limit.Gate
	// UnauthenticatedReports limits the failure reports recorded as
	// unauthenticated (anyone may send one, and each is an Event), per
	// source address and per node name: both must allow it.
	// UnauthenticatedReportBytes limits the bytes of their Events'
	// messages the same way. A node's own reports (authenticated) are
	// held to PerIdentity per node name instead, so these cannot spend
	// theirs.
	UnauthenticatedReports, UnauthenticatedReportBytes *limit.Buckets
}

// DefaultMaxLiveEnrolments is Options.MaxLiveEnrolments's default.
const DefaultMaxLiveEnrolments = 4

// DefaultConfigTokenTTL is Options.ConfigTokenTTL when unset.
const DefaultConfigTokenTTL = 10 * time.Minute

// Server serves the MCS endpoints.
type Server struct {
	o       Options
	configs atomic.Pointer[configsBox]
	// judge is the policy and the verifiers made from its trust roots,
	// swapped whole by SetPolicy; o's are its first value.
	judge atomic.Pointer[Judge]
	// A flood must not become a flood of log lines: refusals for being
	// over a limit are logged at most a few a second per source, and the
	// count of those left out goes with the next one logged.
	limitLog   *limit.Buckets
	suppressed atomic.Int64
}

type configsBox struct{ c Configs }

// New checks o and returns a Server.
func New(o Options) (*Server, error) {
	switch {
	case o.Policy == nil, o.Configs == nil, o.Store == nil, o.Keys == nil:
		return nil, errors.New("mcs: Policy, Configs, Store and Keys are required")
	case o.Clock == nil || o.Log == nil:
		return nil, errors.New("mcs: Clock and Log are required")
	}
	if o.ConfigTokenTTL == 0 {
		o.ConfigTokenTTL = DefaultConfigTokenTTL
	}
	if o.RecordTTL == 0 {
		o.RecordTTL = time.Hour
	}
	if o.MaxLiveEnrolments <= 0 {
		o.MaxLiveEnrolments = DefaultMaxLiveEnrolments
	}
	// Log lines carry text from outside (report details, request fields,
	// errors quoting them): every one passes through safetext.
	o.Log = slog.New(safetext.Handler(o.Log.Handler()))
	s := &Server{o: o, limitLog: limit.NewBuckets(limit.Rate{PerSecond: 1, Burst: 5}, 0, o.Clock)}
	s.configs.Store(&configsBox{o.Configs})
	if err := s.SetPolicy(Judge{Policy: o.Policy, Verifiers: o.Verifiers}); err != nil {
		return nil, err
	}
	return s, nil
}

// Judge is what decides an attestation: the policy, and the verifiers of
// the evidence kinds it takes, made from its trust roots (a nil verifier
// refuses that kind).
type Judge struct {
	Policy    *policy.Policy
	Verifiers attest.Registry

	// body is what a verify body decodes into, for Verifiers' kinds.
	body *verifyBody
}

// SetPolicy swaps the policy and its verifiers (after the policy file
// changed): requests already past a step keep what they read, each later
// step reads the new ones. Sessions sealed under the old policy stay
// valid; their verify is judged by the new one.
func (s *Server) SetPolicy(j Judge) error {
	if j.Policy == nil {
		return errors.New("mcs: a nil policy")
	}
	for pool, p := range j.Policy.Pools {
		if p.Serve.FullWithoutCredentials {
			s.o.Log.Warn("INSECURE: pool serves its full config, secrets included, to anyone without credentials (serve.fullWithoutCredentials)",
				"pool", pool)
		}
	}
	var err error
	if j.body, err = newVerifyBody(j.Verifiers); err != nil {
		return err
	}
	s.judge.Store(&j)
	return nil
}

// pol is the policy in force.
func (s *Server) pol() *policy.Policy { return s.judge.Load().Policy }

// Policy is the policy in force (the last SetPolicy's).
func (s *Server) Policy() *policy.Policy { return s.pol() }

// verifiers are the verifiers in force.
func (s *Server) verifiers() *Judge { return s.judge.Load() }

// SetConfigs swaps the configs served (after inputs changed).
func (s *Server) SetConfigs(c Configs) { s.configs.Store(&configsBox{c}) }

func (s *Server) cfg() Configs { return s.configs.Load().c }

// Port says which listener a handler is for.
type Port int

// The two MCS ports.
const (
	// Secure is the TLS port, 22623.
	Secure Port = iota
	// Insecure is the plain-HTTP port, 22624.
	Insecure
)

func (p Port) String() string {
	if p == Insecure {
		return "insecure"
	}
	return "secure"
}

// Handler returns the handler for one port.
func (s *Server) Handler(port Port) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := s.o.Clock()
		rec := &decision{port: port, path: r.URL.Path, method: r.Method, remote: r.RemoteAddr}
		s.route(&timedWriter{ResponseWriter: w, start: start, clock: s.o.Clock}, r, port, rec)
		s.o.Metrics.observe(rec, s.o.Clock().Sub(start))
		s.logDecision(r.Context(), rec, start)
	})
}

// ServerTimingMetric is the Server-Timing (W3C) metric every answer
// carries: how long the server worked on the request before it answered,
// in milliseconds ("app;dur=12.345"). A node's agent subtracts it from the
// round trip to tell its network's share from the server's.
const ServerTimingMetric = "app"

// timedWriter sets the Server-Timing header as the answer's header is
// written.
type timedWriter struct {
	http.ResponseWriter
	start   time.Time
	clock   func() time.Time
	written bool
}

func (t *timedWriter) WriteHeader(code int) {
	if !t.written {
		t.written = true
		d := t.clock().Sub(t.start)
		t.Header().Set("Server-Timing", fmt.Sprintf("%s;dur=%.3f", ServerTimingMetric, float64(d.Microseconds())/1000))
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *timedWriter) Write(b []byte) (int, error) {
	if !t.written {
		t.WriteHeader(http.StatusOK)
	}
	return t.ResponseWriter.Write(b)
}

// Unwrap is for http.ResponseController.
func (t *timedWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// decision is what the request's log line says.
type decision struct {
	port                 Port
	path, method, remote string
	pool, tier, version  string
	node, record         string
	// kind and purpose (enrol, reattest) of a verify's session; cred, the
	// credential a config fetch presented (config, provisioning).
	kind, purpose, cred string
	status              int
	reason              attest.Reason
	bytes               int
}

func (s *Server) logDecision(ctx context.Context, d *decision, start time.Time) {
	var suppressed int64
	if d.reason == attest.ReasonRateLimited || d.reason == attest.ReasonOverloaded {
		if ok, _ := s.limitLog.Allow(limit.SourceKey(d.remote)); !ok {
			s.suppressed.Add(1)
			return
		}
		suppressed = s.suppressed.Swap(0)
	}
	attrs := []slog.Attr{
		slog.String("port", d.port.String()), slog.String("method", d.method), slog.String("path", d.path),
		slog.String("remote", d.remote), slog.Int("status", d.status),
		slog.Duration("took", s.o.Clock().Sub(start)),
	}
	for k, v := range map[string]string{"pool": d.pool, "tier": d.tier, "ignitionVersion": d.version, "node": d.node, "record": d.record, "reason": string(d.reason)} {
		if v != "" {
			attrs = append(attrs, slog.String(k, v))
		}
	}
	if d.bytes > 0 {
		attrs = append(attrs, slog.Int("bytes", d.bytes))
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int64("limitedNotLogged", suppressed))
	}
	level := slog.LevelInfo
	if d.status >= 500 {
		level = slog.LevelError
	} else if d.status >= 400 {
		level = slog.LevelWarn
	}
	s.o.Log.LogAttrs(ctx, level, "request", attrs...)
}

func (s *Server) route(w http.ResponseWriter, r *http.Request, port Port, d *decision) {
	// Bodies come with a Content-Length or not at all. A Transfer-Encoding
	// (with or without a Content-Length beside it) is how requests are
	// smuggled past a proxy that reads the body another way: refuse it and
	// close the connection, so nothing after it on the connection is read
	// as a request (RFC 9112 §6.1).
	if len(r.TransferEncoding) > 0 {
		w.Header().Set("Connection", "close")
		s.refuse(w, d, deny(attest.ReasonMalformedRequest, "Transfer-Encoding is not accepted; send the body with a Content-Length"))
		return
	}
	// Refuse encoded paths outright: the only names we serve are plain, and
	// a %2F or %2E can only be an attempt to reach something else.
	if r.URL.RawPath != "" || strings.Contains(r.URL.Path, "//") || strings.Contains(r.URL.Path, "/..") || strings.Contains(r.URL.Path, "/./") {
		s.refuse(w, d, deny(attest.ReasonBadPath, "path must be plain"))
		return
	}
	switch {
	case r.URL.Path == api.PathHealthz:
		if !methodIs(w, r, d, s, http.MethodGet, http.MethodHead) {
			return
		}
		if s.o.Health != nil {
			if err := s.o.Health(); err != nil {
				s.refuse(w, d, deny(attest.ReasonNotReady, "%v", err))
				return
			}
		}
		d.status = http.StatusOK
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", "2")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			w.Write([]byte("ok"))
		}
	case strings.HasPrefix(r.URL.Path, api.PathConfig):
		if !methodIs(w, r, d, s, http.MethodGet, http.MethodHead) {
			return
		}
		if !s.admit(w, r, d, s.o.Limits.ConfigPerSource) {
			return
		}
		s.serveConfig(w, r, port, d)
	case r.URL.Path == api.PathChallenge || r.URL.Path == api.PathVerify || r.URL.Path == api.PathReport:
		if !methodIs(w, r, d, s, http.MethodPost) {
			return
		}
		if port == Insecure {
			s.refuse(w, d, deny(attest.ReasonInsecurePort, "attestation and reports are only served over TLS"))
			return
		}
		if !s.admit(w, r, d, s.o.Limits.AttestPerSource) {
			return
		}
		if r.URL.Path == api.PathReport {
			s.report(w, r, d) // no evidence to verify: not held to the attestations in flight
			return
		}
		leave := s.o.Limits.Attestations.Enter(r.Context())
		if leave == nil {
			s.refuse(w, d, later(time.Second, deny(attest.ReasonOverloaded, "too many attestations in flight; retry")))
			return
		}
		defer leave()
		if r.URL.Path == api.PathChallenge {
			s.challenge(w, r, d)
		} else {
			s.verify(w, r, d)
		}
	default:
		s.refuse(w, d, deny(attest.ReasonNotFound, "no such endpoint"))
	}
}

// admit takes a token from the request's source bucket, or refuses it
// RateLimited.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, d *decision, b *limit.Buckets) bool {
	ok, wait := b.Allow(limit.SourceKey(r.RemoteAddr))
	if !ok {
		s.refuse(w, d, later(wait, deny(attest.ReasonRateLimited, "too many requests from this address; retry later")))
	}
	return ok
}

func methodIs(w http.ResponseWriter, r *http.Request, d *decision, s *Server, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	s.refuse(w, d, deny(attest.ReasonMethodNotAllowed, "method %s not allowed", r.Method))
	return false
}

func deny(r attest.Reason, format string, args ...any) error {
	return &attest.Denial{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// Source is where a Server's configs come from and how they stay current:
// a directory (mcs/dirsource) or a cluster (mcs/cluster).
type Source interface {
	// First returns what to serve at start.
	First() (Configs, error)
	// Run keeps srv's configs current (SetConfigs) until ctx ends.
	Run(ctx context.Context, srv *Server)
	// Bootstrap issues per-node bootstrap tokens (Options.Bootstrap), or
	// is nil.
	Bootstrap() BootstrapTokens
	// String names the inputs, for the log.
	String() string
}
