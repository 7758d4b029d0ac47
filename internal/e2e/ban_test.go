package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/systemtest"
)

// asNode is a clientset that acts as node's kubelet (its client
// certificate's identity), with what a real cluster's Node authorizer lets
// a kubelet do to its own Node: get, and patch its status.
func (w *world) asNode(t *testing.T, node string) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	if _, err := w.kc.RbacV1().ClusterRoles().Get(ctx, "e2e-node-self", metav1.GetOptions{}); err != nil {
		if _, err := w.kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-self"},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch", "update"}},
			}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-self"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "e2e-node-self"},
			Subjects: []rbacv1.Subject{{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: approver.NodesGroup}}},
			metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rc := rest.CopyConfig(w.cfg)
	rc.Impersonate = rest.ImpersonationConfig{UserName: approver.NodeUserPrefix + node, Groups: []string{approver.NodesGroup, "system:authenticated"}}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	// RBAC reaches the authorizer through its own watch: wait until the
	// node may patch its status, so a refusal below is the attack's, not
	// the binding's delay.
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "patch", Resource: "nodes", Subresource: "status", Name: node}}}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r, err := kc.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err == nil && r.Status.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node's RBAC never took effect: %+v, %v", r, err)
		}
	}
	return kc
}

// TestNodeEscapeAttacks: a node whose name an operator released stays
// nodeproof's. Its kubelet (root on the machine holds its credentials)
// deletes its own Attested condition, or sets it True, again and again:
// the approver's node controller puts the condition back and the node
// stays tainted NoExecute, because the name's history — not the Node —
// says it was nodeproof's.
func TestNodeEscapeAttacks(t *testing.T) {
	w := start(t)
	const node = "escape-1"
	ctx := context.Background()
	m := w.bootedMachine(t, "rhel8-uefi")
	w.enrolNode(t, m, node, filepath.Join(t.TempDir(), "kubelet.key"))
	w.nodeproofCmd(t, "release", node, "--by", "alice", "--reason", "decommissioned")
	released := nodeState{attested: corev1.ConditionFalse, reason: string(attest.ReasonNotEnrolled), taint: corev1.TaintEffectNoExecute}
	w.waitNode(t, node, released, 10*time.Second)

	self := w.asNode(t, node)
	deleteCond := []byte(`{"status":{"conditions":[{"type":"` + string(approver.ConditionAttested) + `","$patch":"delete"}]}}`)
	setTrue := []byte(fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":"True","reason":%q,"message":"trust me","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
		approver.ConditionAttested, attest.ReasonNodeAttested, time.Now().UTC().Format(time.RFC3339), time.Now().UTC().Format(time.RFC3339)))
	for _, tc := range []struct {
		attack, name string
		patch        []byte
	}{
		{"a released node deletes its own Attested condition, 20 times in 2 s", "delete", deleteCond},
		{"a released node sets its own Attested condition True, 20 times in 2 s", "set True", setTrue},
	} {
		for range 20 {
			if _, err := self.CoreV1().Nodes().PatchStatus(ctx, node, tc.patch); err != nil {
				t.Fatalf("%s: the node's own patch was refused: %v", tc.name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Within moments the controller has put both back (and they stay).
		deadline := time.Now().Add(10 * time.Second)
		got := w.nodeState(t, node)
		for got != released && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			got = w.nodeState(t, node)
		}
		attacktable.Check(t, "lifetime", tc.attack, released.String(), got.String())
	}
	// The name was nodeproof's even with the condition gone when the
	// controller first judges it (a restart, a new leader): the Node is
	// deleted and registered again without any condition.
	if err := w.kc.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.registerNode(t, node)
	deadline := time.Now().Add(10 * time.Second)
	got := w.nodeState(t, node)
	for got != released && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		got = w.nodeState(t, node)
	}
	attacktable.Check(t, "lifetime", "a released node's Node is deleted and registered again, with no condition", released.String(), got.String())
}

// TestOperatorsWithoutDowntimeAttacks: with the embedded store (directory
// mode) `nodeproof revoke`, `release`, `unban` and `inspect` work while
// `nodeproof serve` runs — bbolt locks its file, so they act through the
// server's admin socket — and what they do is in force at once: the
// revoked machine's next re-attestation is refused, the released name's
// machine is still refused under a new name, and the lifted ban lets it
// enrol. The server process is never stopped.
func TestOperatorsWithoutDowntimeAttacks(t *testing.T) {
	nodeproof, agentBin := bins(t)
	sys := systemtest.New(t, "../..", systemtest.Options{TPM: true, Policy: policy})
	man, policyFile := sys.Manufacturer, sys.PolicyFile
	stateDir := filepath.Join(t.TempDir(), "state")
	secure := testenv.FreePort(t)
	w := &world{nodeproof: nodeproof, agent: agentBin, man: man, stateDir: stateDir, serverLog: new(testenv.LockedBuffer),
		url: fmt.Sprintf("https://127.0.0.1:%d", secure), bundleFile: filepath.Join(stateDir, "certs", "current", certs.CABundleFileName)}
	w.server = process(t, "nodeproof serve (directory mode)", w.serverLog, nodeproof, "serve",
		"--server-basedir", "../../deploy/examples/bootstrap", "--bootstrap-kubeconfig", "../../deploy/examples/bootstrap-kubeconfig",
		"--policy", policyFile, "--state-dir", stateDir, "--hosts", "127.0.0.1", "--listen", "127.0.0.1",
		"--secure-port", fmt.Sprint(secure), "--insecure-port", "0")
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(stateDir, "admin.sock")); err == nil {
			if _, err := os.Stat(w.bundleFile); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not start:\n%s", w.serverLog)
		}
	}
	op := func(args ...string) (string, error) {
		out, err := exec.Command(nodeproof, append(args, "--state-dir", stateDir)...).CombinedOutput()
		return string(out), err
	}
	mustOp := func(args ...string) string {
		t.Helper()
		out, err := op(args...)
		if err != nil {
			t.Fatalf("nodeproof %v against the running server: %v\n%s", args, err, out)
		}
		return out
	}
	enrol := func(m *bootedMachine, node, key string) (string, int) {
		return w.runAgent(t, nil, "--mode", "fetch", "--pool", "worker", "--node-name", node, "--tpm", m.tpmArg,
			"--event-log", m.logFile, "--kubelet-key", key, "--root", t.TempDir())
	}
	m := w.bootedMachine(t, "rhel8-uefi")
	stateA := filepath.Join(t.TempDir(), "reattest.json")
	keyA := filepath.Join(filepath.Dir(stateA), "kubelet.key")
	if out, code := enrol(m, "dir-0", keyA); code != 0 {
		t.Fatalf("enrolment: exit %d\n%s\n%s", code, out, w.serverLog)
	}
	if out, code := w.reattest(t, m, "dir-0", stateA); code != 0 {
		t.Fatalf("re-attestation before the revocation: exit %d\n%s", code, out)
	}

	out := mustOp("revoke", "dir-0", "--by", "alice", "--reason", "disk stolen")
	if !strings.Contains(out, "by alice") {
		t.Errorf("revoke said %q", out)
	}
	out, code := w.reattest(t, m, "dir-0", stateA)
	attacktable.Check(t, "operators", "nodeproof revoke against a running directory-mode server (admin socket), then the node re-attests",
		string(attest.ReasonRevoked), refusalOf(out, code))
	mustOp("release", "dir-0", "--by", "bob")
	out, code = enrol(m, "dir-1", filepath.Join(t.TempDir(), "kubelet.key"))
	attacktable.Check(t, "operators", "... then nodeproof release against it, and the revoked machine enrols under a new name",
		string(attest.ReasonRevoked), refusalOf(out, code))
	list := mustOp("inspect")
	for _, want := range []string{"Banned identities (1", "disk stolen", "dir-0"} {
		if !strings.Contains(list, want) {
			t.Errorf("nodeproof inspect against the running server lacks %q:\n%s", want, list)
		}
	}
	out = mustOp("unban", "dir-0", "--by", "carol")
	if !strings.Contains(out, "lifted by carol") {
		t.Errorf("unban said %q", out)
	}
	out, code = enrol(m, "dir-1", filepath.Join(t.TempDir(), "kubelet.key"))
	got := "enrolled"
	if code != 0 {
		got = refusalOf(out, code)
	}
	attacktable.Check(t, "operators", "... then nodeproof unban against it, and the machine enrols under a free name", "enrolled", got)

	// The server's own operations are not reachable through the socket,
	// and it never stopped.
	if out, err := op("enroll", "--reset", "aws-instance/1/i-1"); err != nil {
		t.Errorf("enroll --reset KEY against the running server: %v\n%s", err, out)
	}
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(w.url, "https://"), 5*time.Second); err != nil {
		t.Fatalf("the server stopped: %v\n%s", err, w.serverLog)
	} else {
		c.Close()
	}
}
