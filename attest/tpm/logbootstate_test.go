package tpm_test

import (
	"crypto"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// TestLogBootState: a log read by itself (policy learn) tells the same
// boot as the verifier establishes from it behind a quote, for every real
// firmware log that a TPM reproduces; a log that does not parse, and an
// empty one, are refused.
func TestLogBootState(t *testing.T) {
	logs, err := firmwaretestdata.Logs()
	if err != nil {
		t.Fatal(err)
	}
	learned := 0
	for _, l := range logs {
		t.Run(l.Name, func(t *testing.T) {
			bs, err := tpm.LogBootState(l.Raw, crypto.SHA256)
			switch {
			case !l.Expected.Parses:
				wantReason(t, err, attest.ReasonEventLogInvalid)
			case l.Expected.SHA256 && l.Expected.SwTPMReplay:
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				checkBoot(t, &attest.Claims{TPM: &attest.TPMClaims{PCRBank: "sha256", Boot: bs}}, l.Expected)
				learned++
			}
		})
	}
	if learned < 10 {
		t.Errorf("learned from %d real logs; want most of them", learned)
	}
	if _, err := tpm.LogBootState(nil, crypto.SHA256); err == nil {
		t.Error("an empty log: no error")
	}
	if _, err := tpm.LogBootState(firmwaretestdata.MustLog("rhel8-uefi"), crypto.SHA512); err == nil {
		t.Error("bank SHA-512: no error")
	}
}
