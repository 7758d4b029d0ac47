package render

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestPoolTiers: the example bootstrap's worker pool, MachineConfig by
// MachineConfig, lands where the public tier is built from; a marked
// MachineConfig that writes the kubeconfig is shown refused, one the
// selector does not take and an unmarked one held.
func TestPoolTiers(t *testing.T) {
	in, err := LoadBootstrapDir("../../deploy/examples/bootstrap")
	if err != nil {
		t.Fatal(err)
	}
	got := func(in *Inputs) map[string]string {
		t.Helper()
		es, err := in.PoolTiers("worker")
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, e := range es {
			if e.Why == "" {
				t.Errorf("%s: no why", e.Name)
			}
			m[e.Name] = e.Place
		}
		return m
	}
	w := got(in)
	want := map[string]string{
		"00-worker": PlaceHeld, "01-worker-kubelet": PlaceHeld, "05-worker-kernelarg-audit": PlaceHeld,
		"50-worker-chrony": PlacePublic, "50-worker-nodeproof-agent": PlacePublic, "99-worker-ssh": PlacePublic,
		"rendered-worker-aee233518d8593f5d0ccaced531b7165": PlaceHeld,
	}
	if fmt.Sprint(w) != fmt.Sprint(want) {
		t.Errorf("worker:\n got %v\nwant %v", w, want)
	}
	// The public entries are exactly the public tier's sources.
	srcs, err := publicSources(in, in.pools["worker"])
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mc := range srcs {
		if w[mc.Name] != PlacePublic {
			t.Errorf("%s is in the public tier but listed %s", mc.Name, w[mc.Name])
		}
		n++
	}
	if n != 3 {
		t.Errorf("%d public sources", n)
	}

	// A marked MachineConfig that writes the kubeconfig: refused.
	raw, _ := json.Marshal(map[string]any{"ignition": map[string]any{"version": "3.2.0"},
		"storage": map[string]any{"files": []any{map[string]any{"path": KubeconfigPath, "contents": map[string]any{"source": "data:,x"}}}}})
	bad := &mcfgv1.MachineConfig{ObjectMeta: metav1.ObjectMeta{Name: "60-worker-oops", Labels: map[string]string{"machineconfiguration.openshift.io/role": "worker"},
		Annotations: map[string]string{NeededBeforeNodeApprovedAnnotation: "true"}}, Spec: mcfgv1.MachineConfigSpec{Config: runtime.RawExtension{Raw: raw}}}
	in.configs[bad.Name] = bad
	pool := in.pools["worker"]
	pool.Spec.Configuration.Source = nil // a pool whose rendered config lists no sources: the selector decides
	pool.Status.Configuration.Source = nil
	es, err := in.PoolTiers("worker")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Name == bad.Name && (e.Place != PlaceRefused || !strings.Contains(e.Why, KubeconfigPath)) {
			t.Errorf("%s: %s (%s); want refused, naming %s", e.Name, e.Place, e.Why, KubeconfigPath)
		}
	}
	if _, err := in.PoolTiers("nope"); err == nil {
		t.Error("an unknown pool: no error")
	}
}
