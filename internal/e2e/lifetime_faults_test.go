package e2e

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
)

// The policy's lifetime (see policy in e2e_test.go) and the approver's
// leader lease: a node controller started again after a kill -9 acts once
// the dead one's lease has expired.
const (
	reattestInterval = 10 * time.Second
	leaseDuration    = 15 * time.Second
)

// within waits up to d for the node to reach want and says how it went,
// in the words of an attack row: "<what> within <d>" when it did, the
// state it was left in when it did not.
func (w *world) within(t *testing.T, name string, want nodeState, what string, d time.Duration) string {
	t.Helper()
	start := time.Now()
	for {
		got := w.nodeState(t, name)
		if got == want {
			t.Logf("%s %s after %s", name, what, time.Since(start).Round(100*time.Millisecond))
			return what + " within " + d.String()
		}
		if time.Since(start) > d {
			return "after " + d.String() + ": " + got.String()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// holds checks that the node stays in state want for d (polling), and
// returns what broke it.
func (w *world) holds(t *testing.T, name string, want nodeState, d time.Duration) string {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if got := w.nodeState(t, name); got != want {
			return got.String()
		}
	}
	return want.String()
}

// TestNodeLifetimeFaults: the node controller, the server and the API
// server fail while a node's attestation changes. After each recovery the
// node reaches the state its attestations say within one re-attestation
// interval (plus, for a killed controller, the dead leader's lease), is
// never left tainted by mistake longer than that, and is never untainted
// without a passing attestation.
func TestNodeLifetimeFaults(t *testing.T) {
	w := start(t, withAPIProxy(t))
	const node = "faulty-1"
	a := w.bootedMachine(t, "rhel8-uefi")
	stateDir := t.TempDir()
	state := filepath.Join(stateDir, "reattest.json")
	keyFile := filepath.Join(stateDir, "kubelet.key")
	attested := nodeState{attested: corev1.ConditionTrue, reason: string(attest.ReasonNodeAttested)}
	failed := nodeState{attested: corev1.ConditionFalse, reason: string(attest.ReasonAttestationFailed), taint: corev1.TaintEffectNoSchedule}

	w.enrolNode(t, a, node, keyFile)

	// The node controller is killed; meanwhile the node reboots with
	// Secure Boot off and fails. Nothing acts on the Node while the
	// controller is down; once it is back it taints the node.
	w.approver.kill()
	a.reboot(t, "ubuntu-2104-no-secure-boot")
	if _, code := w.reattest(t, a, node, state); code != 3 {
		t.Fatal("re-attestation with Secure Boot off passed")
	}
	w.approver.start()
	attacktable.Check(t, "lifetime faults", "the node controller is killed (-9) and the node fails while it is down: tainted after its restart (the dead leader's lease, then one interval)",
		"tainted within "+(leaseDuration+reattestInterval).String(), w.within(t, node, failed, "tainted", leaseDuration+reattestInterval))

	// Killed again; the node passes while it is down: untainted once it
	// is back, and not before (no one but the controller untaints).
	w.approver.kill()
	a.reboot(t, "rhel8-uefi")
	if out, code := w.reattest(t, a, node, state); code != 0 {
		t.Fatalf("a clean re-attestation: exit %d\n%s", code, out)
	}
	if got := w.holds(t, node, failed, 2*time.Second); got != failed.String() {
		t.Fatalf("the node changed while its controller was down: %s", got)
	}
	w.approver.start()
	attacktable.Check(t, "lifetime faults", "the node controller is killed (-9) and the node passes while it is down: untainted after its restart, not before",
		"untainted within "+(leaseDuration+reattestInterval).String(), w.within(t, node, attested, "untainted", leaseDuration+reattestInterval))

	// The server is killed while the node re-attests: the agent retries,
	// the server comes back, the re-attestation passes and the node is
	// never tainted on the way.
	w.server.kill()
	res := make(chan int, 1)
	go func() {
		_, code := w.reattest(t, a, node, state)
		res <- code
	}()
	time.Sleep(2 * time.Second)
	w.server.start()
	code := <-res
	attacktable.Check(t, "lifetime faults", "the server is killed (-9) while an attested node re-attests: the agent retries and passes",
		"exit 0", "exit "+strconv.Itoa(code))
	if got := w.holds(t, node, attested, 3*time.Second); got != attested.String() {
		t.Fatalf("the node left the attested state around a server crash: %s", got)
	}

	// A failed node, then the API server out of reach of the server and
	// the controller for 30 s: the node stays tainted through the outage
	// and after it (no pass happened), and a pass after the outage clears
	// it within one interval.
	a.reboot(t, "ubuntu-2104-no-secure-boot")
	if _, code := w.reattest(t, a, node, state); code != 3 {
		t.Fatal("re-attestation with Secure Boot off passed")
	}
	w.waitNode(t, node, failed, reattestInterval)
	w.apiProxy.Cut()
	time.Sleep(30 * time.Second)
	if err := w.apiProxy.Restore(); err != nil {
		t.Fatal(err)
	}
	got := w.holds(t, node, failed, reattestInterval)
	attacktable.Check(t, "lifetime faults", "the API server unreachable for 30 s while a node is tainted for a failure: still tainted after the outage, nothing passed",
		failed.String(), got)
	a.reboot(t, "rhel8-uefi")
	if out, code := w.reattest(t, a, node, state); code != 0 {
		t.Fatalf("a clean re-attestation after the outage: exit %d\n%s", code, out)
	}
	attacktable.Check(t, "lifetime faults", "... and the node passes after the outage: untainted",
		"untainted within "+reattestInterval.String(), w.within(t, node, attested, "untainted", reattestInterval))

	// An attested node through a 30 s outage: the agent's re-attestation
	// during it waits for the server (503: it cannot write), and the node
	// is attested again within one interval of the recovery, whatever the
	// controller made of the gap.
	w.apiProxy.Cut()
	res = make(chan int, 1)
	go func() {
		_, code := w.reattest(t, a, node, state)
		res <- code
	}()
	time.Sleep(30 * time.Second)
	if err := w.apiProxy.Restore(); err != nil {
		t.Fatal(err)
	}
	if code := <-res; code != 0 {
		t.Fatalf("the re-attestation across the outage: exit %d\nserver:\n%s", code, w.serverLog)
	}
	attacktable.Check(t, "lifetime faults", "an attested node re-attests while the API server is unreachable for 30 s: attested within an interval of the recovery",
		"attested within "+reattestInterval.String(), w.within(t, node, attested, "attested", reattestInterval))
	if strings.Contains(w.approverLog.String(), "panic") {
		t.Errorf("the approver panicked:\n%s", w.approverLog)
	}
}
