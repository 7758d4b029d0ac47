package systemtest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

// nodeproof runs a nodeproof command against the environment's store and
// returns its output; it fails the test on a non-zero exit.
func (e *enrolEnv) nodeproof(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := cli.Run(context.Background(), append(args, e.storeFlags...), &stdout, &stderr); code != 0 {
		t.Fatalf("nodeproof %v: exit %d: %s", args, code, stderr.String())
	}
	return stdout.String()
}

// client is an agent client that proves possession of k.
func (e *enrolEnv) client(t *testing.T, k kubelet) *agent.Client {
	t.Helper()
	c, err := agent.NewClient(e.url, e.bundle)
	if err != nil {
		t.Fatal(err)
	}
	c.KubeletKey = k.key
	c.MinBackoff, c.MaxBackoff = 100*time.Millisecond, time.Second
	return c
}

// outcome is "200" or the refusal, as the attack table shows it.
func outcome(t *testing.T, err error) string {
	t.Helper()
	var refused *agent.Refused
	switch {
	case err == nil:
		return "200"
	case errors.As(err, &refused):
		return fmt.Sprintf("%d %s", refused.Status, refused.Refusal.Reason)
	}
	t.Fatalf("not a refusal: %v", err)
	return ""
}

// tokenSecrets are the names of nodeproof's bootstrap token Secrets issued
// to identity.
func (e *enrolEnv) tokenSecrets(t *testing.T, identity string) []string {
	t.Helper()
	l, err := e.kc.CoreV1().Secrets(cluster.BootstrapTokenNamespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: cluster.LabelManagedBy + "=" + cluster.ManagedBy + "," + cluster.LabelIdentity + "=" + v1alpha1.LabelValue(identity)})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range l.Items {
		out = append(out, s.Name)
	}
	return out
}

// TestBanAttacks plays root on one genuine machine, and the operator's
// commands, against `nodeproof serve` in cluster mode with the Kubernetes
// store on a real API server: a ban belongs to the identity and outlives
// the release of its name; it reaches the machine's credentials at once
// (its bootstrap token Secret, a config token issued before); and a
// requested name of a Node that predates nodeproof is not claimable until
// an operator adopts it.
func TestBanAttacks(t *testing.T) {
	e := newEnrolEnv(t)
	ctx := context.Background()
	c, err := client.New(e.cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	clustertest.LoadExamples(t, "../deploy/examples/bootstrap").Create(ctx, t, c)
	// A Node that existed before nodeproof (made first, so the server's
	// watch of Node names has it well before it is asked for).
	if _, err := e.kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "legacy-0"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	row := func(attack, want, got string) {
		t.Helper()
		attacktable.Check(t, "ban", attack, want, got)
	}

	t.Run("a ban reaches every credential and outlives the release", func(t *testing.T) {
		a, ka := e.tpmMachine(t), newKubelet(t)
		ca := e.client(t, ka)
		actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		_, _, err := ca.AttestAndFetch(actx, a, "worker", "ban-0", ka.der)
		if err != nil {
			t.Fatalf("enrolment and first fetch: %v\n%s", err, e.log)
		}
		var nb v1alpha1.NodeBinding
		if err := e.objects.Get(ctx, client.ObjectKey{Namespace: "nodeproof", Name: "ban-0"}, &nb); err != nil {
			t.Fatal(err)
		}
		identity := nb.Spec.Identity
		if got := e.tokenSecrets(t, identity); len(got) != 1 {
			t.Fatalf("bootstrap token Secrets of the enrolled machine: %v; want its one", got)
		}
		// Enrolled again (a lost config), its new config token not used yet.
		again, err := a.Attest(actx, ca, "worker", "ban-0", ka.der)
		if err != nil {
			t.Fatalf("enrolling again: %v", err)
		}

		out := e.nodeproof(t, "revoke", "ban-0", "--reason", "disk stolen", "--by", "alice")
		if !strings.Contains(out, "revoked at") || !strings.Contains(out, "by alice") {
			t.Fatalf("revoke said %q", out)
		}
		gone := "deleted"
		if got := e.tokenSecrets(t, identity); len(got) > 0 {
			gone = "still there: " + strings.Join(got, ", ")
		}
		row("the revoked machine's bootstrap token Secret, once nodeproof revoke returns", "deleted", gone)
		_, err = ca.FetchConfig(actx, "worker", again.ConfigToken)
		row("the revoked machine fetches its config with a config token issued before the revocation", "403 "+string(attest.ReasonRevoked), outcome(t, err))
		row("the revoked machine enrols again under its name, its kubelet key proven", "403 "+string(attest.ReasonRevoked),
			e.attempt(t, a, "worker", "ban-0", ka, true))

		// The documented next step for a replaced machine: release.
		out = e.nodeproof(t, "release", "ban-0", "--by", "bob", "--reason", "RMA")
		if !strings.Contains(out, "stays revoked") {
			t.Errorf("release of a revoked node does not say the machine stays banned: %q", out)
		}
		row("revoke, then release: the revoked TPM enrols under a new name", "403 "+string(attest.ReasonRevoked),
			e.attempt(t, a, "worker", "ban-1", newKubelet(t), true))
		row("revoke, then release: the revoked TPM enrols in another pool (reenrol: always)", "403 "+string(attest.ReasonRevoked),
			e.attempt(t, a, "reinstall", "ban-0", newKubelet(t), true))
		row("revoke, then release: the revoked TPM re-attests under its old name", "403 "+string(attest.ReasonRevoked),
			reattestOutcome(t, e, a, ka, "ban-0"))

		// What the operator sees.
		list := e.nodeproof(t, "inspect")
		for _, w := range []string{"Banned identities (1", identity, "disk stolen", "Released names no machine holds now", "ban-0"} {
			if !strings.Contains(list, w) {
				t.Errorf("nodeproof inspect lacks %q:\n%s", w, list)
			}
		}
		story := e.nodeproof(t, "inspect", "ban-0")
		for _, w := range []string{"Released", "by bob from " + identity, "Banned:", "by alice: disk stolen"} {
			if !strings.Contains(story, w) {
				t.Errorf("nodeproof inspect ban-0 lacks %q:\n%s", w, story)
			}
		}
		var ban v1alpha1.IdentityBan
		if err := e.objects.Get(ctx, client.ObjectKey{Namespace: "nodeproof", Name: v1alpha1.BanName(identity)}, &ban); err != nil ||
			ban.Spec.By != "alice" || ban.Spec.Reason != "disk stolen" || ban.Spec.NodeName != "ban-0" {
			t.Fatalf("the IdentityBan: %+v, %v", ban.Spec, err)
		}

		// Another machine may take the name; the ban stays with the TPM.
		e.mustEnrol(t, "another machine takes the released name", e.tpmMachine(t), "worker", "ban-0", newKubelet(t), true)
		// Lifted by an operator: the machine enrols (under a free name) after attesting.
		if out := e.nodeproof(t, "unban", "--identity", identity, "--by", "carol"); !strings.Contains(out, "lifted by carol") {
			t.Fatalf("unban said %q", out)
		}
		e.mustEnrol(t, "the machine, its ban lifted, enrols under a free name", a, "worker", "ban-1", newKubelet(t), true)
	})

	t.Run("one TPM is one identity: the other EK of a banned machine", func(t *testing.T) {
		log := firmwaretestdata.MustLog("rhel8-uefi")
		m, err := e.man.NewMachine(ctx, t.TempDir(), log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		ka := newKubelet(t)
		e.mustEnrol(t, "the machine enrols with its RSA EK", agent.TPMEvidence{Collector: m.Collector}, "worker", "twoek-0", ka, true)
		enrolled := e.nodeproof(t, "inspect", "twoek-0")
		// Root on it, after an operator banned it: the TPM's ECC P-256 EK,
		// certified by the same vendor, beside the RSA one.
		e.nodeproof(t, "revoke", "twoek-0", "--reason", "disk stolen", "--by", "alice")
		if err := m.AddECCEK(e.man, log); err != nil {
			t.Fatal(err)
		}
		ecc := agent.TPMEvidence{Collector: m.Collector}
		before := e.state(t)
		want := "403 " + string(attest.ReasonPolicyEKKind)
		row("a revoked machine enrols with its TPM's other EK (ECC P-256, vendor-certified) under a new name", want,
			e.attempt(t, ecc, "worker", "twoek-1", newKubelet(t), true))
		row("... in the pool that re-enrols always", want, e.attempt(t, ecc, "reinstall", "twoek-2", newKubelet(t), true))
		row("... under its own name, with its enrolled kubelet key", want, e.attempt(t, ecc, "worker", "twoek-0", ka, true))
		if after := e.state(t); after != before {
			t.Errorf("the other EK's attempts changed the store:\nbefore:\n%safter:\n%s", before, after)
		}
		if !strings.Contains(enrolled, "rsa-2048") {
			t.Errorf("nodeproof inspect twoek-0 does not name the EK's kind:\n%s", enrolled)
		}
	})

	t.Run("a requested name of a Node that predates nodeproof", func(t *testing.T) {
		m := e.tpmMachine(t)
		row("a genuine machine asks, in a pool with requested names, for the name of a Node that predates nodeproof", "403 "+string(attest.ReasonNodeNotAdopted),
			e.attempt(t, m, "worker", "legacy-0", newKubelet(t), true))
		if msg := e.event(t, "legacy-0", string(attest.ReasonNodeNotAdopted)); !strings.Contains(msg, "nodeproof adopt legacy-0") {
			t.Errorf("NodeNotAdopted event: %q", msg)
		}
		if out := e.nodeproof(t, "adopt", "legacy-0", "--by", "alice", "--reason", "migrating to nodeproof"); !strings.Contains(out, "adopted by alice") {
			t.Fatalf("adopt said %q", out)
		}
		row("... the same, once an operator adopted the name (nodeproof adopt)", "200", e.attempt(t, m, "worker", "legacy-0", newKubelet(t), true))
	})
}

// reattestOutcome re-attests the TPM machine ev as node.
func reattestOutcome(t *testing.T, e *enrolEnv, ev agent.Evidence, k kubelet, node string) string {
	t.Helper()
	c := e.client(t, k)
	c.Purpose = attest.PurposeReattest
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := ev.Attest(ctx, c, "worker", node, k.der)
	return outcome(t, err)
}
