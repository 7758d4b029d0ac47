package tpm_test

import (
	"testing"

	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
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
