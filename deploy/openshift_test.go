package deploy_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// stockMCS is what the Machine Config Operator's own DaemonSet manifest says
// of the stock machine-config-server's place, as read from
// openshift/machine-config-operator manifests/machineconfigserver/daemonset.yaml
// at commit 7ff337a4ffac8e7562692181178ede61e4b2eec5 (deploy/overlays/openshift/README.md
// cites the rest): its name and selector, the host network, the control-plane
// nodeSelector, its three tolerations, its two container ports (on the host
// network, the API server makes each a host port of the same number), and no
// affinity, which is what lets the MCO's merge keep the one stock-mcs-off.yaml
// adds.
var stockMCS = struct {
	name, namespace string
	selector        map[string]string
	nodeSelector    map[string]string
	tolerations     []corev1.Toleration
	ports           []int32
}{
	name:         "machine-config-server",
	namespace:    "openshift-machine-config-operator",
	selector:     map[string]string{"k8s-app": "machine-config-server"},
	nodeSelector: map[string]string{"node-role.kubernetes.io/master": ""},
	tolerations: []corev1.Toleration{
		{Key: "node-role.kubernetes.io/master", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: "node-role.kubernetes.io/etcd", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	},
	ports: []int32{22623, 22624},
}

// The csplit that README.md and the openshift-install kustomization tell an
// operator to run: one object per file, as cluster-bootstrap reads them.
var csplitArgs = []string{"--quiet", "--elide-empty-files", "--suffix-format=%03d.yaml"}

// stockShapedDaemonSet is a DaemonSet in the stock MCS's place, as the MCO
// makes it (the facts of stockMCS; the image is any).
func stockShapedDaemonSet() *appsv1.DaemonSet {
	var ports []corev1.ContainerPort
	for _, p := range stockMCS.ports {
		ports = append(ports, corev1.ContainerPort{ContainerPort: p, Protocol: corev1.ProtocolTCP})
	}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: stockMCS.name, Namespace: stockMCS.namespace},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: stockMCS.selector},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: stockMCS.selector},
				Spec: corev1.PodSpec{
					HostNetwork:                  true,
					NodeSelector:                 stockMCS.nodeSelector,
					Tolerations:                  stockMCS.tolerations,
					ServiceAccountName:           "nodeproof-server", // one that exists in the test's cluster
					AutomountServiceAccountToken: new(bool),
					Containers: []corev1.Container{{
						Name: "machine-config-server", Image: "machine-config-operator",
						Command: []string{"/usr/bin/machine-config-server"}, Args: []string{"start"},
						Ports: ports,
					}},
				},
			},
		},
	}
}

// toTyped converts a rendered object to its Go type.
func toTyped[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &v); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return &v
}

// checkNowhere: the pod spec's required node affinity is one term that
// requires a label its own nodeSelector requires to be absent, so no node
// matches both, whatever its labels.
func checkNowhere(t *testing.T, what string, spec corev1.PodSpec) {
	t.Helper()
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Errorf("%s: no required node affinity", what)
		return
	}
	terms := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || len(terms[0].MatchFields) != 0 {
		// Terms are ORed: a second term could match a node.
		t.Errorf("%s: node affinity %+v, want one term of one expression", what, terms)
		return
	}
	e := terms[0].MatchExpressions[0]
	if _, selected := spec.NodeSelector[e.Key]; !selected || e.Operator != corev1.NodeSelectorOpDoesNotExist {
		t.Errorf("%s: affinity %+v does not contradict nodeSelector %v (want %s DoesNotExist)", what, e, spec.NodeSelector, e.Key)
	}
}

// readPatch reads deploy/overlays/openshift/stock-mcs-off.yaml as a DaemonSet.
func readPatch(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("overlays", "openshift", "stock-mcs-off.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatalf("stock-mcs-off.yaml: %v", err)
	}
	return &ds
}

// TestOpenShiftPlacement checks, from the rendered manifests, that
// nodeproof's DaemonSet takes the stock MCS's place exactly (the same hosts,
// the same taints tolerated, the same host ports, the host network), that
// nothing else in the overlay could hold those ports, and that the day-2
// patch and the install-time DaemonSet turn the stock MCS off the same way.
func TestOpenShiftPlacement(t *testing.T) {
	objs := index(render(t, "overlays/openshift"))
	ds := toTyped[appsv1.DaemonSet](t, mustHave(t, objs, "DaemonSet", stockMCS.namespace, "nodeproof-machine-config-server"))
	spec := ds.Spec.Template.Spec

	t.Run("the stock MCS's place", func(t *testing.T) {
		if !spec.HostNetwork {
			t.Error("not on the host network")
		}
		if !maps(spec.NodeSelector, stockMCS.nodeSelector) {
			t.Errorf("nodeSelector %v, want the stock MCS's %v", spec.NodeSelector, stockMCS.nodeSelector)
		}
		for _, want := range stockMCS.tolerations {
			if !slices.ContainsFunc(spec.Tolerations, func(got corev1.Toleration) bool { return got == want }) {
				t.Errorf("does not tolerate %s:%s as the stock MCS does (tolerations %v)", want.Key, want.Effect, spec.Tolerations)
			}
		}
		var hostPorts []int32
		for _, p := range spec.Containers[0].Ports {
			hostPorts = append(hostPorts, p.HostPort)
		}
		for _, p := range stockMCS.ports {
			if !slices.Contains(hostPorts, p) {
				t.Errorf("host ports %v lack the stock MCS's %d", hostPorts, p)
			}
		}
		if spec.Affinity != nil {
			t.Errorf("affinity %+v: the stock MCS has none", spec.Affinity)
		}
	})

	t.Run("nothing else holds the ports", func(t *testing.T) {
		for _, dir := range []string{"overlays/openshift", "overlays/openshift-install"} {
			for _, o := range render(t, dir) {
				var ps *corev1.PodSpec
				switch o.GetKind() {
				case "DaemonSet":
					ps = &toTyped[appsv1.DaemonSet](t, o).Spec.Template.Spec
				case "Deployment":
					ps = &toTyped[appsv1.Deployment](t, o).Spec.Template.Spec
				case "StatefulSet", "Pod", "Job", "CronJob", "ReplicaSet":
					t.Errorf("%s: %s %s/%s is a workload the test does not read", dir, o.GetKind(), o.GetNamespace(), o.GetName())
					continue
				default:
					continue
				}
				if o.GetName() == "nodeproof-machine-config-server" {
					continue
				}
				if o.GetName() == stockMCS.name && o.GetKind() == "DaemonSet" {
					checkNowhere(t, dir+": the stock MCS's DaemonSet", *ps)
					continue
				}
				if ps.HostNetwork {
					t.Errorf("%s: %s %s/%s is on the host network", dir, o.GetKind(), o.GetNamespace(), o.GetName())
				}
				for _, c := range ps.Containers {
					for _, p := range c.Ports {
						if p.HostPort != 0 {
							t.Errorf("%s: %s %s/%s holds host port %d", dir, o.GetKind(), o.GetNamespace(), o.GetName(), p.HostPort)
						}
					}
				}
			}
		}
	})

	t.Run("day 2: stock-mcs-off.yaml", func(t *testing.T) {
		p := readPatch(t)
		// The patch names nothing of the stock MCS but the affinity it
		// adds and a note: a strategic merge leaves the rest as it is.
		p.Spec.Template.Spec.NodeSelector = stockMCS.nodeSelector
		checkNowhere(t, "stock-mcs-off.yaml over the stock MCS", p.Spec.Template.Spec)
		p.Spec.Template.Spec.NodeSelector = nil
		p.Spec.Template.Spec.Affinity = nil
		if p.Annotations["nodeproof.io/stock-mcs"] == "" {
			t.Error("stock-mcs-off.yaml does not annotate the DaemonSet it turns off")
		}
		p.Annotations = nil
		if want := (appsv1.DaemonSet{}); !equalJSON(t, *p, want) {
			t.Errorf("stock-mcs-off.yaml sets more than the affinity and the note: %+v", p)
		}
	})

	t.Run("install time: overlays/openshift-install", func(t *testing.T) {
		inst := index(render(t, "overlays/openshift-install"))
		if len(inst) != len(objs)+1 {
			t.Errorf("openshift-install renders %d objects, want the OpenShift overlay's %d and the stock MCS's DaemonSet", len(inst), len(objs))
		}
		for k := range objs {
			if inst[k] == nil {
				t.Errorf("openshift-install lacks %s", k)
			}
		}
		stock := toTyped[appsv1.DaemonSet](t, mustHave(t, inst, "DaemonSet", stockMCS.namespace, stockMCS.name))
		if stock.Spec.Selector == nil || !maps(stock.Spec.Selector.MatchLabels, stockMCS.selector) || len(stock.Spec.Selector.MatchExpressions) != 0 {
			t.Errorf("selector %+v, want the MCO's %v (a selector cannot change: the MCO's update would fail)", stock.Spec.Selector, stockMCS.selector)
		}
		if !maps(stock.Spec.Template.Labels, stockMCS.selector) {
			t.Errorf("pod labels %v, want %v", stock.Spec.Template.Labels, stockMCS.selector)
		}
		if !maps(stock.Spec.Template.Spec.NodeSelector, stockMCS.nodeSelector) {
			t.Errorf("nodeSelector %v, want the stock MCS's %v", stock.Spec.Template.Spec.NodeSelector, stockMCS.nodeSelector)
		}
		checkNowhere(t, "the install-time stock MCS", stock.Spec.Template.Spec)
		if p := readPatch(t); !equalJSON(t, stock.Spec.Template.Spec.Affinity, p.Spec.Template.Spec.Affinity) ||
			stock.Annotations["nodeproof.io/stock-mcs"] != p.Annotations["nodeproof.io/stock-mcs"] {
			t.Error("the install-time stock MCS and stock-mcs-off.yaml turn it off differently")
		}
	})
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := yaml.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := yaml.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ja) == string(jb)
}

// testOpenShiftInstall splits the openshift-install render as README.md
// says (csplit, one object per file), reads each file as cluster-bootstrap
// does (the file's YAML to JSON, one object), and creates what does not
// exist yet with kubectl create, as cluster-bootstrap creates what it does
// not find: the overlay's objects exist already (TestApply applied the
// overlay), the stock MCS's DaemonSet is created, off.
func testOpenShiftInstall(t *testing.T, kubeconfig string, cs kubernetes.Interface) {
	out, err := kubectl(t, "", "kustomize", "overlays/openshift-install")
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	dir := t.TempDir()
	cmd := exec.Command("csplit", append(append([]string{}, csplitArgs...),
		"--prefix="+filepath.Join(dir, "99_nodeproof_"), "-", "/^---$/", "{*}")...)
	cmd.Stdin = strings.NewReader(out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("csplit: %v\n%s", err, b)
	}
	files, err := filepath.Glob(filepath.Join(dir, "99_nodeproof_*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rendered := index(render(t, "overlays/openshift-install"))
	if len(files) != len(rendered) {
		t.Fatalf("csplit made %d files of %d objects", len(files), len(rendered))
	}
	seen := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		j, err := yaml.YAMLToJSON(b)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		k := key(u.GetKind(), u.GetNamespace(), u.GetName())
		if rendered[k] == nil || seen[k] {
			t.Errorf("%s holds %s: not one of the rendered objects, or twice", filepath.Base(f), k)
		}
		seen[k] = true
	}
	out, _ = kubectl(t, kubeconfig, "create", "-f", dir)
	created := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		switch {
		case strings.HasSuffix(line, " created"):
			created++
		case strings.Contains(line, "AlreadyExists") || strings.Contains(line, "already exists"):
		case strings.HasPrefix(line, "Warning:") && expectedWarning(line):
		default:
			t.Errorf("kubectl create -f: %s", line)
		}
	}
	if created != 1 {
		t.Errorf("%d objects created, want 1 (the stock MCS's DaemonSet; TestApply applied the rest)\n%s", created, out)
	}
	ds, err := cs.AppsV1().DaemonSets(stockMCS.namespace).Get(context.Background(), stockMCS.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkNowhere(t, "the stock MCS created at install time", ds.Spec.Template.Spec)
}

// testStockMCSOff: on a DaemonSet shaped as the MCO makes it, the day-2
// command of README.md (oc patch --type=strategic --patch-file, here kubectl,
// the same client code) adds the affinity and the note and changes nothing
// else; and the API server gives a host-network pod of either DaemonSet host
// ports 22623/22624, so the scheduler never places nodeproof's pod and the
// stock one on one host (the second stays Pending until the first is gone).
func testStockMCSOff(t *testing.T, kubeconfig string, cs kubernetes.Interface) {
	ctx := context.Background()
	dss := cs.AppsV1().DaemonSets(stockMCS.namespace)
	// Replace whatever testOpenShiftInstall left with the stock shape.
	if err := dss.Delete(ctx, stockMCS.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := dss.Get(ctx, stockMCS.name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the DaemonSet is still there 30 s after its deletion (%v)", err)
		}
	}
	before, err := dss.Create(ctx, stockShapedDaemonSet(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl(t, kubeconfig, "-n", stockMCS.namespace, "patch", "daemonset/"+stockMCS.name,
		"--type=strategic", "--patch-file="+filepath.Join("overlays", "openshift", "stock-mcs-off.yaml")); err != nil {
		t.Fatalf("kubectl patch: %v\n%s", err, out)
	}
	after, err := dss.Get(ctx, stockMCS.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkNowhere(t, "the stock MCS after the patch", after.Spec.Template.Spec)
	if after.Annotations["nodeproof.io/stock-mcs"] == "" {
		t.Error("the patched DaemonSet carries no nodeproof.io/stock-mcs note")
	}
	b, a := before.Spec.Template.Spec.DeepCopy(), after.Spec.Template.Spec.DeepCopy()
	a.Affinity = nil
	if !equalJSON(t, b, a) {
		t.Errorf("the patch changed more than the affinity:\nbefore %+v\nafter  %+v", b, a)
	}

	// The undo command of README.md takes both back out.
	if out, err := kubectl(t, kubeconfig, "-n", stockMCS.namespace, "patch", "daemonset/"+stockMCS.name, "--type=json",
		"-p", `[{"op":"remove","path":"/spec/template/spec/affinity"},{"op":"remove","path":"/metadata/annotations/nodeproof.io~1stock-mcs"}]`); err != nil {
		t.Fatalf("kubectl patch (undo): %v\n%s", err, out)
	}
	undone, err := dss.Get(ctx, stockMCS.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !equalJSON(t, before.Spec.Template.Spec, undone.Spec.Template.Spec) || undone.Annotations["nodeproof.io/stock-mcs"] != "" {
		t.Errorf("the undo left %+v, annotations %v; want the stock DaemonSet as before", undone.Spec.Template.Spec, undone.Annotations)
	}

	// Host ports: a pod of each template, as the DaemonSet controller makes
	// it, defaulted by the API server (dry run).
	nodeproofDS := toTyped[appsv1.DaemonSet](t, mustHave(t, index(render(t, "overlays/openshift")), "DaemonSet", stockMCS.namespace, "nodeproof-machine-config-server"))
	for what, tmpl := range map[string]corev1.PodTemplateSpec{"stock": before.Spec.Template, "nodeproof": nodeproofDS.Spec.Template} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: what + "-", Namespace: stockMCS.namespace, Labels: tmpl.Labels}, Spec: *tmpl.Spec.DeepCopy()}
		pod.Spec.Affinity = nil
		pod.Spec.Volumes = nil
		for i := range pod.Spec.Containers {
			pod.Spec.Containers[i].VolumeMounts = nil
		}
		got, err := cs.CoreV1().Pods(stockMCS.namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("%s pod: %v", what, err)
		}
		var hostPorts []int32
		for _, p := range got.Spec.Containers[0].Ports {
			hostPorts = append(hostPorts, p.HostPort)
		}
		for _, p := range stockMCS.ports {
			if !slices.Contains(hostPorts, p) {
				t.Errorf("a %s pod holds host ports %v, not %d: the scheduler would not keep it apart from the other", what, hostPorts, p)
			}
		}
	}
}
