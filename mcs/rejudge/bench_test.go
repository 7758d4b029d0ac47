package rejudge

import (
	"crypto"
	"encoding/json"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/store"
)

// benchNode is a node whose recorded claims are a real boot's (Debian 12
// under OVMF with Secure Boot), and a policy that pins its chain's digests
// and denies one other: what a re-judge does per node.
func benchNode(b *testing.B) (*policy.Policy, *store.Binding, *attest.Claims) {
	bs, err := tpm.LogBootState(firmwaretestdata.MustLog("debian-12-ovmf-secure-boot"), crypto.SHA256)
	if err != nil {
		b.Fatal(err)
	}
	c := &attest.Claims{Kind: attest.KindTPM, Identity: "tpm-ek:x", TPM: &attest.TPMClaims{PCRBank: "sha256", EKTrust: "ca:vendor", EKKind: attest.EKKindRSA2048, Boot: bs}}
	raw, err := json.Marshal(c)
	if err != nil {
		b.Fatal(err)
	}
	apps := bs.BootApplications
	pol := policytest.New().Pool("worker", policytest.TPM().SecureBoot().Boot(apps[0], apps[1], apps[len(apps)-1]).
		Edit(func(p *policy.Pool) { p.TPM.DeniedDigests = []string{kernelB} })).Must(b)
	at := t0.Add(time.Hour)
	bd := &store.Binding{NodeName: "n", Pool: "worker", Kind: attest.KindTPM, Identity: c.Identity, EnrolledAt: t0,
		Status: store.AttestationStatus{LastAttempt: at, LastSuccess: at, Passed: true, Claims: raw}}
	if v := Judge(pol, bd, at); v.Outcome != Pass {
		b.Fatalf("the bench node: %s %v %s", v.Outcome, v.Err, v.Why)
	}
	return pol, bd, c
}

// BenchmarkDecideRecorded is the re-judge's work per node: its recorded
// claims decoded and judged (Decide, in memory).
func BenchmarkDecideRecorded(b *testing.B) {
	pol, bd, _ := benchNode(b)
	now := t0.Add(2 * time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if d := Decide(pol, bd, now); d.Change != Keep {
			b.Fatal(d.Change)
		}
	}
	b.ReportMetric(float64(len(bd.Status.Claims)), "claims-bytes")
}

// BenchmarkPolicyDecideFresh is one policy Decide on claims already in
// memory, as a re-attestation's, after its evidence was verified, makes.
func BenchmarkPolicyDecideFresh(b *testing.B) {
	pol, _, c := benchNode(b)
	o := policy.Options{Now: t0.Add(2 * time.Hour), Reattestation: true}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pol.Decide("worker", c, o); err != nil {
			b.Fatal(err)
		}
	}
}
