package mcs_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs"
)

// The RHEL 8 log's signers: Microsoft's UEFI CA verified the shim, the
// shim's built-in Red Hat CA GRUB and the kernel.
const (
	rhelShimSigner = "48e99b991f57fc52f76149599bff0a58c47154229b9f8d603ac40d3500248507"
	rhelSigner     = "40175d4c7c5ab4bd753a493f47952f1d8dcf1c219b836968a693e48bd4766135"
	notRHELSigner  = "1111111111111111111111111111111111111111111111111111111111111111"
)

// auditPolicy: worker signs GRUB and the shim by the right keys and the
// kernel by another, with the kernel's rule in audit mode; master the
// same without audit.
func auditPolicy(t testing.TB) *policy.Policy {
	signers := func() *policytest.Pool {
		return policytest.TPM().SignedBy("shim", rhelShimSigner).SignedBy("bootloader", rhelSigner).SignedBy("kernel", notRHELSigner).Requested()
	}
	return policytest.New().Pool("worker", signers().Audit(policy.RuleBootComponents+".kernel")).Pool("master", signers()).Must(t)
}

// TestBootPolicyAuditAttacks: a machine a rule in audit mode would refuse is
// admitted; the enrolment's record, a PolicyAuditRefusal Event and
// nodeproof_policy_audit_refusals_total say which rule and why; a
// re-attestation writes it into the binding's status, with an Event only
// when what it says changes. The same rule out of audit mode refuses.
func TestBootPolicyAuditAttacks(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics, err := mcs.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvPolicy(t, nil, mcs.Limits{}, auditPolicy(t), metrics)
	ctx := context.Background()
	m := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	counted := func() float64 {
		return testutil.ToFloat64(metrics.AuditRefusals().WithLabelValues("worker", "bootComponents.kernel", string(attest.ReasonPolicyBootSigner)))
	}
	audits := func() int {
		n := 0
		for _, ev := range e.events.all() {
			if strings.Contains(ev, " "+string(attest.ReasonPolicyAudit)+": ") {
				n++
			}
		}
		return n
	}

	ch, _ := e.challenge(m, "master", "master-1")
	_, r := e.verify(e.verifyBody(m, ch))
	attacktable.Check(t, "TPM (server)", "a kernel signed by a key the pool's signedBy does not list", string(attest.ReasonPolicyBootSigner), string(r.reason))

	ch, _ = e.challenge(m, "worker", "worker-1")
	vr, r := e.verify(e.verifyBody(m, ch))
	if vr == nil {
		t.Fatalf("the audit pool refused: %s", r.body)
	}
	recs, err := e.store.RecordsForNode(ctx, "worker-1")
	if err != nil || len(recs) != 1 || !strings.Contains(recs[0].Summary, "audit: bootComponents.kernel=BootSignerNotAllowed") {
		t.Errorf("the enrolment's record %+v (%v): want its summary to name the audited rule", recs, err)
	}
	if got := counted(); got != 1 || audits() != 1 {
		t.Errorf("after the enrolment: %v counted, %d audit Events; want 1, 1", got, audits())
	}

	for i := range 2 {
		e.advance(time.Second)
		ch, _ := e.reattestChallenge(m, "worker", "worker-1")
		if vr, r := e.verify(e.verifyBody(m, ch)); vr == nil || vr.Reattest == nil {
			t.Fatalf("re-attestation %d: %s", i, r.body)
		}
	}
	b, err := e.store.Binding(ctx, "worker-1")
	if err != nil || !b.Status.Passed || b.Status.Reason != "" || !strings.HasPrefix(b.Status.Audit, "bootComponents.kernel: BootSignerNotAllowed: ") {
		t.Fatalf("the binding's status %+v (%v): want passed, with the audit", b.Status, err)
	}
	if got := counted(); got != 3 || audits() != 2 {
		t.Errorf("after two re-attestations: %v counted, %d audit Events; want 3 (each), 2 (one more: the status changed once)", got, audits())
	}
}
