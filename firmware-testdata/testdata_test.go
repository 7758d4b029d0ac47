package firmwaretestdata

import (
	"reflect"
	"testing"
)

// TestExpectedSecureBoot: the committed expectations of every log whose
// SHA-256 events replay are what ReadSecureBoot reads from it (so a
// changed log or expectation is caught here, not only by the verifier's
// test), and a log with Secure Boot on names a signer for each boot
// application.
func TestExpectedSecureBoot(t *testing.T) {
	logs, err := Logs()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range logs {
		if !l.Expected.SHA256 || !l.Expected.SwTPMReplay {
			continue
		}
		t.Run(l.Name, func(t *testing.T) {
			got := l.Expected
			if err := got.ReadSecureBoot(l.Raw); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, l.Expected) {
				t.Errorf("read %+v\ncommitted %+v", got, l.Expected)
			}
			if l.Expected.SecureBoot == "on" && (len(l.Expected.Signers) != len(l.Expected.BootApplications) || len(l.Expected.Authorities) == 0) {
				t.Errorf("Secure Boot on, %d signers for %d applications", len(l.Expected.Signers), len(l.Expected.BootApplications))
			}
		})
		n++
	}
	if n < 15 {
		t.Fatalf("%d replayable SHA-256 logs; firmware-testdata has more", n)
	}
}
