package mcs_test

import (
	"context"
	"testing"
	"time"

	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
)

// TestAKTicketAttacks: the server seals the AK ticket a TPM's activation
// earns, and a re-attestation that brings it back with the same AK gets a
// challenge with no credential; any other ticket — tampered, another
// purpose's box, another machine's, expired — leaves the credential in
// (the node proves its AK with the EK, as one without a ticket does), and
// a ticketed re-attestation is judged like any other.
func TestAKTicketAttacks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	other := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	credential := func(attack, ticket string, by *machine) {
		t.Helper()
		ch, r := e.reattestChallengeTicket(by, "worker", "worker-t", ticket)
		if ch == nil {
			t.Fatalf("%s: challenge refused: %s", attack, r.body)
		}
		got := "no credential (ticket taken)"
		if len(tpmChallenge(t, ch).Credential) > 0 {
			got = "credential"
		}
		attacktable.Check(t, "lifetime", attack, "credential", got)
	}

	ch, _ := e.challenge(m, "worker", "worker-t")
	vr, r := e.verify(e.verifyBody(m, ch))
	if vr == nil {
		t.Fatalf("enrolment: %s", r.body)
	}
	if vr.Ticket == "" {
		t.Fatal("an enrolment that activated a credential returned no AK ticket")
	}
	ticket := vr.Ticket

	// The honest node, same AK, its ticket: no credential, and it passes.
	e.advance(time.Second)
	ch, r = e.reattestChallengeTicket(m, "worker", "worker-t", ticket)
	if ch == nil || len(tpmChallenge(t, ch).Credential) != 0 {
		t.Fatalf("the node's own ticket did not spare the activation: %s", r.body)
	}
	vr, r = e.verify(e.verifyBody(m, ch))
	if vr == nil || vr.Reattest == nil {
		t.Fatalf("ticketed re-attestation refused: %s", r.body)
	}
	if vr.Ticket != "" {
		t.Error("a ticketed re-attestation returned a new ticket: tickets would renew themselves without an activation")
	}
	if b, err := e.store.Binding(ctx, "worker-t"); err != nil || !b.Status.Passed {
		t.Fatalf("binding after the ticketed re-attestation: %+v %v", b, err)
	}

	tampered := []byte(ticket)
	tampered[len(tampered)/2] ^= 1
	credential("an AK ticket altered by the node", string(tampered), m)
	credential("a sealed session presented as an AK ticket", ch.Session, m)
	credential("another machine's AK ticket", ticket, other)
	e.advance(31 * 24 * time.Hour)
	credential("an AK ticket older than its TTL", ticket, m)
}
