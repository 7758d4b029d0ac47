package tpm_test

import (
	"encoding/json"
	"testing"

	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

func TestAttestRHEL8OnSimulator(t *testing.T) {
	ca := newCA(t, "Vendor")
	m := newMachine(t, ca, firmwaretestdata.MustLog("rhel8-uefi"))
	v := newVerifier(t, ca, nil)
	claims, err := attestOnce(t, m, v)
	if err != nil {
		t.Fatalf("honest attestation refused: %v", err)
	}
	b, _ := json.MarshalIndent(claims, "", " ")
	t.Logf("%s", b)
}
