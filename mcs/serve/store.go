package serve

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// openStore opens the store --store names: embedded (bbolt in the state
// directory) or kubernetes (CRDs, through the cluster mode's API server
// connection, or the in-cluster/kubeconfig one).
func (c Config) OpenStore(clusterMode bool) (*Opened, error) {
	return c.OpenStoreTimeout(clusterMode, 10*time.Second)
}

// storeKind is the store --store names, by default the embedded one
// except in cluster mode.
func (c Config) StoreKind(clusterMode bool) string {
	if c.Store != "" {
		return c.Store
	}
	if clusterMode {
		return "kubernetes"
	}
	return "embedded"
}

// storeNamespace is the Kubernetes store's namespace.
func (c Config) storeNamespace() string { return orDefault(c.StoreNamespace, DefaultStoreNamespace) }

// LeaseNamespace is where the leader's Lease and the replicas' status are:
// the kubernetes store's namespace (--store-namespace, or its default).
func (c Config) LeaseNamespace() string { return c.storeNamespace() }

// DefaultStoreNamespace is --store-namespace's default.
const DefaultStoreNamespace = "nodeproof"

// kubeClient is a clientset on the store's API server connection (for
// Events), or nil with the embedded store.
func (c Config) KubeClient(clusterMode bool) (kubernetes.Interface, error) {
	if c.StoreKind(clusterMode) != "kubernetes" {
		return nil, nil
	}
	cfg, err := RESTConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	c.limits(cfg)
	return kubernetes.NewForConfig(cfg)
}

// Opened is the store --store names, opened: the whole store, and which
// of the two it is (exactly one of Embedded and Kubernetes is set), for
// what only that one has (the embedded store's admin socket, the
// kubernetes store's watches) — chosen where it is opened, not found by
// a type assertion later.
type Opened struct {
	store.Store
	Embedded   *boltstore.Store
	Kubernetes *kubestore.Store
}

// OpenStoreTimeout is OpenStore waiting at most lock for the embedded
// store's file lock.
func (c Config) OpenStoreTimeout(clusterMode bool, lock time.Duration) (*Opened, error) {
	kind := c.StoreKind(clusterMode)
	switch kind {
	case "embedded":
		st, err := boltstore.Open(filepath.Join(c.StateDir, StoreFile), lock, c.Clock)
		if errors.Is(err, boltstore.ErrDamaged) {
			return nil, fmt.Errorf("%w\n%s", err, damagedStoreHelp(c.StateDir))
		} else if err != nil {
			return nil, err
		}
		return &Opened{Store: st, Embedded: st}, nil
	case "kubernetes":
		ns := c.storeNamespace()
		cfg, err := RESTConfig(c.Kubeconfig)
		if err != nil {
			return nil, err
		}
		c.limits(cfg)
		cl, err := kubestore.NewClient(cfg)
		if err != nil {
			return nil, err
		}
		st, err := kubestore.New(cl, ns, c.Clock)
		if err != nil {
			return nil, err
		}
		return &Opened{Store: st, Kubernetes: st}, nil
	}
	return nil, fmt.Errorf("serve: --store %q is not embedded or kubernetes", kind)
}

// watchNodes starts the watch of the cluster's Node names (cluster.Nodes)
// into o.Nodes; stop ends it.
func (c Config) watchNodes(ctx context.Context, o *mcs.Options) (stop func(), err error) {
	cfg, err := RESTConfig(c.Kubeconfig)
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
func (c Config) watchBindings(ctx context.Context, st *kubestore.Store) (w *kubestore.Watched, stop func(), err error) {
	cfg, err := RESTConfig(c.Kubeconfig)
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

// StoreFile is the embedded store's file in the state directory.
const StoreFile = "state.db"

// damagedStoreHelp is what an operator reads when the server refuses a
// damaged embedded store.
func damagedStoreHelp(stateDir string) string {
	return fmt.Sprintf("the server will not start on a damaged store; check a backup with `nodeproof store check --file BACKUP` and restore it with "+
		"`nodeproof store restore --state-dir %s --from BACKUP` (the damaged file is kept beside it); docs/operations.md, \"Backup and restore\"", stateDir)
}
