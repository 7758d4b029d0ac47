package tpm_test

import (
	"testing"

	"github.com/nodeproof/nodeproof/attest/tpm"
)

// TestVouchedShared: the checks the vouched-for AK kinds share refuse what
// they should and name the kind's package.
func TestVouchedShared(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		wantErr string
	}{
		{"PCRs 0-23 are required PCRs", tpm.CheckRequiredPCRs("x", []int{0, 7, 23}), ""},
		{"no required PCRs is none to check", tpm.CheckRequiredPCRs("x", nil), ""},
		{"PCR 24 is no PCR", tpm.CheckRequiredPCRs("x", []int{0, 24}), "x: required PCR 24 out of range"},
		{"a negative PCR is none", tpm.CheckRequiredPCRs("x", []int{-1}), "x: required PCR -1 out of range"},
		{"a 32-byte nonce", (&tpm.NonceChallenge{Nonce: make([]byte, 32)}).Check("y"), ""},
		{"a short nonce", (&tpm.NonceChallenge{Nonce: make([]byte, 31)}).Check("y"), "y: the challenge's nonce is not 32 bytes"},
		{"no challenge", (*tpm.NonceChallenge)(nil).Check("y"), "y: the challenge's nonce is not 32 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			switch {
			case tc.wantErr == "" && tc.err != nil:
				t.Fatalf("refused: %v", tc.err)
			case tc.wantErr != "" && (tc.err == nil || tc.err.Error() != tc.wantErr):
				t.Fatalf("err %v, want %q", tc.err, tc.wantErr)
			}
		})
	}
}
