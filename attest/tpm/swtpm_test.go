package tpm_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/swtpm"
)

// One manufacturer (swtpm's local CA) for the whole test binary.
var (
	manOnce sync.Once
	man     *swtpm.Manufacturer
	manErr  error
	manDir  string
)

func manufacturer(t *testing.T) *swtpm.Manufacturer {
	t.Helper()
	manOnce.Do(func() {
		manDir, manErr = os.MkdirTemp("", "nodeproof-swtpm-ca-")
		if manErr == nil {
			man, manErr = swtpm.NewManufacturer(manDir)
		}
	})
	if manErr != nil {
		t.Fatalf("swtpm manufacturer: %v", manErr)
	}
	return man
}

// swMachine is a node whose TPM is a swtpm process with a vendor EK
// certificate, its PCRs holding log.
type swMachine struct {
	tpm       *swtpm.TPM
	collector *tpm.Collector
	keySHA    []byte
}

func newSwMachine(t *testing.T, log []byte, banks ...string) *swMachine {
	t.Helper()
	m, err := manufacturer(t).NewMachine(context.Background(), t.TempDir(), log, banks...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &swMachine{tpm: m.TPM, collector: m.Collector, keySHA: m.KubeletSHA}
}

func swtpmVerifier(t *testing.T, inv *tpm.Inventory) *tpm.Verifier {
	t.Helper()
	dir, err := manufacturer(t).RootsDir()
	if err != nil {
		t.Fatal(err)
	}
	set, err := tpm.LoadRootSet("swtpm-localca", dir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tpm.NewVerifier(tpm.Options{Roots: []tpm.RootSet{set}, Inventory: inv, Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func swAttest(t *testing.T, m *swMachine, v *tpm.Verifier) (*attest.Claims, error) {
	t.Helper()
	req, err := m.collector.Request()
	if err != nil {
		t.Fatal(err)
	}
	ch, sess, err := v.Challenge("worker", m.keySHA, req)
	if err != nil {
		return nil, err
	}
	ev, err := m.collector.Answer(ch, m.keySHA)
	if err != nil {
		t.Fatalf("answer: %v", err)
	}
	return v.Verify(sess, ev)
}

func TestSwtpmVendorEKCertificate(t *testing.T) {
	m := newSwMachine(t, firmwaretestdata.MustLog("rhel8-uefi"))
	claims, err := swAttest(t, m, swtpmVerifier(t, nil))
	if err != nil {
		t.Fatalf("honest swtpm attestation refused: %v", err)
	}
	if claims.TPM.EKTrust != "ca:swtpm-localca" {
		t.Errorf("EK trust = %q, want ca:swtpm-localca", claims.TPM.EKTrust)
	}
	if !claims.TPM.Boot.SecureBootKnown || !claims.TPM.Boot.SecureBoot {
		t.Errorf("secure boot = known %v on %v, want known and on", claims.TPM.Boot.SecureBootKnown, claims.TPM.Boot.SecureBoot)
	}
	if claims.TPM.PCRBank != "sha256" || len(claims.TPM.Boot.BootApplications) != 3 {
		t.Errorf("bank %s, %d boot applications; want sha256 and 3", claims.TPM.PCRBank, len(claims.TPM.Boot.BootApplications))
	}
}

func TestSwtpmInventoryWithoutRoots(t *testing.T) {
	m := newSwMachine(t, nil)
	req, err := m.collector.Request()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(req.EKPublic)
	inv, err := tpm.NewInventory([]tpm.InventoryEntry{{EKSHA256: hex.EncodeToString(sum[:]), NodeName: "rack1-node7", Addresses: []string{"10.0.0.7"}}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := tpm.NewVerifier(tpm.Options{Inventory: inv, Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	claims, err := swAttest(t, m, v)
	if err != nil {
		t.Fatalf("inventory attestation refused: %v", err)
	}
	if claims.TPM.EKTrust != "inventory" || claims.NodeName != "rack1-node7" {
		t.Errorf("trust %q node %q; want inventory and rack1-node7", claims.TPM.EKTrust, claims.NodeName)
	}
	if claims.TPM.Boot.SecureBootKnown || claims.TPM.Boot.LogEvents != 0 {
		t.Errorf("an empty log established boot state: %+v", claims.TPM.Boot)
	}
	// The same TPM is unknown to a verifier whose inventory lacks it.
	_, err = swAttest(t, m, swtpmVerifierNoRoots(t))
	wantReason(t, err, attest.ReasonEKUntrusted)
}

func swtpmVerifierNoRoots(t *testing.T) *tpm.Verifier {
	v, err := tpm.NewVerifier(tpm.Options{Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// An attacker holds a genuine EK certificate of TPM A (a victim) and an AK
// of its own TPM B: the challenge passes, but only TPM A could activate
// the credential, and it does not hold B's AK.
func TestSwtpmAKFromAnotherTPM(t *testing.T) {
	victim := newSwMachine(t, nil)
	attacker := newSwMachine(t, nil)
	v := swtpmVerifier(t, nil)
	vreq, err := victim.collector.Request()
	if err != nil {
		t.Fatal(err)
	}
	areq, err := attacker.collector.Request()
	if err != nil {
		t.Fatal(err)
	}
	forged := *vreq
	forged.AK = areq.AK
	ch, sess, err := v.Challenge("worker", attacker.keySHA, &forged)
	if err != nil {
		t.Fatalf("challenge refused early (%v); the attack is only caught at activation", err)
	}
	if _, err := attacker.collector.Answer(ch, attacker.keySHA); err == nil {
		t.Fatal("the attacker's TPM activated a credential made for another TPM's EK")
	}
	// It can still send evidence with a guessed secret and a quote of its own.
	ch2, _, err := v.Challenge("worker", attacker.keySHA, areq)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := attacker.collector.Answer(ch2, attacker.keySHA)
	if err != nil {
		t.Fatal(err)
	}
	ev.ActivationSecret = make([]byte, 32)
	_, err = v.Verify(sess, ev)
	wantReason(t, err, attest.ReasonActivation)
	var d *attest.Denial
	if !errors.As(err, &d) {
		t.Fatal("not a Denial")
	}
}
