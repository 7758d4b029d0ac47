package mcs_test

import (
	"context"
	"encoding/json"
	"maps"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/rejudge"
)

// TestRejudgeAttacks plays root on a node whose boot chain a policy change
// revoked (its last verified kernel denied) and the fleet re-judged
// (mcs/rejudge): the node tries to avoid the verdict by not re-attesting,
// by replaying its last passing answer, by answering a session opened
// before the change, by enrolling again (with the revoked chain, and with
// a fixed one) and by re-attesting with the revoked chain. Each fails;
// only a passing re-attestation of a fixed boot clears it.
func TestRejudgeAttacks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rhel := firmwaretestdata.MustLog("rhel8-uefi")
	m := e.rebootableMachine(rhel)
	forbidden := func(r attest.Reason) string { return "403 " + string(r) }
	row := func(attack, want, got string) {
		t.Helper()
		attacktable.Check(t, "policy re-judge", attack, want, got)
	}
	if got := e.enrol(m.machine, "worker", "w-r"); got != "200" {
		t.Fatalf("enrolment: %s", got)
	}
	e.advance(time.Second)
	// A re-attestation that passes (and whose answer root keeps), and a
	// session opened before the change, answered after it.
	ch, _ := e.reattestChallenge(m.machine, "worker", "w-r")
	passed := e.verifyBody(m.machine, ch)
	if _, r := e.verify(passed); r.status != 200 {
		t.Fatalf("re-attestation: %s", r.body)
	}
	e.advance(time.Second)
	early, _ := e.reattestChallenge(m.machine, "worker", "w-r")
	earlyBody := e.verifyBody(m.machine, early)

	// The policy changes: the kernel the node last attested with is
	// denied; the server judges by it, and the fleet is re-judged.
	b, err := e.store.Binding(ctx, "w-r")
	if err != nil {
		t.Fatal(err)
	}
	var cl attest.Claims
	if err := json.Unmarshal(b.Status.Claims, &cl); err != nil {
		t.Fatal(err)
	}
	kernels := cl.TPM.Boot.Kernels()
	if len(kernels) == 0 {
		t.Fatal("the recorded claims name no kernel")
	}
	p := *e.opts.Policy
	p.Pools = maps.Clone(p.Pools)
	w := p.Pools["worker"]
	w.TPM.DeniedDigests = kernels
	p.Pools["worker"] = w
	if err := e.srv.SetPolicy(mcs.Judge{Policy: &p, Verifiers: e.opts.Verifiers}); err != nil {
		t.Fatal(err)
	}
	c, err := rejudge.Run(ctx, rejudge.Options{Store: e.store, Policy: &p, Version: "deny", Clock: e.clock, Events: &e.events})
	if err != nil || c.Failed != 1 {
		t.Fatalf("re-judge: %+v, %v; want the node failed", c, err)
	}
	attested := func(after time.Duration) string {
		b, err := e.store.Binding(ctx, "w-r")
		if err != nil {
			t.Fatal(err)
		}
		if ok, why, _ := b.Attested(e.clock().Add(after), time.Hour); !ok {
			return string(why)
		}
		return "attested"
	}
	row("a node whose boot chain a policy change revoked does not re-attest (a day later, past its freshness)",
		string(attest.ReasonAttestationFailed), attested(24*time.Hour))
	e.advance(time.Second)
	_, r := e.verify(passed)
	row("a revoked node replays its last passing re-attestation's answer (the claims from before the change)",
		forbidden(attest.ReasonSessionReused), forbidden(r.reason))
	_, r = e.verify(earlyBody)
	row("a revoked node answers a re-attestation session opened before the policy changed",
		forbidden(attest.ReasonPolicyBootDenied), forbidden(r.reason))
	e.advance(time.Second)
	row("a revoked node enrols again with the revoked boot chain", forbidden(attest.ReasonPolicyBootDenied), e.enrol(m.machine, "worker", "w-r"))
	e.advance(time.Second)
	row("a revoked node re-attests with the revoked boot chain", forbidden(attest.ReasonPolicyBootDenied), e.reattestAs(m.machine, "w-r"))
	if got := attested(0); got != string(attest.ReasonAttestationFailed) {
		t.Fatalf("after the attempts: %s; want still failed", got)
	}

	// Booted into a chain the policy allows, it re-attests and is cleared;
	// a re-judge by the same policy then leaves it alone.
	m.reboot(t, firmwaretestdata.MustLog("debian-12-ovmf-secure-boot"))
	e.advance(time.Second)
	row("a revoked node boots a chain the policy allows and enrols again to get a fresh pass, instead of re-attesting",
		forbidden(attest.ReasonAttestationFailed), e.enrol(m.machine, "worker", "w-r"))
	e.advance(time.Second)
	if got := e.reattestAs(m.machine, "w-r"); got != "200" {
		t.Fatalf("a re-attestation of a fixed boot: %s", got)
	}
	b, _ = e.store.Binding(ctx, "w-r")
	if got := attested(0); got != "attested" || !b.Status.Rejudged.IsZero() {
		t.Fatalf("after a passing re-attestation: %s, rejudged %v; want attested, the re-judge's verdict gone", got, b.Status.Rejudged)
	}
	if c, err := rejudge.Run(ctx, rejudge.Options{Store: e.store, Policy: &p, Clock: e.clock}); err != nil || c.Writes() != 0 {
		t.Fatalf("re-judge after the fix: %+v, %v; want nothing written", c, err)
	}
}
