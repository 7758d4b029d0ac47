package tpm_test

import (
	"bytes"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// TestKeptAKAttacks: what a node with a kept AK and its ticket can still
// be made to prove, and what it cannot skip. The ticket spares only the
// credential activation, and only for the AK it names in the TPM it names
// (TestTicketHolds has each way a ticket fails); the quote, its binding
// and the boot are checked as ever; a TPM2_Clear destroys the kept AK, so
// the machine proves its AK again with the EK.
func TestKeptAKAttacks(t *testing.T) {
	ca := newCA(t, "Vendor")
	m := newMachine(t, ca, firmwaretestdata.MustLog("rhel8-uefi"))
	v := newVerifier(t, ca, nil)
	row := func(attack string, want attest.Reason, err error) {
		t.Helper()
		attacktable.CheckRefusal(t, "TPM", attack, want, err)
	}
	claims, _, err := attestTicketed(t, m, v, nil)
	if err != nil {
		t.Fatal(err)
	}
	ticket := claims.Ticket

	// The kept AK's ticket, with an activation secret the session did
	// not ask for (a node that cannot tell ticketed from not, or one
	// probing the verifier): refused, not ignored.
	req, _ := m.collector.Request()
	ch, sess, err := v.ChallengeTicketed("worker", m.keySHA, req, ticket)
	if err != nil || len(ch.Credential) != 0 {
		t.Fatalf("ticketed challenge: credential %d bytes, %v", len(ch.Credential), err)
	}
	ev, err := m.collector.Answer(ch, m.keySHA)
	if err != nil {
		t.Fatal(err)
	}
	ev.ActivationSecret = bytes.Repeat([]byte{7}, 32)
	_, err = v.Verify(sess, ev)
	row("an activation secret sent for a challenge the AK ticket spared the credential", attest.ReasonMalformed, err)

	// The ticket does not stand for the quote: a ticketed session answered
	// with another nonce's quote is refused as any other.
	_, sess2, err := v.ChallengeTicketed("worker", m.keySHA, req, ticket)
	if err != nil {
		t.Fatal(err)
	}
	ev.ActivationSecret = nil
	_, err = v.Verify(sess2, ev) // the quote binds the first session's nonce
	row("a ticketed session answered with the quote of another session", attest.ReasonQuoteBinding, err)

	// A verifier that takes no tickets makes a credential whatever the
	// node brings.
	noTickets, err := tpm.NewVerifier(tpm.Options{Roots: testRootSets(ca), Clock: clock, TicketTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	if ch, _, err := noTickets.ChallengeTicketed("worker", m.keySHA, req, ticket); err != nil || len(ch.Credential) == 0 {
		t.Errorf("a verifier with TicketTTL < 0 took a ticket (credential %d bytes, %v)", len(ch.Credential), err)
	}

	// TPM2_Clear: the storage hierarchy's seed changes and its persistent
	// keys go, so the kept AK no longer loads; the collector makes a new
	// AK, which the old ticket does not name: the credential is activated
	// again with the EK.
	kept, err := m.collector.KeepAK()
	if err != nil {
		t.Fatal(err)
	}
	if err := tpm2.Clear(m.ch, tpm2.HandlePlatform, tpm2.AuthCommand{Session: tpm2.HandlePasswordSession, Attributes: tpm2.AttrContinueSession}); err != nil {
		t.Fatalf("TPM2_Clear: %v", err)
	}
	// A real TPM's EK certificate is platform-written NV and survives the
	// clear; the simulator's test provisioning is the owner's and does not.
	if err := tpmtest.ProvisionEKCert(m.sim, m.ekCert.Raw); err != nil {
		t.Fatal(err)
	}
	identity := claims.Identity
	first := m.collector // the machine's cleanup closes it, and the simulator
	defer func() { m.collector = first }()
	if m.collector, err = tpm.NewCollectorWith(noClose{m.ch}, tpm.CollectorOptions{AK: kept}); err != nil {
		t.Fatal(err)
	}
	defer m.collector.Close()
	if ok, err := m.collector.KeptAK(); ok || err == nil {
		t.Fatalf("the kept AK loaded after TPM2_Clear (kept %v, %v)", ok, err)
	}
	claims, ch2, err := attestTicketed(t, m, v, ticket)
	if err != nil {
		t.Fatalf("after TPM2_Clear, an honest attestation: %v", err)
	}
	if len(ch2.Credential) == 0 {
		t.Error("after TPM2_Clear the old ticket spared the new AK the activation")
	}
	if len(claims.Ticket) == 0 {
		t.Error("no ticket for the new AK")
	}
	if claims.Identity != identity {
		t.Errorf("after TPM2_Clear the identity is %s, was %s: the EK (from the endorsement seed, which a clear keeps) should be the same", claims.Identity, identity)
	}
}
