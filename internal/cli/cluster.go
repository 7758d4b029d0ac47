package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/mcs/userdata"
	"github.com/nodeproof/nodeproof/store"
)

// kubeCallTimeout bounds each API call made while answering a request.
const kubeCallTimeout = 10 * time.Second

// tokenGCInterval is how often expired bootstrap token Secrets are deleted;
// userDataInterval how often the user-data Secrets are compared.
const (
	tokenGCInterval  = 10 * time.Minute
	userDataInterval = 5 * time.Second
)

// clusterSource is cluster mode's input (`--kubeconfig`/`--apiserver-url`):
// MachineConfigPools, MachineConfigs and the ControllerConfig watched from
// the API server (mcs/cluster.Watch), and a bootstrap token per attested
// node (mcs/cluster.Tokens). Until the watch has synced, every config
// request is a 503 with Retry-After.
type clusterSource struct {
	cfg      *rest.Config
	server   string // --apiserver-url
	tokenDir string
	tokens   *cluster.Tokens
	ca       func(context.Context) ([]byte, error)
	caBundle func() ([]byte, error) // nodeproof's own CA bundle, for the public tier
	clock    func() time.Time
	log      *slog.Logger
	kc       kubernetes.Interface
	userData *userdata.Syncer // nil: the user-data Secrets are not managed

	// mu guards what the last render was made of, so a CA bundle change
	// re-renders the public tier without waiting for the inputs to change.
	mu       sync.Mutex
	srv      *mcs.Server
	inputs   *render.Inputs
	servedCA []byte
}

// restConfig is the API server connection: --kubeconfig, or the
// in-cluster service account when it is empty (as the OpenShift MCS does).
func restConfig(kubeconfig string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API server config: %w", err)
	}
	cfg.UserAgent = "nodeproof"
	// client-go's defaults (5 per second, bursts of 10) would hold a
	// scale-up of hundreds of machines to a few attestations a second.
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// limits applies --kube-api-qps/--kube-api-burst (zero: restConfig's).
func (c ServeConfig) limits(cfg *rest.Config) {
	if c.KubeQPS > 0 {
		cfg.QPS, cfg.Burst = float32(c.KubeQPS), max(c.KubeBurst, 1)
	}
}

// newClusterSource connects to the API server named by --kubeconfig, or
// the in-cluster service account when --kubeconfig is empty (as the
// OpenShift MCS does).
func (c ServeConfig) newClusterSource() (*clusterSource, error) {
	cfg, err := restConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	c.limits(cfg)
	// controller-runtime's informers log through its package logger, which
	// must be set once per process (it warns with a stack trace if not).
	ctrllog.SetLogger(logr.FromSlogHandler(c.Log.Handler()).WithName("informers"))
	cfg.Timeout = kubeCallTimeout
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("serve: cluster mode: %w", err)
	}
	ca := cluster.MCOCABundle(kc, filepath.Join(c.TokenDir, corev1.ServiceAccountRootCAKey))
	tokens, err := cluster.NewTokens(cluster.TokenOptions{Client: kc, Server: c.APIServerURL, CABundle: ca, Clock: c.Clock})
	if err != nil {
		return nil, err
	}
	return &clusterSource{
		cfg: cfg, server: c.APIServerURL, tokenDir: c.TokenDir, tokens: tokens, ca: ca,
		caBundle: c.caBundle, clock: c.Clock, log: c.Log, kc: kc,
	}, nil
}

// userDataSyncer keeps the user-data Secrets current: the CA bundle
// (nodeproof's own, or --ca-bundle with --cert, re-read at every sync), and
// the provisioning token for pools that take the token tier.
func (c ServeConfig) userDataSyncer(cs *clusterSource, pol *policy.Policy, prov *tokens.Provisioning) (*userdata.Syncer, error) {
	if c.CertFile != "" && c.CABundleFile == "" {
		return nil, errors.New("serve: --user-data-url with --cert needs --ca-bundle (the CA bundle that signed --cert, which the pointer configs carry)")
	}
	return userdata.New(userdata.Options{
		Client: cs.kc, Namespace: c.UserDataNamespace, URL: c.UserDataURL, Roles: c.UserDataRoles,
		CABundle: c.caBundle,
		Token: func(pool string) string {
			if pol.ServeFor(pool).Token {
				return prov.Current()
			}
			return ""
		},
	})
}

func (s *clusterSource) String() string                 { return "cluster " + s.cfg.Host }
func (s *clusterSource) bootstrap() mcs.BootstrapTokens { return s.tokens }

// first serves nothing yet: every config request is a 503 until the
// watch has synced.
func (s *clusterSource) first() (mcs.Configs, error) { return cluster.Configs{}, nil }

// kubeconfig is what every full config carries in cluster mode: the
// attested node's own bootstrap token, or, for a request without a node
// (token tier, fullWithoutCredentials), the shared node-bootstrapper
// kubeconfig the OpenShift MCS serves everyone (see mcs/cluster).
func (s *clusterSource) kubeconfig(rec *store.Record) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), kubeCallTimeout)
	defer cancel()
	if rec != nil {
		return s.tokens.Kubeconfig(ctx, rec)
	}
	return cluster.ServiceAccountKubeconfig(ctx, s.tokenDir, s.server, s.ca)
}

// run watches the inputs and swaps in a renderer for each change, and
// deletes expired bootstrap tokens, until ctx ends. A watch that fails is
// restarted after a pause; what was served stays served meanwhile.
func (s *clusterSource) run(ctx context.Context, srv *mcs.Server) {
	go s.housekeeping(ctx)
	for ctx.Err() == nil {
		err := cluster.Watch(ctx, s.cfg, cluster.WatchOptions{
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
func (s *clusterSource) serve(srv *mcs.Server, in *render.Inputs) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ca, err := s.caBundle()
	if err != nil {
		s.log.Error("cluster inputs: CA bundle", "err", err.Error())
		return
	}
	s.srv, s.inputs = srv, in
	extra, err := publicExtra(func() ([]byte, error) { return ca, nil })
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
	srv.SetConfigs(cluster.Configs{R: &mcs.Rendered{R: r, Kubeconfig: s.kubeconfig}})
	s.servedCA = ca
	s.log.Info("cluster inputs", "pools", strings.Join(complete, ","), "waiting", strings.Join(waiting, ","))
}

// caChanged re-renders the last inputs when the CA bundle the public tier
// carries changed since they were rendered (a rotation, or a new
// --ca-bundle file).
func (s *clusterSource) caChanged() {
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
func (s *clusterSource) housekeeping(ctx context.Context) {
	tick := time.NewTicker(userDataInterval)
	defer tick.Stop()
	lastGC := s.clock()
	for {
		s.caChanged()
		if s.userData != nil {
			if wrote, err := s.userData.Sync(ctx); err != nil {
				s.log.Error("user-data secrets", "err", err.Error())
			} else if len(wrote) > 0 {
				s.log.Info("user-data secrets updated", "roles", strings.Join(wrote, ","))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if s.clock().Sub(lastGC) < tokenGCInterval {
			continue
		}
		lastGC = s.clock()
		if n, err := s.tokens.GC(ctx); err != nil {
			s.log.Error("bootstrap token gc", "err", err.Error())
		} else if n > 0 {
			s.log.Info("bootstrap token gc", "deleted", n)
		}
	}
}
