package mcs_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// reattestChallenge opens a re-attestation session for node.
func (e *env) reattestChallenge(m *machine, pool, node string) (*api.ChallengeResponse, result) {
	return e.reattestChallengeTicket(m, pool, node, "")
}

// reattestChallengeTicket is reattestChallenge bringing an AK ticket.
func (e *env) reattestChallengeTicket(m *machine, pool, node, ticket string) (*api.ChallengeResponse, result) {
	req, err := m.collector.Request()
	if err != nil {
		e.t.Fatal(err)
	}
	body, _ := json.Marshal(api.ChallengeRequest{Kind: attest.KindTPM, Pool: pool, KubeletPublicKey: m.keyDER, NodeName: node,
		Purpose: attest.PurposeReattest, Ticket: ticket, Request: api.Message(req)})
	r := e.do("POST", e.secure.URL+api.PathChallenge, body, map[string]string{"Content-Type": "application/json"})
	if r.status != 200 {
		return nil, r
	}
	var resp api.ChallengeResponse
	if err := json.Unmarshal(r.body, &resp); err != nil {
		e.t.Fatal(err)
	}
	return &resp, r
}

// TestReattestAttacks: re-attestations the server refuses, each with its
// reason, writing nothing but (where the identity was proven) the failure:
// an identity that never enrolled, another identity's node name, a replayed
// answer, an older session answered after a newer one, no node name, an
// unknown purpose. And what passes: the enrolled identity, its boots
// counted, no config token.
func TestReattestAttacks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	other := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	row := func(attack string, want attest.Reason, r result) {
		t.Helper()
		attacktable.Check(t, "lifetime", attack, string(want), string(r.reason))
	}

	ch, r := e.reattestChallenge(m, "worker", "never-enrolled")
	if ch == nil {
		t.Fatalf("challenge: %s", r.body)
	}
	_, r = e.verify(e.verifyBody(m, ch))
	row("a re-attestation by an identity that never enrolled", attest.ReasonNotEnrolled, r)

	// Enrol m as worker-5.
	ch, _ = e.challenge(m, "worker", "worker-5")
	if vr, r := e.verify(e.verifyBody(m, ch)); vr == nil {
		t.Fatalf("enrolment: %s", r.body)
	}

	ch, _ = e.reattestChallenge(other, "worker", "worker-5")
	_, r = e.verify(e.verifyBody(other, ch))
	row("a re-attestation by another TPM naming an enrolled node", attest.ReasonNodeNameTaken, r)

	older, _ := e.reattestChallenge(m, "worker", "worker-5")
	olderBody := e.verifyBody(m, older)
	e.advance(time.Second)
	newer, _ := e.reattestChallenge(m, "worker", "worker-5")
	newerBody := e.verifyBody(m, newer)
	vr, r := e.verify(newerBody)
	if vr == nil || vr.Reattest == nil || vr.ConfigToken != "" || vr.Record != "" || vr.NodeName != "worker-5" {
		t.Fatalf("the enrolled node's re-attestation: %+v %s", vr, r.body)
	}
	if vr.Reattest.Boots != 1 || vr.Reattest.IntervalSeconds != 3600 {
		t.Errorf("reattest answer %+v; want 1 boot, a 3600 s interval", vr.Reattest)
	}
	b, err := e.store.Binding(ctx, "worker-5")
	if err != nil || !b.Status.Passed || b.Status.Boots != 1 || len(b.Status.Claims) == 0 {
		t.Fatalf("status after a passed re-attestation: %+v, %v", b.Status, err)
	}
	before := b.Status
	_, r = e.verify(newerBody)
	row("a re-attestation's answer replayed", attest.ReasonSessionReused, r)
	_, r = e.verify(olderBody)
	row("an older re-attestation session answered after a newer one", attest.ReasonSessionReused, r)
	if b, _ := e.store.Binding(ctx, "worker-5"); !b.Status.LastAttempt.Equal(before.LastAttempt) {
		t.Fatal("a replayed re-attestation changed the status")
	}

	_, r = e.reattestChallenge(m, "worker", "")
	row("a re-attestation that names no node", attest.ReasonMalformedRequest, r)
	req, _ := m.collector.Request()
	body, _ := json.Marshal(api.ChallengeRequest{Kind: attest.KindTPM, Pool: "worker", KubeletPublicKey: m.keyDER, NodeName: "worker-5", Purpose: "promote", Request: api.Message(req)})
	r = e.do("POST", e.secure.URL+api.PathChallenge, body, map[string]string{"Content-Type": "application/json"})
	row("an attestation with an unknown purpose", attest.ReasonMalformedRequest, r)

	// A re-attestation releases nothing: there is no token to fetch with.
	if recs, _ := e.store.RecordsForNode(ctx, "worker-5"); len(recs) != 1 {
		t.Fatalf("%d records for worker-5; re-attestations write none", len(recs))
	}
}
