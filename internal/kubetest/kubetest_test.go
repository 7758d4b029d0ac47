package kubetest_test

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/internal/kubetest"
)

func TestOpenShiftCRDs(t *testing.T) {
	dir := kubetest.OpenShiftCRDs(t)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{
		"0000_80_machine-config_01_controllerconfigs-Default.crd.yaml",
		"0000_80_machine-config_01_machineconfigpools.crd.yaml",
		"0000_80_machine-config_01_machineconfigs.crd.yaml",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("OpenShiftCRDs = %v, want %v", names, want)
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "group: machineconfiguration.openshift.io") {
			t.Errorf("%s is not a machineconfiguration.openshift.io CRD", n)
		}
	}
}

// A real kube-apiserver with OpenShift's CRDs: MachineConfigPools and
// MachineConfigs round-trip through the Go types of github.com/openshift/api,
// with the CRDs' schema validation and the status subresource in force.
func TestMachineConfigRoundTrip(t *testing.T) {
	cfg := kubetest.Start(t, kubetest.OpenShiftCRDs(t))

	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
		t.Fatalf("kube-apiserver at %s, want a loopback address", cfg.Host)
	}

	c, err := client.New(cfg, client.Options{Scheme: kubetest.Scheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// All three CRDs are served.
	for _, kind := range []string{"MachineConfig", "MachineConfigPool", "ControllerConfig"} {
		gvk := mcfgv1.GroupVersion.WithKind(kind)
		if _, err := c.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			t.Errorf("%s not served: %v", kind, err)
		}
	}

	pool := &mcfgv1.MachineConfigPool{
		ObjectMeta: metav1.ObjectMeta{Name: "worker"},
		Spec: mcfgv1.MachineConfigPoolSpec{
			MachineConfigSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"machineconfiguration.openshift.io/role": "worker"},
			},
			NodeSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"node-role.kubernetes.io/worker": ""},
			},
		},
	}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatalf("create MachineConfigPool: %v", err)
	}
	// The MCS serves the pool's status.configuration: set it through the
	// status subresource, as the machine-config-controller does.
	pool.Status = mcfgv1.MachineConfigPoolStatus{
		Configuration: mcfgv1.MachineConfigPoolStatusConfiguration{
			ObjectReference: corev1ObjectReference("rendered-worker-0123456789abcdef"),
		},
		Conditions:  []mcfgv1.MachineConfigPoolCondition{},
		CertExpirys: []mcfgv1.CertExpiry{},
	}
	if err := c.Status().Update(ctx, pool); err != nil {
		t.Fatalf("update MachineConfigPool status: %v", err)
	}

	ign := map[string]any{
		"ignition": map[string]any{"version": "3.5.0"},
		"storage": map[string]any{"files": []any{map[string]any{
			"path": "/etc/nodeproof-kubetest", "mode": 420,
			"contents": map[string]any{"source": "data:,hello"},
		}}},
	}
	raw, err := json.Marshal(ign)
	if err != nil {
		t.Fatal(err)
	}
	mc := &mcfgv1.MachineConfig{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "rendered-worker-0123456789abcdef",
			Labels: map[string]string{"machineconfiguration.openshift.io/role": "worker"},
		},
		Spec: mcfgv1.MachineConfigSpec{
			Config:          runtime.RawExtension{Raw: raw},
			KernelArguments: []string{"nodeproof=1"},
		},
	}
	if err := c.Create(ctx, mc); err != nil {
		t.Fatalf("create MachineConfig: %v", err)
	}

	// Read both back.
	var gotPool mcfgv1.MachineConfigPool
	if err := c.Get(ctx, client.ObjectKey{Name: "worker"}, &gotPool); err != nil {
		t.Fatalf("get MachineConfigPool: %v", err)
	}
	if got := gotPool.Status.Configuration.Name; got != mc.Name {
		t.Errorf("pool status.configuration.name = %q, want %q", got, mc.Name)
	}
	if got := gotPool.Spec.MachineConfigSelector.MatchLabels["machineconfiguration.openshift.io/role"]; got != "worker" {
		t.Errorf("pool machineConfigSelector lost: %+v", gotPool.Spec.MachineConfigSelector)
	}

	var list mcfgv1.MachineConfigList
	if err := c.List(ctx, &list, client.MatchingLabels{"machineconfiguration.openshift.io/role": "worker"}); err != nil {
		t.Fatalf("list MachineConfigs: %v", err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != mc.Name {
		t.Fatalf("listed %d MachineConfigs, want just %s", len(list.Items), mc.Name)
	}
	got := list.Items[0]
	var gotIgn map[string]any
	if err := json.Unmarshal(got.Spec.Config.Raw, &gotIgn); err != nil {
		t.Fatalf("spec.config: %v (%s)", err, got.Spec.Config.Raw)
	}
	files := gotIgn["storage"].(map[string]any)["files"].([]any)
	if p := files[0].(map[string]any)["path"]; p != "/etc/nodeproof-kubetest" {
		t.Errorf("spec.config round-trip: file path %v", p)
	}
	if !slices.Equal(got.Spec.KernelArguments, []string{"nodeproof=1"}) {
		t.Errorf("spec.kernelArguments = %v", got.Spec.KernelArguments)
	}

	// The CRD's schema is enforced by the server (a fake client would accept
	// this): a field of the wrong type is refused as Invalid.
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mcfgv1.GroupVersion.String(),
		"kind":       "MachineConfigPool",
		"metadata":   map[string]any{"name": "bad"},
		"spec":       map[string]any{"paused": "yes"},
	}}
	if err := c.Create(ctx, bad); !apierrors.IsInvalid(err) {
		t.Errorf("creating a pool with spec.paused=\"yes\": err = %v, want Invalid", err)
	}
}

func corev1ObjectReference(name string) corev1.ObjectReference {
	return corev1.ObjectReference{Kind: "MachineConfig", Name: name}
}
