package systemtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/mcs/rejudge"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// TestRejudgeTaints: on a real API server with `nodeproof approve`
// running, a policy change that denies the kernel a node last attested
// with fails the node without any re-attestation (mcs/rejudge.Run, as
// serve runs it at a reload): the approver's node controller sets its
// Attested condition False (AttestationFailed, saying it was re-judged and
// which rule refused) and taints it; the policy reverted, the next pass
// clears it and the taint goes. A node booted with another kernel is not
// touched.
func TestRejudgeTaints(t *testing.T) {
	a := startApproverCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	stderr := new(testenv.LockedBuffer)
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"approve",
			"--kubeconfig", a.kubeconfig(t, ""), "--store-namespace", "nodeproof",
			"--leader-elect-namespace", "nodeproof", "--leader-elect-id", "approver-rejudge",
		}, io.Discard, stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("nodeproof approve exited %d\n%s", code, stderr)
		}
	})

	kernelA, kernelB := strings.Repeat("a", 64), strings.Repeat("b", 64)
	now := time.Now()
	for i, n := range []struct{ name, kernel string }{{"worker-a", kernelA}, {"worker-b", kernelB}} {
		c := attest.Claims{Kind: attest.KindTPM, Identity: "tpm-ek:" + n.name,
			TPM: &attest.TPMClaims{PCRBank: "sha256", EKTrust: "ca:vendor", EKKind: attest.EKKindRSA2048}}
		c.TPM.Boot.SecureBootKnown, c.TPM.Boot.SecureBoot = true, true
		c.TPM.Boot.BootApplications = []string{strings.Repeat("1", 64), strings.Repeat("2", 64), n.kernel}
		cl, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		r := &store.Record{ID: strings.Repeat("0", 23) + string(rune('1'+i)), NodeName: n.name, Pool: "worker", Kind: attest.KindTPM,
			Identity: c.Identity, KubeletKeySHA256: bytes.Repeat([]byte{byte(i + 1)}, 32), CreatedAt: now.Add(-time.Hour), Expires: now}
		if err := a.st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		at := now.Add(-time.Minute)
		if _, err := a.st.UpdateStatus(ctx, n.name, c.Identity, func(b *store.Binding) error {
			b.Status = store.AttestationStatus{LastAttempt: at, LastSuccess: at, Passed: true, SessionIssuedAt: at, Claims: cl, Summary: "tpm"}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// state is the node's Attested condition and whether it is tainted.
	state := func(name string) (corev1.NodeCondition, bool) {
		n, err := a.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var c corev1.NodeCondition
		for _, x := range n.Status.Conditions {
			if x.Type == approver.ConditionAttested {
				c = x
			}
		}
		tainted := false
		for _, x := range n.Spec.Taints {
			tainted = tainted || x.Key == approver.TaintUnattested
		}
		return c, tainted
	}
	waitFor := func(what, name string, ok func(c corev1.NodeCondition, tainted bool) bool) corev1.NodeCondition {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			c, tainted := state(name)
			if ok(c, tainted) {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s is %+v, tainted %v\n%s", what, name, c, tainted, stderr)
			}
		}
	}
	attested := func(c corev1.NodeCondition, tainted bool) bool { return c.Status == corev1.ConditionTrue && !tainted }
	for _, n := range []string{"worker-a", "worker-b"} {
		waitFor("attested before the change", n, attested)
	}

	pass := func(pol *policy.Policy, version string) rejudge.Counts {
		t.Helper()
		c, err := rejudge.Run(ctx, rejudge.Options{Store: a.st, Policy: pol, Version: version, Clock: time.Now})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	deny := policytest.New().Pool("worker", policytest.TPM().Edit(func(p *policy.Pool) { p.TPM.DeniedDigests = []string{kernelA} })).Must(t)
	if c := pass(deny, "deny-a"); c.Failed != 1 || c.Writes() != 1 {
		t.Fatalf("the denying pass: %+v; want one node failed, one write", c)
	}
	c := waitFor("tainted by the re-judge", "worker-a", func(c corev1.NodeCondition, tainted bool) bool {
		return c.Status == corev1.ConditionFalse && tainted
	})
	if c.Reason != string(attest.ReasonAttestationFailed) || !strings.Contains(c.Message, "re-judged at") ||
		!strings.Contains(c.Message, string(attest.ReasonPolicyBootDenied)) || !strings.Contains(c.Message, "the policy in force changed (version deny-a)") {
		t.Errorf("worker-a's condition: %s %q; want AttestationFailed, saying the policy changed and the rule's reason", c.Reason, c.Message)
	}
	if c, tainted := state("worker-b"); !attested(c, tainted) {
		t.Errorf("worker-b, another kernel: %+v, tainted %v; want attested", c, tainted)
	}

	before := policytest.New().Pool("worker", policytest.TPM()).Must(t)
	if c := pass(before, "before"); c.Cleared != 1 || c.Writes() != 1 {
		t.Fatalf("the reverting pass: %+v; want one node cleared, one write", c)
	}
	waitFor("cleared by the reverted policy", "worker-a", attested)
}

// TestServeRejudgesOnPolicyChange: `nodeproof serve` in cluster mode (the
// Kubernetes store on a real API server) re-judges the fleet when its
// --policy file changes: a machine that enrolled and re-attested, whose
// kernel the edit denies, is failed in its NodeBinding's status without
// re-attesting (the rule's reason, the message saying the policy
// changed), with a PolicyRejudged Event, and the log's summary line; its
// next re-attestation with the same boot is refused by the new policy.
func TestServeRejudgesOnPolicyChange(t *testing.T) {
	e := newEnrolEnv(t)
	ctx := context.Background()
	c, err := client.New(e.cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	clustertest.LoadExamples(t, "../deploy/examples/bootstrap").Create(ctx, t, c)
	a, ka := e.tpmMachine(t), newKubelet(t)
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, _, err := e.client(t, ka).AttestAndFetch(actx, a, "worker", "rj-0", ka.der); err != nil {
		t.Fatalf("enrolment: %v\n%s", err, e.log)
	}
	if got := reattestOutcome(t, e, a, ka, "rj-0"); got != "200" {
		t.Fatalf("re-attestation: %s\n%s", got, e.log)
	}
	st, err := kubestore.New(e.objects, "nodeproof", time.Now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.Binding(ctx, "rj-0")
	if err != nil {
		t.Fatal(err)
	}
	var cl attest.Claims
	if err := json.Unmarshal(b.Status.Claims, &cl); err != nil || cl.TPM == nil || len(cl.TPM.Boot.Kernels()) == 0 {
		t.Fatalf("the recorded claims: %v, %+v", err, cl)
	}

	// The operator revokes the kernel the machine booted.
	doc, err := os.ReadFile(e.policyFile)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.ParseFile(doc, e.policyFile)
	if err != nil {
		t.Fatal(err)
	}
	w := pol.Pools["worker"]
	w.TPM.DeniedDigests = cl.TPM.Boot.Kernels()
	pol.Pools["worker"] = w
	out, err := policy.Marshal(pol)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.policyFile, out, 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if b, err = st.Binding(ctx, "rj-0"); err != nil {
			t.Fatal(err)
		}
		if !b.Status.Passed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node still passes 30 s after the policy change\n%s", e.log)
		}
	}
	if b.Status.Reason != string(attest.ReasonPolicyBootDenied) || b.Status.Rejudged.IsZero() ||
		!strings.HasPrefix(b.Status.Message, "the policy in force changed (version ") {
		t.Errorf("the re-judged status: %s %q, rejudged %v", b.Status.Reason, b.Status.Message, b.Status.Rejudged)
	}
	for deadline := time.Now().Add(10 * time.Second); !regexp.MustCompile(`"msg":"policy re-judged the fleet".*"failed":1,`).MatchString(e.log.String()); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server's log has no summary line of the pass with the failed node:\n%s", e.log)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		evs, err := e.kc.CoreV1().Events("nodeproof").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, ev := range evs.Items {
			found = found || (ev.Reason == string(attest.ReasonPolicyRejudged) && ev.InvolvedObject.Name == "rj-0" && ev.Type == corev1.EventTypeWarning)
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no PolicyRejudged warning Event on rj-0's NodeBinding")
		}
	}
	if got := reattestOutcome(t, e, a, ka, "rj-0"); got != "403 "+string(attest.ReasonPolicyBootDenied) {
		t.Errorf("re-attesting with the revoked kernel: %s; want 403 %s", got, attest.ReasonPolicyBootDenied)
	}
}
