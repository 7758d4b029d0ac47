package demo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
)

// RunCluster is `make dev-cluster`: a cluster of one's own to try cluster
// mode on — etcd and kube-apiserver from what `make tools` built, bare (no
// CRD: apply deploy/overlays/kubernetes as docs/operations.md says),
// authenticating bootstrap tokens — until ctx ends. Its files go under
// o.Dir (made if missing), and it writes o.Dir/admin.kubeconfig and
// prints how to use it.
func RunCluster(ctx context.Context, o Options) error {
	if o.Dir == "" {
		return fmt.Errorf("demo: the cluster needs a directory (-dir)")
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	work, err := os.MkdirTemp(dir, "control-plane-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	prefix, err := dieWithParent()
	if err != nil {
		return err
	}
	env, err := clustertest.LaunchWith(work, clustertest.LaunchOptions{Bare: true, CommandPrefix: prefix})
	if err != nil {
		return fmt.Errorf("demo: start the control plane (make tools builds it): %w", err)
	}
	defer env.Stop()
	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if err := clustertest.WriteKubeconfig(env.Config, kubeconfig, ""); err != nil {
		return err
	}
	defer os.Remove(kubeconfig)
	fmt.Fprintf(o.Out, `a cluster of your own: etcd and kube-apiserver at %s, started in %s (bootstrap tokens authenticated)

  export KUBECONFIG=%s
  kubectl apply --server-side -k deploy/overlays/kubernetes      # then docs/operations.md, "Cluster mode"
  nodeproof inspect                                               # $KUBECONFIG is honoured
  kubectl nodeproof inspect                                       # the same, as a kubectl plugin (bin/ on PATH)

Ctrl-C stops it and removes its data.
`, env.Config.Host, env.Took.Round(1e6), kubeconfig)
	<-ctx.Done()
	return nil
}
