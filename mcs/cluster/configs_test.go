package cluster_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"

	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/store"
)

// TestConfigsServeOnlyCompletePools: a pool is served, in either tier,
// only when its rendered MachineConfig, every MachineConfig in that
// config's source list and the ControllerConfig are all in the inputs;
// otherwise the answer is "not ready" (a quiet 503) naming what is
// missing — never a config built from what happened to have arrived.
func TestConfigsServeOnlyCompletePools(t *testing.T) {
	ex := clustertest.LoadExamples(t, examplesDir)
	const accept = "application/vnd.coreos.ignition+json;version=3.5.0"
	without := func(names ...string) []*mcfgv1.MachineConfig {
		var out []*mcfgv1.MachineConfig
		for _, mc := range ex.Configs {
			if !slices.Contains(names, mc.Name) {
				out = append(out, mc)
			}
		}
		return out
	}
	var rendered string
	for _, p := range ex.Pools {
		if p.Name == "worker" {
			rendered = p.Status.Configuration.Name
		}
	}
	unnamed := ex.Pools[0].DeepCopy()
	unnamed.Name = "infra"
	unnamed.Spec.Configuration = mcfgv1.MachineConfigPoolStatusConfiguration{}
	unnamed.Status.Configuration = mcfgv1.MachineConfigPoolStatusConfiguration{}
	tests := []struct {
		name    string
		pool    string
		pools   []*mcfgv1.MachineConfigPool
		configs []*mcfgv1.MachineConfig
		cc      *mcfgv1.ControllerConfig
		missing []string // empty: served
	}{
		{name: "complete", pool: "worker", configs: ex.Configs, cc: ex.CC},
		{name: "a public source missing", pool: "worker", configs: without("50-worker-nodeproof-agent"), cc: ex.CC,
			missing: []string{"MachineConfig 50-worker-nodeproof-agent"}},
		{name: "every source missing", pool: "worker", configs: without("00-master", "00-worker", "01-master-kubelet", "01-worker-kubelet", "05-worker-kernelarg-audit", "50-worker-chrony", "50-worker-nodeproof-agent", "99-master-ssh", "99-worker-ssh"), cc: ex.CC,
			missing: []string{"MachineConfig 00-master", "MachineConfig 50-worker-chrony", "MachineConfig 99-worker-ssh"}},
		{name: "the rendered config missing", pool: "worker", configs: without(rendered), cc: ex.CC,
			missing: []string{"MachineConfig " + rendered}},
		{name: "the ControllerConfig missing", pool: "worker", configs: ex.Configs,
			missing: []string{"ControllerConfig"}},
		{name: "a pool that names no rendered config", pool: "infra", pools: append(slices.Clone(ex.Pools), unnamed), configs: ex.Configs, cc: ex.CC,
			missing: []string{"names no rendered config"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pools := tc.pools
			if pools == nil {
				pools = ex.Pools
			}
			in, err := render.NewInputs(pools, tc.configs, tc.cc)
			if err != nil {
				t.Fatal(err)
			}
			r, err := render.NewRenderer(in, render.Options{})
			if err != nil {
				t.Fatal(err)
			}
			c := cluster.Configs{R: &mcs.Rendered{R: r, Kubeconfig: func(*store.Record) ([]byte, error) { return []byte("kubeconfig"), nil }}}
			served := map[string]error{}
			_, served["public"] = c.Public(tc.pool, accept)
			_, served["full"] = c.Full(tc.pool, accept, nil)
			_, served["full parts"] = c.FullParts(tc.pool, accept, nil)
			for tier, err := range served {
				if len(tc.missing) == 0 {
					if err != nil {
						t.Errorf("%s: %v; want served", tier, err)
					}
					continue
				}
				if !errors.Is(err, cluster.ErrIncomplete) || !errors.Is(err, mcs.ErrNotReady) {
					t.Errorf("%s: %v; want ErrIncomplete (not ready)", tier, err)
					continue
				}
				for _, m := range tc.missing {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("%s: %v; does not name %q", tier, err, m)
					}
				}
			}
		})
	}

	t.Run("not synced and no such pool are not ready either", func(t *testing.T) {
		in, err := render.NewInputs(ex.Pools, ex.Configs, ex.CC)
		if err != nil {
			t.Fatal(err)
		}
		r, err := render.NewRenderer(in, render.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for name, err := range map[string]error{
			"zero Configs": func() error { _, err := (cluster.Configs{}).Public("worker", accept); return err }(),
			"no such pool": func() error { _, err := (cluster.Configs{R: &mcs.Rendered{R: r}}).Public("gpu", accept); return err }(),
		} {
			if !errors.Is(err, mcs.ErrNotReady) || errors.Is(err, mcs.ErrUnknownPool) {
				t.Errorf("%s: %v; want not ready, and not a final unknown pool", name, err)
			}
		}
	})
}
