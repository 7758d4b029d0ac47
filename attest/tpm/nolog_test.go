package tpm_test

import (
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
)

// TestNoEventLog: evidence that carries no event log at all (a kernel
// booted without its EFI stub has none) is verified, establishes nothing
// about the boot and says the log was missing, so that policy refuses it
// for that (EventLogMissing) rather than for a state it cannot read; an
// event log that was sent is never "missing".
func TestNoEventLog(t *testing.T) {
	ca := newCA(t, "Vendor")
	for _, c := range []struct {
		name    string
		log     []byte
		missing bool
	}{
		{"none sent", nil, true},
		{"a real log", firmwaretestdata.MustLog("rhel8-uefi"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMachine(t, ca, c.log)
			claims, err := attestOnce(t, m, newVerifier(t, ca, nil))
			if err != nil {
				t.Fatal(err)
			}
			b := claims.TPM.Boot
			if b.LogMissing != c.missing {
				t.Errorf("LogMissing %v; want %v", b.LogMissing, c.missing)
			}
			if c.missing && (b.LogEvents != 0 || b.SecureBootKnown || len(b.BootApplications) != 0) {
				t.Errorf("no log established %+v", b)
			}
		})
	}
}

// TestWithheldEventLogAttack: root on a machine that booted with Secure
// Boot off sends its quote without the event log, hoping a pool that needs
// Secure Boot reads "unknown" more kindly than "off". The quote verifies
// (the PCRs are what they are); the pool refuses it for the missing log.
func TestWithheldEventLogAttack(t *testing.T) {
	ca := newCA(t, "Vendor")
	m := newMachine(t, ca, firmwaretestdata.MustLog("ubuntu-2104-no-secure-boot"))
	m.ch.log = nil // the PCRs hold the boot; the evidence carries no log
	claims, err := attestOnce(t, m, newVerifier(t, ca, nil))
	if err == nil {
		pol := workerPolicy(t)
		err = pol.Evaluate("worker", claims)
	}
	attacktable.CheckRefusal(t, "TPM", "a machine booted with Secure Boot off withholds its event log", attest.ReasonEventLogMissing, err)
}
