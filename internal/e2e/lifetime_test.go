package e2e

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect/inspecttest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/mcs/render"
)

// bootedMachine is a swtpm machine whose TPM the agent binary opens itself
// (tcp:), with the event log of its current boot in a file.
type bootedMachine struct {
	m       *swtpm.Machine
	tpmArg  string
	logFile string
}

func (w *world) bootedMachine(t *testing.T, logName string) *bootedMachine {
	t.Helper()
	dir, err := os.MkdirTemp("", "np-life-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	log := firmwaretestdata.MustLog(logName)
	m, err := w.man.NewMachine(context.Background(), dir, log)
	if err != nil {
		t.Fatal(err)
	}
	m.Collector.Close()
	m.Collector = nil
	t.Cleanup(func() { m.Close() })
	b := &bootedMachine{m: m, tpmArg: "tcp:" + m.TPM.Addr, logFile: filepath.Join(dir, "event.log")}
	if err := os.WriteFile(b.logFile, log, 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

// reboot reboots the machine into the boot logName describes.
func (b *bootedMachine) reboot(t *testing.T, logName string) {
	t.Helper()
	log := firmwaretestdata.MustLog(logName)
	if err := b.m.Reboot(context.Background(), log); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.logFile, log, 0o600); err != nil {
		t.Fatal(err)
	}
}

// reattest runs the agent binary in reattest mode (forced: every run of
// this test is a new boot or a deliberate retry) and returns its console
// and exit code.
func (w *world) reattest(t *testing.T, b *bootedMachine, node, state string) (string, int) {
	t.Helper()
	return w.runAgent(t, nil, "--mode", "reattest", "--force", "--pool", "worker", "--node-name", node,
		"--tpm", b.tpmArg, "--event-log", b.logFile, "--kubelet-key", filepath.Join(filepath.Dir(state), "kubelet.key"), "--state", state)
}

// registerNode creates the Node object, as the kubelet does when it joins.
func (w *world) registerNode(t *testing.T, name string) {
	t.Helper()
	if _, err := w.kc.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// nodeState is what the node controller left on a Node.
type nodeState struct {
	attested corev1.ConditionStatus
	reason   string
	taint    corev1.TaintEffect // "" for none
}

func (s nodeState) String() string {
	taint := "untainted"
	if s.taint != "" {
		taint = "tainted " + string(s.taint)
	}
	return fmt.Sprintf("Attested=%s (%s), %s", s.attested, s.reason, taint)
}

func (w *world) nodeState(t *testing.T, name string) nodeState {
	t.Helper()
	n, err := w.kc.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var s nodeState
	for _, c := range n.Status.Conditions {
		if c.Type == approver.ConditionAttested {
			s.attested, s.reason = c.Status, c.Reason
		}
	}
	for _, tt := range n.Spec.Taints {
		if tt.Key == approver.TaintUnattested {
			s.taint = tt.Effect
		}
	}
	return s
}

// waitNode waits up to within for the node to be in state want.
func (w *world) waitNode(t *testing.T, name string, want nodeState, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := w.nodeState(t, name)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: %s after %s; want %s\napprover:\n%s", name, got, within, want, w.approverLog)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nodesMayRenew lets the system:nodes group create and read CSRs, as a
// real cluster's Node authorizer and system:node role do (this API server
// runs RBAC only).
func (w *world) nodesMayRenew(t *testing.T) {
	t.Helper()
	if err := clustertest.NodesMayRequest(context.Background(), w.kc); err != nil {
		t.Fatal(err)
	}
}

// renewal submits a kubelet client CSR as the node itself, with its
// kubelet's current client certificate (the renewal the kubelet's
// certificate manager makes, with a new key), and returns the decision;
// once approved, the renewed certificate is the kubelet's.
func (w *world) renewal(t *testing.T, node string) certv1.CertificateSigningRequestCondition {
	t.Helper()
	return w.renewalWith(t, node, w.kubelet(node))
}

// renewalWith is renewal with the kubelet config rc.
func (w *world) renewalWith(t *testing.T, node string, rc *rest.Config) certv1.CertificateSigningRequestCondition {
	t.Helper()
	if rc == nil {
		t.Fatalf("node %s has no kubelet client certificate yet", node)
	}
	nkc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	data, err := cert.MakeCSR(key, &pkix.Name{Organization: []string{approver.NodesGroup}, CommonName: approver.NodeUserPrefix + node}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	name, _, err := csr.RequestCertificate(nkc, data, "", certv1.KubeAPIServerClientKubeletSignerName, nil,
		[]certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, crypto.Signer(key))
	if err != nil {
		t.Fatal(err)
	}
	cond := w.csrDecision(t, name)
	if cond.Type == certv1.CertificateApproved {
		keyPEM, err := clustertest.KeyPEM(key)
		if err != nil {
			t.Fatal(err)
		}
		w.setKubelet(node, w.kubeletConfig(t, name, keyPEM))
	}
	return cond
}

func (w *world) csrDecision(t *testing.T, name string) certv1.CertificateSigningRequestCondition {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := w.kc.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) > 0 {
			return got.Status.Conditions[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("CSR %s undecided", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nodeproofCmd runs the nodeproof binary against the cluster's store.
func (w *world) nodeproofCmd(t *testing.T, args ...string) string {
	t.Helper()
	args = append(args, "--store", "kubernetes", "--kubeconfig", clustertest.AdminKubeconfig(t, w.cfg), "--store-namespace", "nodeproof")
	out, err := exec.Command(w.nodeproof, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nodeproof %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// refusal is the reason in the agent's console for a refused run.
func refusalOf(out string, code int) string {
	if code != 3 {
		return fmt.Sprintf("exit %d", code)
	}
	i := strings.Index(out, "REFUSED")
	if i < 0 {
		return "refused, no reason shown"
	}
	line := out[i:]
	if j := strings.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	return line[strings.LastIndex(line, " ")+1:]
}

// TestNodeLifetimeAttacks follows one machine through its life on a real API
// server, with the real server, approver (and its node controller) and
// agent binaries and a swtpm: enrolment and first certificate; a reboot
// with Secure Boot off (tainted, renewal denied); a clean reboot
// (untainted, renewal approved); another TPM claiming its name; a replayed
// and a hand-edited status; revocation (NoExecute, everything refused);
// release (a new machine takes the name).
func TestNodeLifetimeAttacks(t *testing.T) {
	w := start(t)
	w.nodesMayRenew(t)
	const node = "life-1"
	ctx := context.Background()
	a := w.bootedMachine(t, "rhel8-uefi")
	stateDir := t.TempDir()
	state := filepath.Join(stateDir, "reattest.json")
	keyFile := filepath.Join(stateDir, "kubelet.key")
	attested := nodeState{attested: corev1.ConditionTrue, reason: string(attest.ReasonNodeAttested)}

	// Boot 1: enrol, fetch, first certificate.
	w.enrolNode(t, a, node, keyFile)

	// The same boot, the timer's run: passes.
	if out, code := w.reattest(t, a, node, state); code != 0 || !strings.Contains(out, "re-attested") {
		t.Fatalf("re-attestation in the first boot: exit %d\n%s", code, out)
	}

	// Reboot with Secure Boot off: refused, recorded; tainted within
	// moments (well within one interval), renewals denied.
	a.reboot(t, "ubuntu-2104-no-secure-boot")
	out, code := w.reattest(t, a, node, state)
	attacktable.Check(t, "lifetime", "an enrolled node re-attests after a reboot with Secure Boot off",
		string(attest.ReasonPolicySecureBootOff), refusalOf(out, code))
	w.waitNode(t, node, nodeState{attested: corev1.ConditionFalse, reason: string(attest.ReasonAttestationFailed), taint: corev1.TaintEffectNoSchedule}, 10*time.Second)
	cond := w.renewal(t, node)
	attacktable.Check(t, "lifetime", "the client certificate renewal of a node whose last re-attestation failed",
		"Denied "+string(attest.ReasonAttestationFailed), string(cond.Type)+" "+cond.Reason)
	// What the operator sees: nodeproof inspect, from the store and the
	// cluster (the Events are written asynchronously).
	w.inspectUntil(t, node, 10*time.Second, func(s *inspect.Story) string {
		c := s.Cluster
		switch {
		case s.State != inspect.StateFailed || s.Reason != string(attest.ReasonPolicySecureBootOff):
			return "state " + s.State + " " + s.Reason
		case s.Binding == nil || s.Binding.Status.Boots != 2 || len(s.Claims) == 0:
			return "the binding's boots and claims"
		case c == nil || !c.Registered || c.Condition == nil || c.Condition.Status != corev1.ConditionFalse:
			return "the Node's Attested condition False"
		case len(c.Taints) != 1 || c.Taints[0].Key != approver.TaintUnattested || c.Taints[0].Effect != corev1.TaintEffectNoSchedule:
			return "the NoSchedule taint"
		case !hasCSR(c.CSRs, "Approved", "NodeproofAttestedTPM") || !hasCSR(c.CSRs, "Denied", string(attest.ReasonAttestationFailed)):
			return "the approved first CSR and the denied renewal"
		case !hasEvent(c.Events, "NodeBinding/"+node, string(attest.ReasonAttestationFailed)) || !hasEvent(c.Events, "Node/"+node, ""):
			return "the re-attestation's Event on the NodeBinding and the node controller's on the Node"
		}
		return ""
	})
	if out := w.nodeproofCmd(t, "inspect"); !regexpLine(out, node+`\s+worker\s+tpm\s.*\sFailed\s+`+string(attest.ReasonPolicySecureBootOff)) {
		t.Errorf("nodeproof inspect does not list %s as Failed:\n%s", node, out)
	}

	// A clean reboot: passes, untainted, renewal approved.
	a.reboot(t, "rhel8-uefi")
	if out, code := w.reattest(t, a, node, state); code != 0 {
		t.Fatalf("re-attestation after a clean reboot: exit %d\n%s", code, out)
	}
	w.waitNode(t, node, attested, 10*time.Second)
	approved(t, w.renewal(t, node), "NodeproofAttestedTPM")
	var st struct{ Boots int64 }
	if b, err := os.ReadFile(state); err != nil || json.Unmarshal(b, &st) != nil || st.Boots != 3 {
		t.Errorf("the server counted %d boots (%v); want 3: enrolment's, Secure Boot off, clean", st.Boots, err)
	}

	// Another genuine TPM claims the name (a swapped TPM is a new identity).
	b := w.bootedMachine(t, "rhel8-uefi")
	out, code = w.reattest(t, b, node, filepath.Join(t.TempDir(), "reattest.json"))
	attacktable.Check(t, "lifetime", "another TPM (a swapped one) re-attests as an enrolled node",
		string(attest.ReasonNodeNameTaken), refusalOf(out, code))
	w.waitNode(t, node, attested, time.Second) // nothing about the node changed

	// A hand-edited status (to pass) is judged again at the next
	// re-attestation: a bad boot is recorded as a failure.
	a.reboot(t, "ubuntu-2104-no-secure-boot")
	if _, code := w.reattest(t, a, node, state); code != 3 {
		t.Fatalf("re-attestation with Secure Boot off passed")
	}
	w.waitNode(t, node, nodeState{attested: corev1.ConditionFalse, reason: string(attest.ReasonAttestationFailed), taint: corev1.TaintEffectNoSchedule}, 10*time.Second)
	patch := fmt.Sprintf(`{"status":{"passed":true,"reason":"","message":"","lastSuccess":%q}}`, time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"))
	if _, err := w.dyn(t).Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	w.waitNode(t, node, attested, 10*time.Second) // the node controller trusts the store (RBAC guards it)
	out, code = w.reattest(t, a, node, state)
	attacktable.Check(t, "lifetime", "a status edited by hand to pass, then the node re-attests with the same bad boot",
		string(attest.ReasonPolicySecureBootOff), refusalOf(out, code))
	w.waitNode(t, node, nodeState{attested: corev1.ConditionFalse, reason: string(attest.ReasonAttestationFailed), taint: corev1.TaintEffectNoSchedule}, 10*time.Second)

	// Revoke: NoExecute, and everything refused.
	a.reboot(t, "rhel8-uefi")
	w.nodeproofCmd(t, "revoke", node, "--reason", "RMA ticket 42")
	w.waitNode(t, node, nodeState{attested: corev1.ConditionFalse, reason: string(attest.ReasonRevoked), taint: corev1.TaintEffectNoExecute}, 10*time.Second)
	out, code = w.reattest(t, a, node, state)
	reattestOut := out
	attacktable.Check(t, "lifetime", "a revoked node re-attests (clean boot)", string(attest.ReasonRevoked), refusalOf(out, code))
	out, code = w.runAgent(t, nil, "--mode", "fetch", "--pool", "worker", "--node-name", node, "--tpm", a.tpmArg,
		"--event-log", a.logFile, "--kubelet-key", keyFile, "--root", t.TempDir())
	attacktable.Check(t, "lifetime", "a revoked node enrols again with its enrolled kubelet key", string(attest.ReasonRevoked), refusalOf(out, code))
	// The operator's free text stays with operators: the machine (and
	// whoever holds it) learns the reason code, not the ticket.
	leaked := "the code only"
	if strings.Contains(reattestOut+out, "RMA ticket 42") {
		leaked = "the operator's reason"
	}
	attacktable.Check(t, "lifetime", "a revoked machine reads why the operator revoked it", "the code only", leaked)
	cond = w.renewal(t, node)
	attacktable.Check(t, "lifetime", "a revoked node's certificate renewal", "Denied "+string(attest.ReasonRevoked), string(cond.Type)+" "+cond.Reason)
	w.waitNode(t, node, nodeState{attested: corev1.ConditionFalse, reason: string(attest.ReasonRevoked), taint: corev1.TaintEffectNoExecute}, time.Second)

	// Release: a new machine takes the name; the node is attested again.
	oldKubelet := w.kubelet(node)
	w.nodeproofCmd(t, "release", node)
	bRoot, bKey := t.TempDir(), filepath.Join(t.TempDir(), "kubelet.key")
	if out, code := w.runAgent(t, nil, "--mode", "fetch", "--pool", "worker", "--node-name", node, "--tpm", b.tpmArg,
		"--event-log", b.logFile, "--kubelet-key", bKey, "--root", bRoot); code != 0 {
		t.Fatalf("a new machine enrolling as the released name: exit %d\n%s", code, out)
	}
	w.waitNode(t, node, attested, 10*time.Second)
	// The new machine's kubelet gets its certificate and renews it; the
	// previous owner's kubelet, whose certificate is still valid, renews
	// nothing under the name.
	kubeconfig, err := os.ReadFile(filepath.Join(bRoot, render.KubeconfigPath))
	if err != nil {
		t.Fatal(err)
	}
	approved(t, w.kubeletCSR(t, kubeconfig, bKey, node), "NodeproofAttestedTPM")
	cond = w.renewalWith(t, node, oldKubelet)
	attacktable.Check(t, "lifetime", "the previous owner's kubelet renews its certificate after the name moved to another machine",
		"Denied "+string(attest.ReasonNotCurrentOwner), string(cond.Type)+" "+cond.Reason)
	approved(t, w.renewal(t, node), "NodeproofAttestedTPM")
}

// inspectUntil is inspecttest.Until through this world's nodeproof.
func (w *world) inspectUntil(t *testing.T, node string, d time.Duration, want func(*inspect.Story) string) *inspect.Story {
	t.Helper()
	return inspecttest.Until(t, func(args ...string) string { return w.nodeproofCmd(t, args...) }, node, d, want)
}

func hasCSR(csrs []inspect.CSR, decision, reason string) bool {
	for _, c := range csrs {
		if c.Decision == decision && c.Reason == reason {
			return true
		}
	}
	return false
}

// hasEvent: an Event about object, with reason (any reason when empty).
func hasEvent(evs []inspect.Event, object, reason string) bool {
	for _, e := range evs {
		if e.Object == object && (reason == "" || e.Reason == reason) {
			return true
		}
	}
	return false
}

func regexpLine(out, re string) bool {
	return regexp.MustCompile(`(?m)^` + re).MatchString(out)
}

// enrolNode is machine m's first boot as node: the agent enrols and
// fetches (its kubelet key in keyFile), the kubelet's client CSR is
// approved, the Node registers and becomes attested.
func (w *world) enrolNode(t *testing.T, m *bootedMachine, node, keyFile string) {
	t.Helper()
	root := t.TempDir()
	if out, code := w.runAgent(t, nil, "--mode", "fetch", "--pool", "worker", "--node-name", node, "--tpm", m.tpmArg,
		"--event-log", m.logFile, "--kubelet-key", keyFile, "--root", root); code != 0 {
		t.Fatalf("enrolment of %s: exit %d\n%s", node, code, out)
	}
	kubeconfig, err := os.ReadFile(filepath.Join(root, render.KubeconfigPath))
	if err != nil {
		t.Fatal(err)
	}
	approved(t, w.kubeletCSR(t, kubeconfig, keyFile, node), "NodeproofAttestedTPM")
	w.registerNode(t, node)
	w.waitNode(t, node, nodeState{attested: corev1.ConditionTrue, reason: string(attest.ReasonNodeAttested)}, 30*time.Second)
}

// dyn is the NodeBindings of the store's namespace, as an administrator
// (or a GitOps tool) edits them.
func (w *world) dyn(t *testing.T) dynamic.ResourceInterface {
	t.Helper()
	dc, err := dynamic.NewForConfig(w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dc.Resource(schema.GroupVersionResource{Group: "nodeproof.io", Version: "v1alpha1", Resource: "nodebindings"}).Namespace("nodeproof")
}
