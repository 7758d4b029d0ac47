package mcs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/store"
)

// rebootable is a machine whose TPM can boot again into another event log.
type rebootable struct {
	*machine
	sw *swtpm.Machine
}

func (e *env) rebootableMachine(log []byte) *rebootable {
	e.t.Helper()
	m, err := e.man.NewMachine(context.Background(), e.t.TempDir(), log)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { m.Close() })
	return &rebootable{machine: &machine{kubelet: m.Kubelet, collector: m.Collector, keyDER: m.KubeletDER, keySHA: m.KubeletSHA}, sw: m}
}

// reboot boots the machine's TPM into log, with a new collector on it.
func (r *rebootable) reboot(t *testing.T, log []byte) {
	t.Helper()
	if err := r.sw.Reboot(context.Background(), log); err != nil {
		t.Fatal(err)
	}
	ch, err := tpm.DialSocket("tcp", r.sw.TPM.Addr, log)
	if err != nil {
		t.Fatal(err)
	}
	if r.sw.Collector, err = tpm.NewCollector(ch); err != nil {
		ch.Close()
		t.Fatal(err)
	}
	r.collector = r.sw.Collector
}

// enrol attests m for pool as node with a proof of its kubelet key, as
// the agent does (enrolling again needs the proof): "200" or the refusal.
func (e *env) enrol(m *machine, pool, node string) string {
	e.t.Helper()
	ch, r := e.challenge(m, pool, node)
	if ch == nil {
		return fmt.Sprintf("%d %s", r.status, r.reason)
	}
	ev, err := m.collector.Answer(tpmChallenge(e.t, ch), m.keySHA)
	if err != nil {
		e.t.Fatal(err)
	}
	proof, err := attest.SignKeyProof(m.kubelet, ch.Session)
	if err != nil {
		e.t.Fatal(err)
	}
	body, _ := json.Marshal(api.VerifyRequest{Session: ch.Session, KubeletKeyProof: proof, Kind: attest.KindTPM, Evidence: api.Message(ev)})
	if _, r = e.verify(body); r.status == 200 {
		return "200"
	}
	return fmt.Sprintf("%d %s", r.status, r.reason)
}

// reattest re-attests m as node: "200" or the refusal.
func (e *env) reattestAs(m *machine, node string) string {
	e.t.Helper()
	ch, r := e.reattestChallenge(m, "worker", node)
	if ch == nil {
		return fmt.Sprintf("%d %s", r.status, r.reason)
	}
	if _, r = e.verify(e.verifyBody(m, ch)); r.status == 200 {
		return "200"
	}
	return fmt.Sprintf("%d %s", r.status, r.reason)
}

// TestEnrolAgainAttacks plays root on an enrolled machine that uses
// "enrolling again" (the path for a machine that lost its config) to get
// what re-attestation would refuse it: another pool (worker requires
// Secure Boot, master does not), a failed attestation laundered, bootstrap
// tokens without bound; and a banned TPM after its name was released.
func TestEnrolAgainAttacks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rhel, noSB := firmwaretestdata.MustLog("rhel8-uefi"), firmwaretestdata.MustLog("ubuntu-2104-no-secure-boot")
	m := e.rebootableMachine(rhel)
	forbidden := func(r attest.Reason) string { return "403 " + string(r) }
	row := func(attack, want, got string) {
		t.Helper()
		attacktable.Check(t, "enrolment", attack, want, got)
	}
	unchanged := func(what string) {
		t.Helper()
		b, err := e.store.Binding(ctx, "w-1")
		if err != nil || b.Pool != "worker" {
			t.Fatalf("%s: the binding moved: %+v, %v", what, b, err)
		}
	}

	if got := e.enrol(m.machine, "worker", "w-1"); got != "200" {
		t.Fatalf("enrolment: %s", got)
	}
	row("TPM: an enrolled node enrols again, with its kubelet key proven, in another pool (worker → master)",
		forbidden(attest.ReasonEnrolledInAnotherPool), e.enrol(m.machine, "master", "w-1"))
	unchanged("enrolling again in another pool")

	// Its re-attestation fails (Secure Boot off): recorded.
	m.reboot(t, noSB)
	if got := e.reattestAs(m.machine, "w-1"); got != forbidden(attest.ReasonPolicySecureBootOff) {
		t.Fatalf("re-attestation with Secure Boot off: %s", got)
	}
	row("TPM: a node whose re-attestation failed (Secure Boot off) enrols again in a pool that does not require Secure Boot",
		forbidden(attest.ReasonEnrolledInAnotherPool), e.enrol(m.machine, "master", "w-1"))
	unchanged("the failed node enrolling again in another pool")

	// Rebooted clean, it tries to replace the failure by enrolling again
	// rather than by re-attesting.
	m.reboot(t, rhel)
	e.advance(time.Second)
	row("TPM: a node whose re-attestation failed boots clean and enrols again instead of re-attesting",
		forbidden(attest.ReasonAttestationFailed), e.enrol(m.machine, "worker", "w-1"))
	if b, _ := e.store.Binding(ctx, "w-1"); func() bool { ok, _, _ := b.Attested(e.clock(), time.Hour); return ok }() {
		t.Fatal("the refused enrolment replaced the failed attestation")
	}
	e.advance(time.Second)
	if got := e.reattestAs(m.machine, "w-1"); got != "200" {
		t.Fatalf("a clean re-attestation: %s", got)
	}

	// Enrolling again mints a record and a bootstrap token each time:
	// bounded per identity.
	got := ""
	for i := 0; i < mcs.DefaultMaxLiveEnrolments+2 && got == ""; i++ {
		e.advance(time.Second)
		if r := e.enrol(m.machine, "worker", "w-1"); r != "200" {
			got = fmt.Sprintf("%s with %d enrolments live", r, i+1)
		}
	}
	row(fmt.Sprintf("TPM: an enrolled machine enrols again and again to mint bootstrap tokens (%d live per identity)", mcs.DefaultMaxLiveEnrolments),
		fmt.Sprintf("%s with %d enrolments live", forbidden(attest.ReasonEnrolmentCap), mcs.DefaultMaxLiveEnrolments), got)
	recs, _ := e.store.RecordsForNode(ctx, "w-1")
	if len(recs) != mcs.DefaultMaxLiveEnrolments {
		t.Fatalf("%d records for w-1; want %d", len(recs), mcs.DefaultMaxLiveEnrolments)
	}
	// Once the oldest expires, it may enrol again.
	e.advance(time.Hour)
	if r := e.enrol(m.machine, "worker", "w-1"); r != "200" {
		t.Fatalf("enrolling again once the records expired: %s", r)
	}
	// A pool whose machines reboot through provisioning raises its cap.
	p := *e.srv.Policy()
	p.Pools = maps.Clone(p.Pools)
	w := p.Pools["worker"]
	w.Serve.MaxLiveEnrolments = 6
	p.Pools["worker"] = w
	if err := e.srv.SetPolicy(mcs.Judge{Policy: &p, Verifiers: e.opts.Verifiers}); err != nil {
		t.Fatal(err)
	}
	got = ""
	for i := 1; i < 8 && got == ""; i++ {
		e.advance(time.Second)
		if r := e.enrol(m.machine, "worker", "w-1"); r != "200" {
			got = fmt.Sprintf("%s with %d enrolments live", r, i)
		}
	}
	if want := forbidden(attest.ReasonEnrolmentCap) + " with 6 enrolments live"; got != want {
		t.Errorf("serve.maxLiveEnrolments 6: %s; want %s", got, want)
	}
	if err := e.srv.SetPolicy(mcs.Judge{Policy: e.opts.Policy, Verifiers: e.opts.Verifiers}); err != nil {
		t.Fatal(err)
	}

	// Banned, then released: the TPM is refused under any name and pool.
	b, err := e.store.Binding(ctx, "w-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Ban(ctx, store.Ban{NodeName: "w-1", At: e.clock(), By: "alice", Reason: "stolen"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Release(ctx, "w-1", store.Act{By: "alice"}); err != nil {
		t.Fatal(err)
	}
	row("TPM: revoked, then its name released: the machine enrols under a new name", forbidden(attest.ReasonRevoked), e.enrol(m.machine, "worker", "w-2"))
	row("TPM: revoked, then its name released: the machine enrols under its old name in another pool", forbidden(attest.ReasonRevoked), e.enrol(m.machine, "master", "w-1"))
	row("TPM: revoked, then its name released: the machine re-attests", forbidden(attest.ReasonRevoked), e.reattestAs(m.machine, "w-1"))
	if _, err := e.store.Binding(ctx, "w-2"); err == nil {
		t.Fatal("the banned identity was bound")
	}
	// Lifted: it enrols again after attesting, as any machine.
	if _, err := e.store.Unban(ctx, b.Identity); err != nil {
		t.Fatal(err)
	}
	if got := e.enrol(m.machine, "worker", "w-2"); got != "200" {
		t.Fatalf("enrolment once the ban is lifted: %s", got)
	}
}
