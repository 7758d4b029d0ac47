package cli

import (
	"context"
	"fmt"
	"time"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/mcs/serve"
)

// cmdInspect is `nodeproof inspect [NODE] [-o table|json|yaml]`: every
// node (its owner, last attestation and state), or one node's story
// (evidence, claims, records, and with the kubernetes store its Node's
// condition and taints, CSRs and Events), and the bans and released names;
// `inspect secureboot-ca`, where each node stands in the move to
// Microsoft's 2023 Secure Boot CAs, and how many stand where.
// It only reads. A running server with the embedded store is read through
// its admin socket.
func cmdInspect(ctx context.Context, in *invocation) error {
	stdout := in.stdout
	fs := in.flags()
	var c serve.Config
	storeFlags(fs, &c)
	format := fs.String("o", inspect.FormatTable, "output: table, json or yaml")
	basedir := fs.String("server-basedir", "", "inspect pool: the MCO bootstrap directory (directory mode); default: the cluster (--kubeconfig)")
	policyFile := fs.String("policy", "", "the server's policy (serve's --policy): each pool's freshness window (default: the built-in policy's, 3 h); secureboot-ca: its trust.secureBootCAs")
	pos, err := in.parse()
	if err != nil {
		return err
	}
	var node, pool string
	caView := false
	switch {
	case len(pos) == 0:
	case len(pos) == 1 && pos[0] == "secureboot-ca":
		caView = true
	case len(pos) == 1 && pos[0] != "pool":
		node = pos[0]
	case len(pos) == 2 && pos[0] == "pool":
		pool = pos[1]
	default:
		return in.usageError("want at most one NODE, pool NAME or secureboot-ca; got %q", pos)
	}
	if err := inspect.CheckFormat(*format); err != nil {
		return err
	}
	if pool != "" {
		in, err := poolInputs(ctx, *basedir, c.Kubeconfig)
		if err != nil {
			return err
		}
		es, err := in.PoolTiers(pool)
		if err != nil {
			return err
		}
		return inspect.WritePool(stdout, *format, pool, es)
	}
	pol, err := serve.LoadPolicy(*policyFile)
	if err != nil {
		return err
	}
	c.Clock = time.Now
	st, err := openOperatorStore(ctx, c)
	if err != nil {
		return err
	}
	defer st.Close()
	kc, err := c.KubeClient(adminCluster(c))
	if err != nil {
		return err
	}
	src := inspect.Sources{Store: st, Kube: kc, Clock: c.Clock,
		Fresh: func(pool string) time.Duration { return pol.LifetimeOf(pool).StaleAfter.Duration }}
	if caView {
		v, err := inspect.ListSecureBootCAs(ctx, src, pol.SecureBootCAs())
		if err != nil {
			return err
		}
		return inspect.WriteSecureBootCAs(stdout, *format, v)
	}
	if node == "" {
		o, err := inspect.ListAll(ctx, src)
		if err != nil {
			return err
		}
		return inspect.WriteOverview(stdout, *format, o)
	}
	story, err := inspect.StoryOf(ctx, src, node)
	if err != nil {
		return err
	}
	return inspect.WriteStory(stdout, *format, story)
}

// poolInputs are the MCO inputs from a bootstrap directory, or else from
// the cluster (MachineConfigPools and MachineConfigs, read once).
func poolInputs(ctx context.Context, basedir, kubeconfig string) (*render.Inputs, error) {
	if basedir != "" {
		return render.LoadBootstrapDir(basedir)
	}
	cfg, err := serve.RESTConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("inspect pool: give --server-basedir, or a cluster (--kubeconfig): %w", err)
	}
	cl, err := client.New(cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		return nil, err
	}
	var pools mcfgv1.MachineConfigPoolList
	var mcs mcfgv1.MachineConfigList
	if err := cl.List(ctx, &pools); err != nil {
		return nil, fmt.Errorf("inspect pool: MachineConfigPools: %w", err)
	}
	if err := cl.List(ctx, &mcs); err != nil {
		return nil, fmt.Errorf("inspect pool: MachineConfigs: %w", err)
	}
	pp := make([]*mcfgv1.MachineConfigPool, len(pools.Items))
	for i := range pools.Items {
		pp[i] = &pools.Items[i]
	}
	mp := make([]*mcfgv1.MachineConfig, len(mcs.Items))
	for i := range mcs.Items {
		mp[i] = &mcs.Items[i]
	}
	return render.NewInputs(pp, mp, nil)
}
