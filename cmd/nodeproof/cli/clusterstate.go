package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/nodeproof/nodeproof/leader"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/certs/kubecerts"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/tokens"
)

// Where cluster mode keeps its CA and serving certificate, and its
// provisioning tokens (--cert-store, --token-store).
const (
	storeCluster  = "cluster"
	storeStateDir = "state-dir"
	storeFile     = "file"
)

// certStore is where the certificates are: the cluster's objects by
// default in cluster mode, unless --cert was given.
func (c ServeConfig) certStore(clusterMode bool) string {
	switch {
	case c.CertFile != "":
		return "cert"
	case c.CertStore != "":
		return c.CertStore
	case clusterMode:
		return storeCluster
	}
	return storeStateDir
}

// tokenStore is where the provisioning tokens are: the seed's Secret by
// default in cluster mode.
func (c ServeConfig) tokenStore(clusterMode bool) string {
	switch {
	case c.TokenStore != "":
		return c.TokenStore
	case clusterMode:
		return storeCluster
	}
	return storeFile
}

// clusterState keeps what cluster mode keeps in the cluster's objects:
// the CA and serving certificate (mcs/certs/kubecerts) and the
// provisioning tokens (cluster.TokenSecret). Every replica reads them
// every --reload-interval and serves the last good state; only the
// replica holding the Lease nodeproof-server writes: it creates them on
// first start, rotates the certificates, rotates the token on the
// --token-rotate-every schedule, and keeps the user-data Secrets current.
type clusterState struct {
	c       ServeConfig
	keeper  *kubecerts.Keeper    // nil: certificates are not kept here
	tokSec  *cluster.TokenSecret // nil: tokens are not kept here
	holder  certs.Holder
	leading atomic.Bool

	mu        sync.Mutex
	snap      *kubecerts.Snapshot // last good
	lastErr   string              // last refusal said, to say it once
	leaderErr string              // the same, for the leader's passes
	prov      *tokens.Provisioning
}

// startClusterState begins leader election and waits until the objects it
// keeps exist and load (the leader makes them on first start).
func (c ServeConfig) startClusterState(ctx context.Context, clusterMode bool) (*clusterState, error) {
	certsHere, tokensHere := c.certStore(clusterMode) == storeCluster, c.tokenStore(clusterMode) == storeCluster
	if !certsHere && !tokensHere {
		return nil, nil
	}
	if !clusterMode {
		return nil, errors.New("serve: --cert-store=cluster and --token-store=cluster need cluster mode (--kubeconfig/--apiserver-url)")
	}
	cfg, err := restConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	c.limits(cfg)
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// client-go's leader election logs through klog (process-wide).
	klog.SetSlogLogger(c.Log)
	s := &clusterState{c: c}
	if certsHere {
		if s.keeper, err = kubecerts.New(kubecerts.Options{Client: kc, Namespace: c.CertsNamespace, Hosts: c.Hosts, Clock: c.Clock}); err != nil {
			return nil, err
		}
	}
	if tokensHere {
		s.tokSec = &cluster.TokenSecret{Client: kc, Namespace: c.TokenSecretNamespace}
	}
	id := c.Identity
	if id == "" {
		if id = os.Getenv("POD_NAME"); id == "" {
			if id, err = os.Hostname(); err != nil {
				return nil, err
			}
		}
	}
	go leader.Run(ctx, leader.Options{
		Client: kc, Namespace: c.storeNamespace(), Name: "nodeproof-server", Role: "server", Identity: id,
		LeaseDuration: c.LeaseDuration, RenewDeadline: c.RenewDeadline, RetryPeriod: c.RetryPeriod, Log: c.Log,
	}, s.lead)

	// Wait for the state: the leader makes it on first start.
	said := c.Clock()
	for {
		err := s.refresh(ctx)
		if err == nil {
			break
		}
		if now := c.Clock(); now.Sub(said) >= 10*time.Second {
			said = now
			c.Log.Warn("waiting for the cluster's certificate and token objects (the leader makes them on first start)", "err", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("serve: %w (last: %v)", ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
	if s.keeper != nil {
		owner := "nodeproof (it rotates them)"
		if !s.snap.Owned {
			owner = "not nodeproof (no app.kubernetes.io/managed-by=nodeproof on the CA Secret): served as found, rotated by their owner"
		}
		c.Log.Info("certificates in the cluster", "objects", strings.Join(s.keeper.Names(), ", "), "owner", owner,
			"servingNotAfter", s.snap.Serving.NotAfter.UTC().Format(time.RFC3339))
	}
	if s.tokSec != nil {
		c.Log.Info("provisioning tokens in the cluster", "secret", s.tokSec.String(), "rotateEvery", c.TokenRotateEvery.String(), "grace", c.Grace.String())
	}
	go s.follow(ctx)
	return s, nil
}

// refresh reads the objects once; the first successful read also opens
// the provisioning tokens.
func (s *clusterState) refresh(ctx context.Context) error {
	var errs []error
	if s.keeper != nil {
		if snap, err := s.keeper.Read(ctx); err != nil {
			errs = append(errs, err)
		} else {
			s.install(snap)
		}
	}
	s.mu.Lock()
	prov := s.prov
	s.mu.Unlock()
	if s.tokSec != nil {
		if prov == nil {
			p, err := tokens.Open(ctx, s.tokSec, s.c.Grace, s.c.Clock, false)
			if err != nil {
				errs = append(errs, err)
			} else {
				if err := s.legacyTokens(p); err != nil {
					errs = append(errs, err)
				} else {
					s.mu.Lock()
					s.prov = p
					s.mu.Unlock()
				}
			}
		} else if changed, err := prov.Reload(); err != nil {
			errs = append(errs, fmt.Errorf("provisioning tokens: %w (still accepting the previous ones)", err))
		} else if changed {
			s.c.Log.Info("provisioning tokens reloaded (rotated)")
		}
	}
	if s.keeper != nil && s.snapshot() == nil {
		errs = append(errs, errors.New("no certificate yet"))
	}
	return errors.Join(errs...)
}

// legacyTokens makes p also accept the tokens of --tokens-file (the
// nodeproof-provisioning-tokens Secret of earlier releases), when that
// file exists, for --token-grace after the cluster's Secret was made (the
// migration): pointer configs made from it keep working through the move,
// and a token that leaked from it stops working like any rotated-out one.
// (On first start the leader imports the file's tokens into the Secret,
// so its current token carries on there and rotates normally.)
func (s *clusterState) legacyTokens(p *tokens.Provisioning) error {
	old, err := s.legacy()
	if old == nil || err != nil {
		return err
	}
	until := s.tokSec.Created().Add(s.c.Grace)
	p.Also(old, until)
	s.c.Log.Info("provisioning tokens: also accepting those of --tokens-file, read only, until the grace after the move to the cluster ends",
		"file", s.c.TokensFile, "until", until.UTC().Format(time.RFC3339))
	return nil
}

// legacy reads --tokens-file; nil when there is none.
func (s *clusterState) legacy() (*tokens.Provisioning, error) {
	path := s.c.TokensFile
	if path == "" {
		return nil, nil
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	old, err := tokens.Open(context.Background(), tokens.FileStore(path), s.c.Grace, s.c.Clock, false)
	if err != nil {
		return nil, fmt.Errorf("--tokens-file: %w", err)
	}
	return old, nil
}

// install serves snap when it is new.
func (s *clusterState) install(snap *kubecerts.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snap != nil && s.snap.Version == snap.Version {
		return
	}
	if err := s.holder.Set(snap.ChainPEM, snap.KeyPEM, "serving certificate"); err != nil {
		return // Read checked the pair
	}
	if s.snap != nil {
		s.c.Log.Info("certificates reloaded from the cluster", "servingNotAfter", snap.Serving.NotAfter.UTC().Format(time.RFC3339))
	}
	s.snap, s.lastErr = snap, ""
}

func (s *clusterState) snapshot() *kubecerts.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap
}

// provisioning is the token set (nil when tokens are not kept here).
func (s *clusterState) provisioning() *tokens.Provisioning {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prov
}

// caBundle is the bundle pointer configs carry.
func (s *clusterState) caBundle() ([]byte, error) {
	snap := s.snapshot()
	if snap == nil {
		return nil, errors.New("no CA bundle read from the cluster yet")
	}
	return snap.BundlePEM, nil
}

// follow re-reads the objects every --reload-interval; a refusal is logged
// (once per distinct refusal) and the last good state stays in service.
func (s *clusterState) follow(ctx context.Context) {
	tick := time.NewTicker(s.c.Reload)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := s.refresh(ctx); err != nil {
			s.mu.Lock()
			say := err.Error() != s.lastErr
			s.lastErr = err.Error()
			s.mu.Unlock()
			if say {
				s.c.Log.Error("cluster state refused; still serving the last good one", "err", err.Error())
			}
		}
	}
}

// lead is one leader term: every --reload-interval it makes or rotates the
// certificates and rotates the token when due.
func (s *clusterState) lead(ctx context.Context) {
	s.leading.Store(true)
	defer s.leading.Store(false)
	tick := time.NewTicker(s.c.Reload)
	defer tick.Stop()
	for {
		s.leaderPass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *clusterState) leaderPass(ctx context.Context) {
	if s.keeper != nil {
		snap, changes, err := s.keeper.Ensure(ctx, false)
		switch {
		case err != nil:
			if s.leaderErr != err.Error() {
				s.leaderErr = err.Error()
				s.c.Log.Error("certificates: not rotated; still serving the last good ones", "err", err.Error())
			}
		default:
			s.leaderErr = ""
			for _, ch := range changes {
				s.c.Log.Info("certificates", "change", ch)
			}
			s.install(snap)
		}
	}
	if s.tokSec == nil {
		return
	}
	prov := s.provisioning()
	if prov == nil {
		// First start: make the Secret when there is none, with the
		// tokens of --tokens-file when it exists (they carry on there).
		if _, err := s.tokSec.Load(ctx); errors.Is(err, fs.ErrNotExist) {
			how := "created"
			old, err := s.legacy()
			switch {
			case err != nil:
			case old != nil:
				how = "imported from --tokens-file"
				err = s.tokSec.Save(ctx, old.List())
			default:
				_, err = tokens.Open(ctx, s.tokSec, s.c.Grace, s.c.Clock, true)
			}
			if err != nil {
				s.c.Log.Error("provisioning tokens: could not create the Secret", "secret", s.tokSec.String(), "err", err.Error())
			} else {
				s.c.Log.Info("provisioning tokens: "+how, "secret", s.tokSec.String())
			}
		}
		return
	}
	if every := s.c.TokenRotateEvery; every > 0 && prov.Age() >= every {
		if err := prov.Rotate(); err != nil {
			s.c.Log.Error("provisioning token rotation", "err", err.Error())
			prov.Reload() // a conflict: pick up what is there
			return
		}
		s.c.Log.Info("provisioning token rotated", "every", every.String(), "graceOfThePrevious", s.c.Grace.String())
	}
}

// settle is how long a new provisioning token waits before the user-data
// Secrets carry it: three reloads, so every replica accepts it first.
func (c ServeConfig) settle() time.Duration { return 3 * c.Reload }
