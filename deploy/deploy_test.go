// Package deploy_test applies the manifests in deploy/ to a real
// kube-apiserver (server-side dry run, with the kubectl of the same release,
// both built by hack/tools.sh), checks what the kustomizations render, and
// checks with SubjectAccessReviews that the approver's RBAC grants `approve`
// on the two kubelet signers and no other.
package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// The kustomizations `make test` renders and applies.
var kustomizations = []string{"base", "overlays/kubernetes", "overlays/openshift", "overlays/openshift-install"}

// Namespaces OpenShift has, which the OpenShift overlay puts objects in
// (kube-system exists everywhere; the kubernetes overlay makes its own).
var openshiftNamespaces = []string{"openshift-machine-config-operator", "openshift-machine-api", "openshift-config"}

// kubectl runs the cached kubectl with args, and returns its combined output.
func kubectl(t *testing.T, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if kubeconfig != "" {
		args = append([]string{"--kubeconfig", kubeconfig}, args...)
	}
	cmd := exec.CommandContext(ctx, testenv.Kubectl(t), args...)
	// Nothing of the caller's environment may point kubectl elsewhere.
	cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// render is `kubectl kustomize dir`, decoded.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	out, err := kubectl(t, "", "kustomize", dir)
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, out)
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	for {
		// Through JSON, so numbers are int64 as in objects from the API.
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatalf("kubectl kustomize %s: decoding its output: %v", dir, err)
		}
		if s := strings.TrimSpace(string(raw)); s == "" || s == "null" || s == "{}" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		objs = append(objs, u)
	}
}

func key(kind, namespace, name string) string { return kind + " " + namespace + "/" + name }

func index(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	m := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		m[key(o.GetKind(), o.GetNamespace(), o.GetName())] = o
	}
	return m
}

func mustHave(t *testing.T, objs map[string]*unstructured.Unstructured, kind, namespace, name string) *unstructured.Unstructured {
	t.Helper()
	o, ok := objs[key(kind, namespace, name)]
	if !ok {
		t.Fatalf("no %s", key(kind, namespace, name))
	}
	return o
}

func mustNotHave(t *testing.T, objs map[string]*unstructured.Unstructured, kind, namespace, name string) {
	t.Helper()
	if _, ok := objs[key(kind, namespace, name)]; ok {
		t.Errorf("%s should not be rendered", key(kind, namespace, name))
	}
}

func nested[T any](t *testing.T, o *unstructured.Unstructured, fields ...string) T {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(o.Object, fields...)
	if err != nil || !ok {
		t.Fatalf("%s %s: no %s (%v)", o.GetKind(), o.GetName(), strings.Join(fields, "."), err)
	}
	tv, ok := v.(T)
	if !ok {
		t.Fatalf("%s %s: %s is %T", o.GetKind(), o.GetName(), strings.Join(fields, "."), v)
	}
	return tv
}

// containers returns the pod template's containers of a workload.
func containers(t *testing.T, o *unstructured.Unstructured) []map[string]any {
	t.Helper()
	var cs []map[string]any
	for _, c := range nested[[]any](t, o, "spec", "template", "spec", "containers") {
		cs = append(cs, c.(map[string]any))
	}
	return cs
}

// TestKustomizeRender checks the object lists the two kustomizations render.
func TestKustomizeRender(t *testing.T) {
	t.Run("base", func(t *testing.T) {
		objs := index(render(t, "base"))
		mustHave(t, objs, "Namespace", "", "nodeproof")
		for _, crd := range []string{"nodeattestations.nodeproof.io", "attestationmarkers.nodeproof.io", "nodebindings.nodeproof.io",
			"identitybans.nodeproof.io", "nodenamehistories.nodeproof.io"} {
			mustHave(t, objs, "CustomResourceDefinition", "", crd)
		}

		server := mustHave(t, objs, "Deployment", "nodeproof", "nodeproof-server")
		if r := nested[int64](t, server, "spec", "replicas"); r != 3 {
			t.Errorf("server replicas = %d, want 3", r)
		}
		svc := mustHave(t, objs, "Service", "nodeproof", "nodeproof-server")
		var ports []int64
		for _, p := range nested[[]any](t, svc, "spec", "ports") {
			ports = append(ports, p.(map[string]any)["port"].(int64))
		}
		if !slices.Equal(ports, []int64{22623, 22624}) {
			t.Errorf("server Service ports = %v, want [22623 22624]", ports)
		}
		mustHave(t, objs, "PodDisruptionBudget", "nodeproof", "nodeproof-server")

		approver := mustHave(t, objs, "Deployment", "nodeproof", "nodeproof-approver")
		if r := nested[int64](t, approver, "spec", "replicas"); r != 2 {
			t.Errorf("approver replicas = %d, want 2", r)
		}
		mustHave(t, objs, "PodDisruptionBudget", "nodeproof", "nodeproof-approver")
		// The readiness probe is /healthz on the port --metrics-addr serves.
		c := containers(t, approver)[0]
		probe, _, _ := unstructured.NestedMap(c, "readinessProbe", "httpGet")
		if probe["path"] != "/healthz" || probe["port"] != "metrics" {
			t.Errorf("approver readiness probe = %v, want /healthz on port metrics", probe)
		}
		if !slices.Contains(stringsOf(c["args"]), "--metrics-addr=:9090") {
			t.Errorf("approver args %v lack --metrics-addr=:9090 (the metrics port)", c["args"])
		}
		checkPolicyMounted(t, objs, approver, "nodeproof-policy")
		checkPolicyMounted(t, objs, server, "nodeproof-policy")

		for _, sa := range []string{"nodeproof-server", "nodeproof-approver"} {
			mustHave(t, objs, "ServiceAccount", "nodeproof", sa)
		}
		mustHave(t, objs, "ClusterRole", "", "nodeproof-approver")
		mustHave(t, objs, "Role", "nodeproof", "nodeproof-store")
		mustHave(t, objs, "Role", "nodeproof", "nodeproof-approver-records")
		// The store's Role (create and delete records and markers) is the
		// server's alone; the approver reads records with its own Role.
		if got := boundTo(t, objs, "Role", "nodeproof-store"); !slices.Equal(got, []string{"nodeproof/nodeproof-server"}) {
			t.Errorf("nodeproof-store is bound to %v, want only nodeproof/nodeproof-server", got)
		}
		if got := boundTo(t, objs, "Role", "nodeproof-approver-records"); !slices.Equal(got, []string{"nodeproof/nodeproof-approver"}) {
			t.Errorf("nodeproof-approver-records is bound to %v, want only nodeproof/nodeproof-approver", got)
		}
		mustHave(t, objs, "Role", "kube-system", "nodeproof-server-bootstrap-tokens")
		mustHave(t, objs, "ClusterRoleBinding", "", "nodeproof-node-bootstrapper")
		mustNotHave(t, objs, "DaemonSet", "openshift-machine-config-operator", "nodeproof-machine-config-server")
		// The certificates and token kept in the cluster, and the Lease
		// that decides who writes them: the server's alone.
		for _, role := range []string{"nodeproof-server-state", "nodeproof-server-lease"} {
			if got := boundTo(t, objs, "Role", role); !slices.Equal(got, []string{"nodeproof/nodeproof-server"}) {
				t.Errorf("%s is bound to %v, want only nodeproof/nodeproof-server", role, got)
			}
		}
		state := mustHave(t, objs, "Role", "nodeproof", "nodeproof-server-state")
		if rules := nested[[]any](t, state, "rules"); len(rules) != 3 ||
			!slices.Equal(stringsOf(rules[1].(map[string]any)["resourceNames"]), []string{"machine-config-server-ca", "machine-config-server-tls", "machineconfig-auth"}) {
			t.Errorf("nodeproof-server-state rules = %v, want get/update of the three named Secrets, the bundle ConfigMap, and create", rules)
		}
		args := stringsOf(nested[[]any](t, server, "spec", "template", "spec", "containers")[0].(map[string]any)["args"])
		for _, want := range []string{"--cert-store=cluster", "--certs-namespace=nodeproof", "--token-store=cluster", "--token-secret-namespace=nodeproof"} {
			if !slices.Contains(args, want) {
				t.Errorf("server args %v lack %s", args, want)
			}
		}
	})

	t.Run("kubernetes", func(t *testing.T) {
		objs := index(render(t, "overlays/kubernetes"))
		// What OpenShift has and plain Kubernetes does not: the MCO's
		// namespace (for the kubeconfig-data Role), its CRDs, and the
		// node-bootstrapper token the server mounts.
		mustHave(t, objs, "Namespace", "", "nodeproof")
		mustHave(t, objs, "Namespace", "", "openshift-machine-config-operator")
		mustHave(t, objs, "Role", "openshift-machine-config-operator", "nodeproof-server-kubeconfig-data")
		for _, crd := range []string{"machineconfigs", "machineconfigpools", "controllerconfigs"} {
			mustHave(t, objs, "CustomResourceDefinition", "", crd+".machineconfiguration.openshift.io")
		}
		tok := mustHave(t, objs, "Secret", "nodeproof", "node-bootstrapper-token")
		if nested[string](t, tok, "type") != "kubernetes.io/service-account-token" || tok.GetAnnotations()["kubernetes.io/service-account.name"] != "node-bootstrapper" {
			t.Errorf("node-bootstrapper-token is not the token Secret of service account node-bootstrapper: %v", tok.Object)
		}
		mustHave(t, objs, "ServiceAccount", "nodeproof", "node-bootstrapper")
		server := mustHave(t, objs, "Deployment", "nodeproof", "nodeproof-server")
		var mounted bool
		for _, v := range nested[[]any](t, server, "spec", "template", "spec", "volumes") {
			if sec, _ := v.(map[string]any)["secret"].(map[string]any); sec["secretName"] == "node-bootstrapper-token" {
				mounted = true
			}
		}
		if !mounted {
			t.Error("the server does not mount node-bootstrapper-token (its CA bundle: serve refuses to start without it)")
		}
	})

	t.Run("openshift", func(t *testing.T) {
		objs := index(render(t, "overlays/openshift"))
		ds := mustHave(t, objs, "DaemonSet", "openshift-machine-config-operator", "nodeproof-machine-config-server")
		if !nested[bool](t, ds, "spec", "template", "spec", "hostNetwork") {
			t.Error("the DaemonSet must use the host network (nodes reach the MCS on the hosts' 22623/22624)")
		}
		var hostPorts []int64
		for _, p := range containers(t, ds)[0]["ports"].([]any) {
			hostPorts = append(hostPorts, p.(map[string]any)["hostPort"].(int64))
		}
		if !slices.Equal(hostPorts, []int64{22623, 22624, 22625}) {
			t.Errorf("DaemonSet host ports = %v, want [22623 22624 22625] (the MCS's two, and metrics)", hostPorts)
		}
		mustHave(t, objs, "ServiceAccount", "openshift-machine-config-operator", "nodeproof-server")
		mustHave(t, objs, "ConfigMap", "openshift-machine-config-operator", "nodeproof-policy")
		// The server keeps the user-data Secrets current: get and update
		// of exactly those two Secrets, nothing else in openshift-machine-api.
		ud := mustHave(t, objs, "Role", "openshift-machine-api", "nodeproof-server-user-data")
		if rules := nested[[]any](t, ud, "rules"); len(rules) != 1 ||
			!slices.Equal(stringsOf(rules[0].(map[string]any)["resources"]), []string{"secrets"}) ||
			!slices.Equal(stringsOf(rules[0].(map[string]any)["resourceNames"]), []string{"master-user-data", "master-user-data-managed", "worker-user-data", "worker-user-data-managed"}) ||
			!slices.Equal(stringsOf(rules[0].(map[string]any)["verbs"]), []string{"get", "update"}) {
			t.Errorf("user-data Role rules = %v, want get and update of the four user-data Secrets only", rules)
		}
		if got := boundTo(t, objs, "Role", "nodeproof-server-user-data"); !slices.Equal(got, []string{"openshift-machine-config-operator/nodeproof-server"}) {
			t.Errorf("nodeproof-server-user-data is bound to %v, want only openshift-machine-config-operator/nodeproof-server", got)
		}
		for _, o := range objs {
			if o.GetNamespace() == "openshift-machine-api" && o.GetName() != "nodeproof-server-user-data" {
				t.Errorf("%s %s/%s: only the user-data Role and its binding belong in openshift-machine-api", o.GetKind(), o.GetNamespace(), o.GetName())
			}
		}
		// The DaemonSet keeps them: --cert with the CA bundle that signed it,
		// mounted from the MCO's ConfigMap, and the URL machines reach.
		c := containers(t, ds)[0]
		args := stringsOf(c["args"])
		for _, want := range []string{"--cert=/etc/ssl/mcs/tls.crt", "--ca-bundle=/etc/nodeproof/mcs-ca/ca-bundle.crt", "--user-data-url=https://api-int.cluster.example.com:22623"} {
			if !slices.Contains(args, want) {
				t.Errorf("DaemonSet args %v lack %s", args, want)
			}
		}
		var caVolume string
		for _, m := range c["volumeMounts"].([]any) {
			if m := m.(map[string]any); m["mountPath"] == "/etc/nodeproof/mcs-ca" {
				caVolume, _ = m["name"].(string)
			}
		}
		var caConfigMap string
		for _, v := range nested[[]any](t, ds, "spec", "template", "spec", "volumes") {
			if v := v.(map[string]any); v["name"] == caVolume && caVolume != "" {
				cm, _ := v["configMap"].(map[string]any)
				caConfigMap, _ = cm["name"].(string)
			}
		}
		if caConfigMap != "machine-config-server-ca" {
			t.Errorf("/etc/nodeproof/mcs-ca is mounted from ConfigMap %q (volume %q), want machine-config-server-ca", caConfigMap, caVolume)
		}
		// Host network needs an SCC that allows it; only hostnetwork-v2.
		scc := mustHave(t, objs, "Role", "openshift-machine-config-operator", "nodeproof-server-scc")
		if rules := nested[[]any](t, scc, "rules"); len(rules) != 1 || !slices.Equal(stringsOf(rules[0].(map[string]any)["resourceNames"]), []string{"hostnetwork-v2"}) {
			t.Errorf("SCC Role rules = %v, want use of hostnetwork-v2 only", rules)
		}
		mustHave(t, objs, "RoleBinding", "openshift-machine-config-operator", "nodeproof-server-scc")
		// The token where the mco-auth-token enhancement keeps it, and the Lease, for the
		// DaemonSet's account.
		if got := boundTo(t, objs, "Role", "nodeproof-server-token"); !slices.Equal(got, []string{"openshift-machine-config-operator/nodeproof-server"}) {
			t.Errorf("nodeproof-server-token is bound to %v, want only openshift-machine-config-operator/nodeproof-server", got)
		}
		tok := mustHave(t, objs, "Role", "openshift-config", "nodeproof-server-token")
		if rules := nested[[]any](t, tok, "rules"); len(rules) != 2 || !slices.Equal(stringsOf(rules[0].(map[string]any)["resourceNames"]), []string{"machineconfig-auth"}) {
			t.Errorf("nodeproof-server-token rules = %v, want get/update of machineconfig-auth and create", rules)
		}
		if got := boundTo(t, objs, "Role", "nodeproof-server-lease"); !slices.Equal(got, []string{"openshift-machine-config-operator/nodeproof-server"}) {
			t.Errorf("nodeproof-server-lease is bound to %v, want only the DaemonSet's account", got)
		}
		mustNotHave(t, objs, "Role", "nodeproof", "nodeproof-server-state")

		// The base's server and everything only it used are gone: no
		// unused, privileged service account is left behind.
		mustNotHave(t, objs, "Deployment", "nodeproof", "nodeproof-server")
		mustNotHave(t, objs, "Service", "nodeproof", "nodeproof-server")
		mustNotHave(t, objs, "PodDisruptionBudget", "nodeproof", "nodeproof-server")
		mustNotHave(t, objs, "ServiceAccount", "nodeproof", "nodeproof-server")
		// One policy for the server and the approver: the same document in
		// each one's namespace, mounted and passed by both.
		srvPolicy := mustHave(t, objs, "ConfigMap", "openshift-machine-config-operator", "nodeproof-policy")
		apPolicy := mustHave(t, objs, "ConfigMap", "nodeproof", "nodeproof-policy")
		if a, b := nested[string](t, srvPolicy, "data", "policy.yaml"), nested[string](t, apPolicy, "data", "policy.yaml"); a != b {
			t.Errorf("the server's policy and the approver's differ:\n%s\n---\n%s", a, b)
		}
		checkPolicyMounted(t, objs, ds, "nodeproof-policy")
		checkPolicyMounted(t, objs, mustHave(t, objs, "Deployment", "nodeproof", "nodeproof-approver"), "nodeproof-policy")
		mustNotHave(t, objs, "ClusterRoleBinding", "", "nodeproof-server")
		mustNotHave(t, objs, "RoleBinding", "kube-system", "nodeproof-server-bootstrap-tokens")
		mustNotHave(t, objs, "RoleBinding", "openshift-machine-config-operator", "nodeproof-server-kubeconfig-data")
		for _, o := range objs {
			if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
				continue
			}
			for _, s := range nested[[]any](t, o, "subjects") {
				s := s.(map[string]any)
				if s["kind"] == "ServiceAccount" && s["name"] == "nodeproof-server" && s["namespace"] == "nodeproof" {
					t.Errorf("%s %s still binds nodeproof/nodeproof-server, which the overlay does not run", o.GetKind(), o.GetName())
				}
			}
		}

		// The approver stays as in the base, with its own records Role; the
		// store's Role is bound to the DaemonSet's account only.
		mustHave(t, objs, "Deployment", "nodeproof", "nodeproof-approver")
		mustHave(t, objs, "PodDisruptionBudget", "nodeproof", "nodeproof-approver")
		if got := boundTo(t, objs, "Role", "nodeproof-store"); !slices.Equal(got, []string{"openshift-machine-config-operator/nodeproof-server"}) {
			t.Errorf("nodeproof-store is bound to %v, want only openshift-machine-config-operator/nodeproof-server", got)
		}
		if got := boundTo(t, objs, "Role", "nodeproof-approver-records"); !slices.Equal(got, []string{"nodeproof/nodeproof-approver"}) {
			t.Errorf("nodeproof-approver-records is bound to %v, want only nodeproof/nodeproof-approver", got)
		}
	})
}

// boundTo lists the service accounts (namespace/name) that the rendered
// bindings give the role or cluster role name, sorted.
func boundTo(t *testing.T, objs map[string]*unstructured.Unstructured, kind, name string) []string {
	t.Helper()
	var out []string
	for _, o := range objs {
		if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		ref := nested[map[string]any](t, o, "roleRef")
		if ref["kind"] != kind || ref["name"] != name {
			continue
		}
		for _, s := range nested[[]any](t, o, "subjects") {
			s := s.(map[string]any)
			if s["kind"] == "ServiceAccount" {
				out = append(out, fmt.Sprint(s["namespace"], "/", s["name"]))
			}
		}
	}
	slices.Sort(out)
	return out
}

func stringsOf(v any) []string {
	var s []string
	l, _ := v.([]any)
	for _, x := range l {
		if str, ok := x.(string); ok {
			s = append(s, str)
		}
	}
	return s
}

// TestWorkloadArgs checks that every nodeproof container runs a command
// nodeproof has, with flags that command accepts, and that every policy
// ConfigMap holds a policy the server loads.
// imageRef is the image deploy/image names (make image builds it).
func imageRef(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("image/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Images []struct{ Name, NewName, NewTag string }
	}
	if err := yaml.Unmarshal(b, &k); err != nil || len(k.Images) != 1 || k.Images[0].Name != "nodeproof" {
		t.Fatalf("deploy/image/kustomization.yaml: want one images entry for nodeproof (%v)", err)
	}
	return k.Images[0].NewName + ":" + k.Images[0].NewTag
}

func TestWorkloadArgs(t *testing.T) {
	want := imageRef(t)
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			n := 0
			for _, o := range objs {
				switch o.GetKind() {
				case "Deployment", "DaemonSet":
				case "ConfigMap":
					if data, ok := o.Object["data"].(map[string]any); ok {
						if p, ok := data["policy.yaml"].(string); ok {
							if _, err := policy.Parse([]byte(p)); err != nil {
								t.Errorf("ConfigMap %s/%s: policy.yaml: %v", o.GetNamespace(), o.GetName(), err)
							}
						}
					}
					continue
				default:
					continue
				}
				for _, c := range containers(t, o) {
					img, _ := c["image"].(string)
					if !strings.Contains(img, "nodeproof") {
						continue
					}
					if img != want {
						t.Errorf("%s %s/%s: image %s, want %s (deploy/image: one name for every manifest and make image)", o.GetKind(), o.GetNamespace(), o.GetName(), img, want)
					}
					n++
					checkArgs(t, fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName()), stringsOf(c["args"]))
				}
			}
			if n == 0 {
				t.Fatal("no nodeproof containers rendered")
			}
		})
	}
}

var flagName = regexp.MustCompile(`^--?([A-Za-z0-9][A-Za-z0-9-]*)(=|$)`)

// checkArgs runs `nodeproof <command> -h` in process and checks that each
// flag of args is in the usage it prints.
func checkArgs(t *testing.T, what string, args []string) {
	t.Helper()
	if len(args) == 0 {
		t.Errorf("%s: no args (want a nodeproof command)", what)
		return
	}
	var stdout, stderr bytes.Buffer
	if code := cli.Run(context.Background(), []string{args[0], "-h"}, &stdout, &stderr); code != 0 {
		t.Errorf("%s: nodeproof %s -h: exit %d\n%s%s", what, args[0], code, stdout.String(), stderr.String())
		return
	}
	usage := stdout.String() + stderr.String()
	for _, a := range args[1:] {
		m := flagName.FindStringSubmatch(a)
		if m == nil {
			t.Errorf("%s: argument %q is not a --flag=value", what, a)
			continue
		}
		if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(m[1]) + `(\s|$)`).MatchString(usage) {
			t.Errorf("%s: nodeproof %s has no flag --%s", what, args[0], m[1])
		}
	}
}

// expectedWarning tells the API server's warnings that say nothing about the
// manifests.
func expectedWarning(line string) bool {
	switch {
	case strings.Contains(line, "missing the kubectl.kubernetes.io/last-applied-configuration annotation"):
		// Objects the test made without kubectl apply (the CRDs kubetest
		// installs, the namespaces).
		return true
	case strings.Contains(line, `nodeSelector[node-role.kubernetes.io/master]: use "node-role.kubernetes.io/control-plane" instead`):
		// The OpenShift DaemonSet selects control-plane nodes by the label
		// OpenShift sets, as the stock machine-config-server does.
		return true
	case strings.Contains(line, `matchExpressions[0].key: node-role.kubernetes.io/master is use "node-role.kubernetes.io/control-plane" instead`):
		// The stock machine-config-server turned off: an affinity against
		// the label its own nodeSelector names (overlays/openshift-install).
		return true
	}
	return false
}

// writeKubeconfig writes an admin kubeconfig for cfg.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken,
	}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestOnAPIServer asks a real API server's authorizer what the RBAC
// grants (the manifests themselves are applied by TestApply).
func TestOnAPIServer(t *testing.T) {
	cfg := kubetest.Start(t, "crds")
	kubeconfig := writeKubeconfig(t, cfg)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// nodeproof's own Namespace, with its Pod Security labels, and the
	// OpenShift ones the RBAC below is in.
	if out, err := kubectl(t, kubeconfig, "apply", "-f", filepath.Join("base", "namespace.yaml")); err != nil {
		t.Fatalf("kubectl apply -f base/namespace.yaml: %v\n%s", err, out)
	}
	for _, ns := range openshiftNamespaces {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("namespace %s: %v", ns, err)
		}
	}
	t.Run("approver-rbac", func(t *testing.T) { testApproverRBAC(t, cfg) })
	t.Run("user-data-rbac", func(t *testing.T) { testUserDataRBAC(t, cfg) })
}

// testApproverRBAC applies deploy/approver/rbac.yaml and deploy/store/rbac.yaml
// (the server's store Role, bound to the server) for real and asks the API
// server's authorizer what the approver's service account may do: approve
// for the two kubelet signers, nothing else; read NodeAttestations and mark
// them consumed, nothing else of the store.
func testApproverRBAC(t *testing.T, cfg *rest.Config) {
	c, err := client.New(cfg, client.Options{Scheme: kubetest.Scheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	kubetest.ApplyYAML(t, c, filepath.Join("approver", "rbac.yaml"))
	kubetest.ApplyYAML(t, c, filepath.Join("store", "rbac.yaml"))
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const ns, sa = "nodeproof", "nodeproof-approver"
	can := sar(t, cs, ns, sa)

	// The positive cases first, retried until the authorizer's informers
	// have the new roles and bindings, so the denials below are not vacuous.
	const csrGroup, npGroup = "certificates.k8s.io", "nodeproof.io"
	deadline := time.Now().Add(30 * time.Second)
	for !can("approve", csrGroup, "signers", "", "kubernetes.io/kube-apiserver-client-kubelet") || !can("list", npGroup, "nodeattestations", ns, "") {
		if time.Now().After(deadline) {
			t.Fatal("the approver may not approve for kubernetes.io/kube-apiserver-client-kubelet or list NodeAttestations 30 s after its RBAC was applied")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The store's Role is live too (the server may create records), so
	// the approver's denials below are not for want of a synced informer.
	for !sar(t, cs, ns, "nodeproof-server")("create", npGroup, "nodeattestations", ns, "") {
		if time.Now().After(deadline) {
			t.Fatal("the server may not create NodeAttestations 30 s after deploy/store/rbac.yaml was applied")
		}
		time.Sleep(200 * time.Millisecond)
	}

	for _, tc := range []struct {
		name                      string
		verb, group, resource, ns string
		resourceName              string
		want                      bool
	}{
		{"approve kubelet client", "approve", csrGroup, "signers", "", "kubernetes.io/kube-apiserver-client-kubelet", true},
		{"approve kubelet serving", "approve", csrGroup, "signers", "", "kubernetes.io/kubelet-serving", true},
		{"approve kube-apiserver-client", "approve", csrGroup, "signers", "", "kubernetes.io/kube-apiserver-client", false},
		{"approve legacy-unknown", "approve", csrGroup, "signers", "", "kubernetes.io/legacy-unknown", false},
		// The API server also accepts approve on "<domain>/*" for any signer
		// of the domain: that must not be granted either.
		{"approve kubernetes.io/*", "approve", csrGroup, "signers", "", "kubernetes.io/*", false},
		{"approve another domain", "approve", csrGroup, "signers", "", "example.com/any", false},
		// Signing is the signer's job, not the approver's.
		{"sign", "sign", csrGroup, "signers", "", "kubernetes.io/kubelet-serving", false},
		{"update CSR status", "update", csrGroup, "certificatesigningrequests/status", "", "", false},
		// What the controller needs to do its job.
		{"update CSR approval", "update", csrGroup, "certificatesigningrequests/approval", "", "", true},
		{"watch CSRs", "watch", csrGroup, "certificatesigningrequests", "", "", true},
		{"create CSRs", "create", csrGroup, "certificatesigningrequests", "", "", false},
		{"delete CSRs", "delete", csrGroup, "certificatesigningrequests", "", "", false},
		// Records: what kubestore's approver path uses (the decision
		// cache lists and watches, RecordsForNode lists on a miss,
		// ConsumeRecord gets and updates the status) ...
		{"list records", "list", npGroup, "nodeattestations", ns, "", true},
		{"watch records", "watch", npGroup, "nodeattestations", ns, "", true},
		{"get a record", "get", npGroup, "nodeattestations", ns, "", true},
		{"consume a record", "update", npGroup, "nodeattestations/status", ns, "", true},
		// ... and nothing that could forge, alter or remove one.
		{"create a record", "create", npGroup, "nodeattestations", ns, "", false},
		{"delete a record", "delete", npGroup, "nodeattestations", ns, "", false},
		{"update a record's spec", "update", npGroup, "nodeattestations", ns, "", false},
		{"patch a record", "patch", npGroup, "nodeattestations", ns, "", false},
		{"patch a record's status", "patch", npGroup, "nodeattestations/status", ns, "", false},
		{"list records elsewhere", "list", npGroup, "nodeattestations", "default", "", false},
		{"create a marker", "create", npGroup, "attestationmarkers", ns, "", false},
		{"get a marker", "get", npGroup, "attestationmarkers", ns, "", false},
		{"delete a marker", "delete", npGroup, "attestationmarkers", ns, "", false},
		// Bindings: which identity owns a node name (read only).
		{"get a binding", "get", npGroup, "nodebindings", ns, "", true},
		{"watch bindings", "watch", npGroup, "nodebindings", ns, "", true},
		{"update a binding's status", "update", npGroup, "nodebindings/status", ns, "", false},
		// Bans and name histories: read, to refuse a banned identity's
		// record and keep a released name's Node tainted; never written.
		{"watch bans", "watch", npGroup, "identitybans", ns, "", true},
		{"get a ban", "get", npGroup, "identitybans", ns, "", true},
		{"create a ban", "create", npGroup, "identitybans", ns, "", false},
		{"delete a ban (lift it)", "delete", npGroup, "identitybans", ns, "", false},
		{"watch name histories", "watch", npGroup, "nodenamehistories", ns, "", true},
		{"update a name's history", "update", npGroup, "nodenamehistories", ns, "", false},
		{"delete a name's history", "delete", npGroup, "nodenamehistories", ns, "", false},
		// Nodes: the Attested condition and the unattested taint, no more.
		{"patch a node", "patch", "", "nodes", "", "", true},
		{"patch a node's status", "patch", "", "nodes/status", "", "", true},
		{"update a node", "update", "", "nodes", "", "", false},
		{"delete a node", "delete", "", "nodes", "", "", false},
		{"create a node", "create", "", "nodes", "", "", false},
		{"create a binding", "create", npGroup, "nodebindings", ns, "", false},
		{"update a binding", "update", npGroup, "nodebindings", ns, "", false},
		{"delete a binding", "delete", npGroup, "nodebindings", ns, "", false},
		{"read Secrets", "get", "", "secrets", ns, "", false},
		// Lineages: the kubelet certificates of each name's owner, which
		// only the approver writes (RecordIssued).
		{"get a lineage", "get", npGroup, "kubeletlineages", ns, "", true},
		{"watch lineages", "watch", npGroup, "kubeletlineages", ns, "", true},
		{"create a lineage", "create", npGroup, "kubeletlineages", ns, "", true},
		{"update a lineage", "update", npGroup, "kubeletlineages", ns, "", true},
		{"patch a lineage", "patch", npGroup, "kubeletlineages", ns, "", false},
		{"delete a lineage", "delete", npGroup, "kubeletlineages", ns, "", false},
		{"create a lineage elsewhere", "create", npGroup, "kubeletlineages", "default", "", false},
	} {
		if got := can(tc.verb, tc.group, tc.resource, tc.ns, tc.resourceName); got != tc.want {
			t.Errorf("%s: %s may %s %s %s in %q: %v, want %v", tc.name, sa, tc.verb, tc.resource, tc.resourceName, tc.ns, got, tc.want)
		}
	}
	// Nobody else writes a lineage: not the server, not a node, not a
	// bootstrap token.
	for who, may := range map[string]func(verb, group, resource, ns, resourceName string) bool{
		"the server":        sar(t, cs, ns, "nodeproof-server"),
		"a node":            sarUser(t, cs, "system:node:worker-1", "system:nodes", "system:authenticated"),
		"a bootstrap token": sarUser(t, cs, "system:bootstrap:abcdef", "system:bootstrappers", "system:bootstrappers:nodeproof:worker", "system:authenticated"),
	} {
		for _, verb := range []string{"create", "update", "patch", "delete"} {
			if may(verb, npGroup, "kubeletlineages", ns, "") {
				t.Errorf("%s may %s kubeletlineages", who, verb)
			}
		}
	}
}

// testUserDataRBAC creates the OpenShift overlay's user-data Role and its
// binding, as rendered, for real, and asks the authorizer what the server's
// service account may do in openshift-machine-api: get and update the two
// user-data Secrets, nothing else.
func testUserDataRBAC(t *testing.T, cfg *rest.Config) {
	c, err := client.New(cfg, client.Options{Scheme: kubetest.Scheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	objs := index(render(t, "overlays/openshift"))
	for _, kind := range []string{"Role", "RoleBinding"} {
		o := mustHave(t, objs, kind, "openshift-machine-api", "nodeproof-server-user-data")
		if err := c.Create(context.Background(), o.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "openshift-machine-api"
	can := sar(t, cs, "openshift-machine-config-operator", "nodeproof-server")
	for deadline := time.Now().Add(30 * time.Second); !can("update", "", "secrets", ns, "worker-user-data-managed"); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server may not update worker-user-data-managed 30 s after its Role was created")
		}
	}
	for _, tc := range []struct {
		name, verb, ns, secret string
		want                   bool
	}{
		{"get worker", "get", ns, "worker-user-data-managed", true},
		{"update worker", "update", ns, "worker-user-data-managed", true},
		{"get master", "get", ns, "master-user-data-managed", true},
		{"update master", "update", ns, "master-user-data-managed", true},
		{"patch worker", "patch", ns, "worker-user-data-managed", false},
		{"delete worker", "delete", ns, "worker-user-data-managed", false},
		{"get the installer's user data", "get", ns, "worker-user-data", true},
		{"update the installer's user data", "update", ns, "master-user-data", true},
		{"get another Secret", "get", ns, "some-credentials", false},
		{"list Secrets", "list", ns, "", false},
		{"watch Secrets", "watch", ns, "", false},
		{"create a Secret", "create", ns, "", false},
		{"get a same-named Secret elsewhere", "get", "default", "worker-user-data-managed", false},
	} {
		if got := can(tc.verb, "", "secrets", tc.ns, tc.secret); got != tc.want {
			t.Errorf("%s: the server may %s Secret %q in %s: %v, want %v", tc.name, tc.verb, tc.secret, tc.ns, got, tc.want)
		}
	}
}

// sar returns a function asking the API server's authorizer (a
// SubjectAccessReview) whether the service account namespace/name may do
// verb on group's resource ("resource/subresource") in ns (empty: cluster
// scope), optionally named.
func sar(t *testing.T, cs kubernetes.Interface, namespace, name string) func(verb, group, resource, ns, resourceName string) bool {
	return sarUser(t, cs, "system:serviceaccount:"+namespace+":"+name, "system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:authenticated")
}

// sarUser is sar for any user and groups.
func sarUser(t *testing.T, cs kubernetes.Interface, user string, groups ...string) func(verb, group, resource, ns, resourceName string) bool {
	return func(verb, group, resource, ns, resourceName string) bool {
		t.Helper()
		res, sub, _ := strings.Cut(resource, "/")
		r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: groups,
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: verb, Group: group, Resource: res, Subresource: sub, Namespace: ns, Name: resourceName,
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview %s: %s %s/%s %s in %q: %v", user, verb, group, resource, resourceName, ns, err)
		}
		return r.Status.Allowed
	}
}

// TestMonitoringRender: deploy/monitoring renders the two PodMonitors
// (each selecting a workload's pods and a port those pods name), the
// rules and the dashboard ConfigMap (valid JSON). That each metric they
// read is exported: internal/e2e TestMonitoring.
func TestMonitoringRender(t *testing.T) {
	objs := index(render(t, "monitoring"))
	base := render(t, "base")
	for _, name := range []string{"nodeproof-server", "nodeproof-approver"} {
		pm := objs[key("PodMonitor", "nodeproof", name)]
		if pm == nil {
			t.Fatalf("no PodMonitor %s", name)
		}
		sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
		eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
		if len(eps) != 1 {
			t.Fatalf("PodMonitor %s: %d endpoints", name, len(eps))
		}
		port, _ := eps[0].(map[string]any)["port"].(string)
		found := false
		for _, o := range base {
			if o.GetKind() != "Deployment" {
				continue
			}
			labels, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
			if labels["app.kubernetes.io/name"] != sel["app.kubernetes.io/name"] {
				continue
			}
			for _, c := range containers(t, o) {
				ports, _ := c["ports"].([]any)
				for _, p := range ports {
					if p.(map[string]any)["name"] == port {
						found = true
					}
				}
			}
		}
		if !found {
			t.Errorf("PodMonitor %s: no Deployment in base with labels %v names a port %q", name, sel, port)
		}
	}
	if objs[key("PrometheusRule", "nodeproof", "nodeproof")] == nil {
		t.Error("no PrometheusRule")
	}
	cm := objs[key("ConfigMap", "nodeproof", "nodeproof-dashboard")]
	if cm == nil || cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Fatalf("dashboard ConfigMap: %v", cm)
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	var d struct{ Panels []any }
	if err := json.Unmarshal([]byte(data["nodeproof.json"]), &d); err != nil || len(d.Panels) == 0 {
		t.Errorf("dashboard: %v, %d panels", err, len(d.Panels))
	}
}

// apply is `kubectl apply --server-side` of args; it fails the test on an
// error or a warning that says something about the manifests, and returns
// how many objects were applied.
func apply(t *testing.T, kubeconfig string, args ...string) int {
	t.Helper()
	out, err := kubectl(t, kubeconfig, append([]string{"apply", "--server-side", "--field-manager=nodeproof-deploy-test"}, args...)...)
	if err != nil {
		t.Fatalf("kubectl apply --server-side %v: %v\n%s", args, err, out)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		switch {
		case strings.HasSuffix(line, " serverside-applied"):
			n++
		case strings.HasPrefix(line, "Warning:") && !expectedWarning(line):
			// Pod Security, deprecated APIs or fields, ...
			t.Errorf("kubectl apply %v: %s", args, line)
		}
	}
	return n
}

// TestApply applies what an operator applies, as the operator's guide says
// (docs/operations.md), for real, to a real API server: on a fresh cluster
// with nothing of OpenShift, the kubernetes overlay (namespaces, the MCO's
// CRDs, the base) and then the example MachineConfigPools, MachineConfigs
// and ControllerConfig, with strict field validation; the base again (it
// applies on a cluster that has what the overlay added); then, with the
// namespaces an OpenShift cluster has, the OpenShift overlay; then the
// install-time files and the day-2 patch of deploy/overlays/openshift/README.md
// (openshift_test.go). Every object rendered must be applied, without a
// warning about it (Pod Security restricted in the nodeproof namespace
// included).
func TestApply(t *testing.T) {
	cfg := kubetest.Start(t) // nothing installed: a plain cluster
	kubeconfig := writeKubeconfig(t, cfg)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	t.Run("overlays/kubernetes on a fresh cluster", func(t *testing.T) {
		if got, want := apply(t, kubeconfig, "-k", "overlays/kubernetes"), len(render(t, "overlays/kubernetes")); got != want {
			t.Fatalf("%d objects applied, %d rendered", got, want)
		}
		for _, crd := range []string{"machineconfigs", "machineconfigpools", "controllerconfigs"} {
			if out, err := kubectl(t, kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "crd/"+crd+".machineconfiguration.openshift.io"); err != nil {
				t.Fatalf("CRD %s: %v\n%s", crd, err, out)
			}
		}
	})
	t.Run("the examples", func(t *testing.T) {
		n := 0
		for _, d := range []string{"machine-configs", "machine-pools", "controller-config"} {
			n += apply(t, kubeconfig, "-f", filepath.Join("examples", "bootstrap", d))
		}
		if n < 10 {
			t.Fatalf("%d example objects applied", n)
		}
	})
	t.Run("base", func(t *testing.T) {
		if got, want := apply(t, kubeconfig, "-k", "base"), len(render(t, "base")); got != want {
			t.Fatalf("%d objects applied, %d rendered", got, want)
		}
	})
	t.Run("overlays/openshift", func(t *testing.T) {
		for _, ns := range openshiftNamespaces[1:] { // the MCO's exists already
			if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := apply(t, kubeconfig, "-k", "overlays/openshift"), len(render(t, "overlays/openshift")); got != want {
			t.Fatalf("%d objects applied, %d rendered", got, want)
		}
	})
	// deploy/overlays/openshift/README.md: a new cluster's install files,
	// then the day-2 patch.
	t.Run("overlays/openshift-install as cluster-bootstrap creates it", func(t *testing.T) { testOpenShiftInstall(t, kubeconfig, cs) })
	t.Run("stock-mcs-off.yaml on day 2", func(t *testing.T) { testStockMCSOff(t, kubeconfig, cs) })
}

// checkPolicyMounted: workload o passes --policy a file of the ConfigMap
// name (in its namespace, rendered) that it mounts.
func checkPolicyMounted(t *testing.T, objs map[string]*unstructured.Unstructured, o *unstructured.Unstructured, name string) {
	t.Helper()
	mustHave(t, objs, "ConfigMap", o.GetNamespace(), name)
	c := containers(t, o)[0]
	var policy string
	for _, a := range stringsOf(c["args"]) {
		if p, ok := strings.CutPrefix(a, "--policy="); ok {
			policy = p
		}
	}
	if policy == "" {
		t.Errorf("%s %s/%s passes no --policy", o.GetKind(), o.GetNamespace(), o.GetName())
		return
	}
	var volume string
	mounts, _ := c["volumeMounts"].([]any)
	for _, m := range mounts {
		m := m.(map[string]any)
		if p, _ := m["mountPath"].(string); strings.HasPrefix(policy, p+"/") {
			volume, _ = m["name"].(string)
		}
	}
	for _, v := range nested[[]any](t, o, "spec", "template", "spec", "volumes") {
		v := v.(map[string]any)
		if cm, _ := v["configMap"].(map[string]any); v["name"] == volume && volume != "" && cm["name"] == name {
			return
		}
	}
	t.Errorf("%s %s/%s: --policy=%s is not in a mount of ConfigMap %s", o.GetKind(), o.GetNamespace(), o.GetName(), policy, name)
}

// TestOpenShiftCRDsCurrent: deploy/crds/openshift holds the MCO's CRDs of
// the github.com/openshift/api version go.mod pins (the Go types cluster
// mode reads them with), byte for byte; `make generate` copies them.
func TestOpenShiftCRDsCurrent(t *testing.T) {
	want := kubetest.OpenShiftCRDs(t)
	es, err := os.ReadDir(want)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 3 {
		t.Fatalf("kubetest copies %d CRDs, want 3", len(es))
	}
	for _, e := range es {
		w, err := os.ReadFile(filepath.Join(want, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("crds", "openshift", e.Name()))
		if err != nil || !bytes.Equal(got, w) {
			t.Errorf("crds/openshift/%s differs from the openshift/api module's (%v): run make generate", e.Name(), err)
		}
	}
}
