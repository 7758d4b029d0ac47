package systemtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/rejudge"
	"github.com/nodeproof/nodeproof/store"
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
