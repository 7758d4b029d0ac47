package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/mcs/userdata"
	"github.com/nodeproof/nodeproof/pemcert"
	"github.com/nodeproof/nodeproof/reload"
	"github.com/nodeproof/nodeproof/store"
)

// KubeCallTimeout bounds each API call made while answering a request.
const KubeCallTimeout = 10 * time.Second

// tokenGCInterval is how often expired bootstrap token Secrets are deleted;
// userDataInterval how often the user-data Secrets are compared.
const (
	tokenGCInterval  = 10 * time.Minute
	userDataInterval = 5 * time.Second
)

// SourceOptions configure a Source.
type SourceOptions struct {
	// REST reaches the API server (its QPS and Burst are used as given;
	// Timeout is set to KubeCallTimeout). Required.
	REST *rest.Config
	// APIServerURL is the API server as nodes reach it: what the served
	// kubeconfigs name. Required.
	APIServerURL string
	// TokenDir is the node-bootstrapper service account secret (token,
	// ca.crt), mounted where the OpenShift MCS has it.
	TokenDir string
	// CABundle returns nodeproof's CA bundle, which the public tier
	// carries (render.CABundleExtra); re-read every few seconds, so a
	// rotation re-renders the public tier. Nil: none.
	CABundle func() ([]byte, error)
	Clock    func() time.Time
	Log      *slog.Logger
}

// Source is cluster mode's mcs.Source (`nodeproof serve
// --kubeconfig/--apiserver-url`): MachineConfigPools, MachineConfigs and
// the ControllerConfig watched from the API server (Watch), rendered and
// served when each pool's inputs are complete (Configs), and a bootstrap
// token per attested node (Tokens). Until the watch has synced, every
// config request is a 503 with Retry-After. In the background it deletes
// expired bootstrap tokens, re-renders the public tier when the CA bundle
// changes and, with ManageUserData, keeps the user-data Secrets current.
type Source struct {
	cfg      *rest.Config
	server   string // APIServerURL
	tokenDir string
	tokens   *Tokens
	ca       func(context.Context) ([]byte, error)
	caWatch  *CABundleWatch         // behind ca
	caBundle func() ([]byte, error) // nodeproof's own CA bundle, for the public tier
	clock    func() time.Time
	log      *slog.Logger
	kc       kubernetes.Interface
	userData *userdata.Syncer // nil: the user-data Secrets are not managed
	leading  func() bool      // whether this replica writes them
	shared   func() bool      // whether the shared node-bootstrapper kubeconfig is served
	health   atomic.Pointer[error]

	// mu guards what the last render was made of, so a CA bundle change
	// re-renders the public tier without waiting for the inputs to change.
	mu       sync.Mutex
	srv      *mcs.Server
	inputs   *render.Inputs
	servedCA []byte
}

var _ mcs.Source = (*Source)(nil)

// NewSource connects to the API server; nothing is watched until Run.
func NewSource(o SourceOptions) (*Source, error) {
	if o.REST == nil || o.APIServerURL == "" || o.Clock == nil || o.Log == nil {
		return nil, errors.New("cluster: SourceOptions.REST, APIServerURL, Clock and Log are required")
	}
	if o.CABundle == nil {
		o.CABundle = func() ([]byte, error) { return nil, nil }
	}
	cfg := rest.CopyConfig(o.REST)
	// controller-runtime's informers log through its package logger, which
	// must be set once per process (it warns with a stack trace if not).
	ctrllog.SetLogger(logr.FromSlogHandler(o.Log.Handler()).WithName("informers"))
	cfg.Timeout = KubeCallTimeout
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	caWatch := NewCABundleWatch(kc, filepath.Join(o.TokenDir, corev1.ServiceAccountRootCAKey))
	ca := caWatch.Get
	tokens, err := NewTokens(TokenOptions{Client: kc, Server: o.APIServerURL, CABundle: ca, Clock: o.Clock})
	if err != nil {
		return nil, err
	}
	return &Source{
		cfg: cfg, server: o.APIServerURL, tokenDir: o.TokenDir, tokens: tokens, ca: ca, caWatch: caWatch,
		caBundle: o.CABundle, clock: o.Clock, log: o.Log, kc: kc,
	}, nil
}

// Check reports what the configs it serves need and it cannot read now:
// the CA bundle every served kubeconfig carries (ConfigMap
// openshift-machine-config-operator/kubeconfig-data, else
// <TokenDir>/ca.crt) and, when shared (a pool serves the full config
// without a node of its own: the token tier, fullWithoutCredentials), the
// node-bootstrapper token (<TokenDir>/token). Serve refuses to start on
// it, and Health reports it after that (shared asked again each time: the
// policy may be reloaded).
func (s *Source) Check(ctx context.Context, shared func() bool) error {
	s.shared = shared
	err := s.check(ctx)
	s.health.Store(&err)
	return err
}

func (s *Source) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, KubeCallTimeout)
	defer cancel()
	ca, err := s.ca(ctx)
	if err == nil {
		_, err = pemcert.Parse(ca)
	}
	if err != nil {
		return fmt.Errorf("the API server's CA bundle, which every served kubeconfig carries: %w (it is ConfigMap %s/%s's %s when that exists, else %s: mount the node-bootstrapper service account's token Secret there, as deploy/ does, or set --bootstrap-token-dir)",
			err, MCONamespace, KubeconfigDataConfigMap, KubeconfigDataCAKey, filepath.Join(s.tokenDir, corev1.ServiceAccountRootCAKey))
	}
	if s.shared != nil && s.shared() {
		tok := filepath.Join(s.tokenDir, corev1.ServiceAccountTokenKey)
		if b, err := os.ReadFile(tok); err != nil || len(bytes.TrimSpace(b)) == 0 {
			return fmt.Errorf("the node-bootstrapper token, which the shared kubeconfig of the token tier and fullWithoutCredentials carries: %s is missing or empty (mount the node-bootstrapper service account's token Secret there, or set --bootstrap-token-dir)", tok)
		}
	}
	return nil
}

// Health is the last Check's outcome, repeated every few seconds while
// Run runs: nil when the configs can be served.
func (s *Source) Health() error {
	if p := s.health.Load(); p != nil {
		return *p
	}
	return nil
}

// Client is the Source's clientset (for the user-data Syncer).
func (s *Source) Client() kubernetes.Interface { return s.kc }

// ManageUserData makes Run keep the user-data Secrets current with u
// while leading reports true (nil: always; with several replicas, only
// the leader writes). Call it before Run.
func (s *Source) ManageUserData(u *userdata.Syncer, leading func() bool) {
	s.userData, s.leading = u, leading
}

// String names the API server.
func (s *Source) String() string { return "cluster " + s.cfg.Host }

// Bootstrap issues a bootstrap token per attested node.
func (s *Source) Bootstrap() mcs.BootstrapTokens { return s.tokens }

// First serves nothing yet: every config request is a 503 until the
// watch has synced.
func (s *Source) First() (mcs.Configs, error) { return Configs{}, nil }

// kubeconfig is what every full config carries in cluster mode: the
// attested node's own bootstrap token, or, for a request without a node
// (token tier, fullWithoutCredentials), the shared node-bootstrapper
// kubeconfig the OpenShift MCS serves everyone (see mcs/cluster).
func (s *Source) kubeconfig(rec *store.Record) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), KubeCallTimeout)
	defer cancel()
	if rec != nil {
		return s.tokens.Kubeconfig(ctx, rec)
	}
	return ServiceAccountKubeconfig(ctx, s.tokenDir, s.server, s.ca)
}

// Run watches the inputs and swaps in a renderer for each change, and
// deletes expired bootstrap tokens, until ctx ends. A watch that fails is
// restarted after a pause; what was served stays served meanwhile.
func (s *Source) Run(ctx context.Context, srv *mcs.Server) {
	go s.caWatch.Run(ctx)
	go s.housekeeping(ctx)
	for ctx.Err() == nil {
		err := Watch(ctx, s.cfg, WatchOptions{
			OnInputs: func(in *render.Inputs) { s.serve(srv, in) },
			OnError:  func(err error) { s.log.Error("cluster inputs", "err", err.Error()) },
		})
		if err != nil {
			s.log.Error("cluster watch ended; restarting", "err", err.Error())
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
}

// serve renders in and swaps it in. A pool whose inputs are incomplete
// (render.Renderer.Missing) is logged with what it lacks and answered 503
// until they arrive; configs that do not render (a config with no 2.2
// form) are logged and answered per request (503, or 400 for the spec
// version); the other pools are served.
func (s *Source) serve(srv *mcs.Server, in *render.Inputs) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ca, err := s.caBundle()
	if err != nil {
		s.log.Error("cluster inputs: CA bundle", "err", err.Error())
		return
	}
	s.srv, s.inputs = srv, in
	extra, err := render.CABundleExtra(ca)
	if err != nil {
		s.log.Error("cluster inputs: public tier additions", "err", err.Error())
		return
	}
	r, err := render.NewRenderer(in, render.Options{PublicExtra: extra})
	if err != nil {
		s.log.Error("cluster inputs do not render; still serving the previous ones", "err", err.Error())
		return
	}
	var complete, waiting []string
	for _, pool := range r.Pools() {
		if missing, _ := r.Missing(pool); len(missing) > 0 {
			// Said once per change of the inputs (Watch hands on only
			// changes); requests meanwhile are quiet 503s.
			s.log.Warn("cluster inputs: pool not served until these arrive", "pool", pool, "missing", strings.Join(missing, ", "))
			waiting = append(waiting, pool)
			continue
		}
		complete = append(complete, pool)
	}
	if len(complete) > 0 {
		if err := r.Prerender(complete...); err != nil {
			s.log.Warn("cluster inputs: some configs do not render", "err", err.Error())
		}
	}
	srv.SetConfigs(Configs{R: &mcs.Rendered{R: r, Kubeconfig: s.kubeconfig}})
	s.servedCA = ca
	s.log.Info("cluster inputs", "pools", strings.Join(complete, ","), "waiting", strings.Join(waiting, ","))
}

// caChanged re-renders the last inputs when the CA bundle the public tier
// carries changed since they were rendered (a rotation, or a new
// --ca-bundle file).
func (s *Source) caChanged() {
	s.mu.Lock()
	srv, in, served := s.srv, s.inputs, s.servedCA
	s.mu.Unlock()
	if in == nil {
		return
	}
	ca, err := s.caBundle()
	if err != nil {
		s.log.Error("CA bundle", "err", err.Error())
		return
	}
	if bytes.Equal(ca, served) {
		return
	}
	s.log.Info("CA bundle changed: rendering the public tier again")
	s.serve(srv, in)
}

// housekeeping keeps the public tier's CA bundle and the user-data
// Secrets current (every few seconds: rotations show up there) and deletes
// expired bootstrap tokens.
func (s *Source) housekeeping(ctx context.Context) {
	lastGC := s.clock()
	reload.Now(ctx, userDataInterval, func(ctx context.Context) {
		// Bootstrap tokens are collected before every pass but the first,
		// at most every tokenGCInterval.
		if now := s.clock(); now.Sub(lastGC) >= tokenGCInterval {
			lastGC = now
			if n, err := s.tokens.GC(ctx); err != nil {
				s.log.Error("bootstrap token gc", "err", err.Error())
			} else if n > 0 {
				s.log.Info("bootstrap token gc", "deleted", n)
			}
		}
		s.caChanged()
		if err, was := s.check(ctx), s.Health(); ctx.Err() == nil {
			switch {
			case err != nil && (was == nil || err.Error() != was.Error()):
				s.log.Error("cannot serve full configs now", "err", err.Error())
			case err == nil && was != nil:
				s.log.Info("can serve full configs again")
			}
			s.health.Store(&err)
		}
		if s.userData != nil && (s.leading == nil || s.leading()) {
			if wrote, err := s.userData.Sync(ctx); err != nil {
				s.log.Error("user-data secrets", "err", err.Error())
			} else if len(wrote) > 0 {
				s.log.Info("user-data secrets updated", "secrets", strings.Join(wrote, ","))
			}
		}
	})
}
