package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/ec2live"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// awsVerifier builds the AWS verifier when a pool takes AWS evidence.
func (c ServeConfig) awsVerifier(ctx context.Context, pol *policy.Policy) (*aws.Verifier, error) {
	if !usesEvidence(pol, attest.KindAWS) {
		return nil, nil
	}
	var (
		certs *aws.RegionCerts
		err   error
	)
	if c.AWSCertsDir != "" {
		certs, err = aws.LoadRegionCerts(c.AWSCertsDir)
	} else {
		certs, err = aws.DefaultRegionCerts()
	}
	if err != nil {
		return nil, err
	}
	o := aws.Options{Certs: certs, MaxDocumentAge: c.AWSMaxDocumentAge, Clock: c.Clock}
	if c.AWSLiveRegion != "" {
		client, err := ec2live.NewClient(ctx, c.AWSLiveRegion, c.AWSEC2Endpoint)
		if err != nil {
			return nil, fmt.Errorf("serve: AWS live check: %w", err)
		}
		o.Live = &ec2live.Checker{Client: client, VPCs: c.AWSLiveVPCs, Tags: c.AWSLiveTags}
	}
	return aws.NewVerifier(o)
}

// openStore opens the store --store names: embedded (bbolt in the state
// directory) or kubernetes (CRDs, through the cluster mode's API server
// connection, or the in-cluster/kubeconfig one).
func (c ServeConfig) openStore(clusterMode bool) (store.Store, error) {
	return c.openStoreTimeout(clusterMode, 10*time.Second)
}

// storeKind is the store --store names, by default the embedded one
// except in cluster mode.
func (c ServeConfig) storeKind(clusterMode bool) string {
	if c.Store != "" {
		return c.Store
	}
	if clusterMode {
		return "kubernetes"
	}
	return "embedded"
}

// storeNamespace is the Kubernetes store's namespace.
func (c ServeConfig) storeNamespace() string { return orDefault(c.StoreNamespace, "nodeproof") }

// kubeClient is a clientset on the store's API server connection (for
// Events), or nil with the embedded store.
func (c ServeConfig) kubeClient(clusterMode bool) (kubernetes.Interface, error) {
	if c.storeKind(clusterMode) != "kubernetes" {
		return nil, nil
	}
	cfg, err := restConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	c.limits(cfg)
	return kubernetes.NewForConfig(cfg)
}

// openStoreTimeout is openStore waiting at most lock for the embedded
// store's file lock.
func (c ServeConfig) openStoreTimeout(clusterMode bool, lock time.Duration) (store.Store, error) {
	kind := c.storeKind(clusterMode)
	switch kind {
	case "embedded":
		st, err := boltstore.Open(filepath.Join(c.StateDir, storeFileName), lock, c.Clock)
		if errors.Is(err, boltstore.ErrDamaged) {
			return nil, fmt.Errorf("%w\n%s", err, damagedStoreHelp(c.StateDir))
		} else if err != nil {
			return nil, err
		}
		return st, nil
	case "kubernetes":
		ns := c.storeNamespace()
		cfg, err := restConfig(c.Kubeconfig)
		if err != nil {
			return nil, err
		}
		c.limits(cfg)
		cl, err := kubestore.NewClient(cfg)
		if err != nil {
			return nil, err
		}
		return kubestore.New(cl, ns, c.Clock)
	}
	return nil, fmt.Errorf("serve: --store %q is not embedded or kubernetes", kind)
}

// watchNodes starts the watch of the cluster's Node names (cluster.Nodes)
// into o.Nodes; stop ends it.
func (c ServeConfig) watchNodes(ctx context.Context, o *mcs.Options) (stop func(), err error) {
	cfg, err := restConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	c.limits(cfg)
	nodes, err := cluster.NewNodes(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); nodes.Run(ctx) }()
	o.Nodes = nodes
	return func() { cancel(); <-done }, nil
}

// watchBindings starts the server's watch of st's NodeBindings
// (kubestore.Watched: a config fetch reads the node's binding from it, a
// miss or an unhealthy watch from the API server); stop ends it.
func (c ServeConfig) watchBindings(ctx context.Context, st *kubestore.Store) (w *kubestore.Watched, stop func(), err error) {
	cfg, err := restConfig(c.Kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	c.limits(cfg)
	if w, err = kubestore.NewWatched(cfg, st); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.Start(ctx); err != nil && ctx.Err() == nil {
			c.Log.Error("binding watch stopped; fetches read bindings from the API server", "err", err.Error())
		}
	}()
	return w, func() { cancel(); <-done }, nil
}
