package deploy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/kubetest"
)

// TestRBACAttacks applies the whole Kubernetes overlay, as an operator
// does, to a real API server that authorizes and admits as production
// clusters do (Node,RBAC and NodeRestriction), and asks its authorizer
// what every account may do of what matters: lift or make a ban, rewrite
// a name's history, take a name's binding away, forge or consume a
// record, approve kubelet certificates, write a certificate lineage, read
// kube-system's Secrets. Each account may do exactly what its job needs:
// the network-facing server cannot lift a ban or rewrite a history (only
// operators, the group nodeproof:operators, can), and a node, a bootstrap
// token, another service account or user can do none of it. Then, for
// real, a node tries to remove the unattested taint from its own Node and
// to touch another's.
func TestRBACAttacks(t *testing.T) {
	cfg := kubetest.StartWith(t, kubetest.Options{Production: true})
	kubeconfig := writeKubeconfig(t, cfg)
	if got, want := apply(t, kubeconfig, "-k", "overlays/kubernetes"), len(render(t, "overlays/kubernetes")); got != want {
		t.Fatalf("%d objects applied, %d rendered", got, want)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const ns, np, csr = "nodeproof", "nodeproof.io", "certificates.k8s.io"
	type action struct {
		name                             string
		verb, group, resource, namespace string
		resourceName                     string
	}
	actions := []action{
		{"lift a ban", "delete", np, "identitybans", ns, ""},
		{"ban an identity", "create", np, "identitybans", ns, ""},
		{"rewrite a name's history", "update", np, "nodenamehistories", ns, ""},
		{"write a name's history", "create", np, "nodenamehistories", ns, ""},
		{"delete a name's history", "delete", np, "nodenamehistories", ns, ""},
		{"delete a binding", "delete", np, "nodebindings", ns, ""},
		{"forge a record", "create", np, "nodeattestations", ns, ""},
		{"consume a record", "update", np, "nodeattestations/status", ns, ""},
		{"approve kubelet client certificates", "approve", csr, "signers", "", "kubernetes.io/kube-apiserver-client-kubelet"},
		{"write a kubelet certificate lineage", "create", np, "kubeletlineages", ns, ""},
		{"read kube-system's Secrets", "list", "", "secrets", "kube-system", ""},
		{"rewrite the policy ConfigMap", "update", "", "configmaps", ns, "nodeproof-policy"},
		{"publish a replica's status", "update", "", "configmaps", ns, "nodeproof-server-status"},
	}
	type account struct {
		name   string
		user   string
		groups []string
		may    []string // the actions its job needs
	}
	saGroups := func(namespace string) []string {
		return []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}
	}
	accounts := []account{
		{"the server's service account", "system:serviceaccount:nodeproof:nodeproof-server", saGroups(ns),
			// Records and their consumption by the server's store path; a
			// refused enrolment's binding undone; bootstrap tokens.
			[]string{"delete a binding", "forge a record", "consume a record", "read kube-system's Secrets", "publish a replica's status"}},
		{"the approver's service account", "system:serviceaccount:nodeproof:nodeproof-approver", saGroups(ns),
			[]string{"consume a record", "approve kubelet client certificates", "write a kubelet certificate lineage"}},
		{"an operator (group nodeproof:operators)", "alice", []string{"nodeproof:operators", "system:authenticated"},
			[]string{"lift a ban", "ban an identity", "rewrite a name's history", "write a name's history", "delete a binding", "read kube-system's Secrets"}},
		{"a node's credentials", "system:node:worker-1", []string{"system:nodes", "system:authenticated"}, nil},
		{"a bootstrap token", "system:bootstrap:abcdef", []string{"system:bootstrappers", "system:bootstrappers:nodeproof:worker", "system:authenticated"}, nil},
		{"another service account in nodeproof's namespace", "system:serviceaccount:nodeproof:default", saGroups(ns), nil},
		{"another authenticated user", "bob", []string{"system:authenticated"}, nil},
	}
	// The authorizer reads RBAC through informers: wait until the
	// operators' binding is in force, so a refusal below is not vacuous.
	op := sarUser(t, cs, "alice", "nodeproof:operators", "system:authenticated")
	for deadline := time.Now().Add(30 * time.Second); !op("delete", np, "identitybans", ns, ""); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the operators' Role is not in force 30 s after the overlay was applied")
		}
	}
	for _, a := range accounts {
		can := sarUser(t, cs, a.user, a.groups...)
		var allowed, missing []string
		for _, x := range actions {
			ok := can(x.verb, x.group, x.resource, x.namespace, x.resourceName)
			switch need := slices.Contains(a.may, x.name); {
			case ok && !need:
				allowed = append(allowed, x.name)
			case !ok && need:
				missing = append(missing, x.name)
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s may not %s, which its job needs", a.name, strings.Join(missing, ", "))
		}
		var others []string
		for _, x := range actions {
			if !slices.Contains(a.may, x.name) {
				others = append(others, x.name)
			}
		}
		got := "none allowed"
		if len(allowed) > 0 {
			got = "allowed: " + strings.Join(allowed, ", ")
		}
		attacktable.Check(t, "RBAC", fmt.Sprintf("%s tries to %s", a.name, strings.Join(others, ", ")), "none allowed", got)
	}

	// NodeRestriction and the Node authorizer, for real: a node cannot
	// take the unattested taint off its own Node, nor touch another's.
	ctx := context.Background()
	for _, name := range []string{"worker-1", "worker-2"} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "nodeproof.io/unattested", Effect: corev1.TaintEffectNoSchedule}}}}
		if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	asNode := rest.CopyConfig(cfg)
	asNode.Impersonate = rest.ImpersonationConfig{UserName: "system:node:worker-1", Groups: []string{"system:nodes", "system:authenticated"}}
	node, err := kubernetes.NewForConfig(asNode)
	if err != nil {
		t.Fatal(err)
	}
	untaint := []byte(`{"spec":{"taints":[]}}`)
	for _, c := range []struct{ attack, target string }{
		{"a node removes the unattested taint from its own Node", "worker-1"},
		{"a node removes the unattested taint from another node's Node", "worker-2"},
	} {
		_, err := node.CoreV1().Nodes().Patch(ctx, c.target, types.MergePatchType, untaint, metav1.PatchOptions{})
		got := "taint removed"
		if apierrors.IsForbidden(err) {
			got = "Forbidden"
		} else if err != nil {
			got = "failed otherwise: " + err.Error()
		}
		attacktable.Check(t, "RBAC", c.attack, "Forbidden", got)
	}
	for _, name := range []string{"worker-1", "worker-2"} {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil || !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == "nodeproof.io/unattested" }) {
			t.Errorf("Node %s: taints %v (%v); want the unattested taint kept", name, n.Spec.Taints, err)
		}
	}
}
