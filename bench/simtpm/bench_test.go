package simtpm

import (
	"testing"

	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// BenchmarkRequestAnswer is the node side of one attestation on the model:
// Request, then Answer (credential activation: one RSA-2048 OAEP decrypt;
// one ECDSA P-256 quote signature; copying 24 PCR values). This is the CPU
// the scale benchmark's load generator spends per TPM machine, to subtract
// from or report beside the server's.
func BenchmarkRequestAnswer(b *testing.B) {
	ca := newVendor(b)
	m := newModel(b, ca, firmwaretestdata.MustLog("rhel8-uefi"))
	v := modelVerifier(b, ca)
	key := testenv.KubeletKeySHA256(b)
	req, err := m.Request()
	if err != nil {
		b.Fatal(err)
	}
	ch, _, err := v.Challenge("worker", key, req)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Request(); err != nil {
			b.Fatal(err)
		}
		if _, err := m.Answer(ch, key); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewMachine is one machine's set-up with a pre-generated EK key
// (EKKeys): EK certificate, AK, creation attestation, and the replay of
// the 105-event RHEL 8 log (NewMachines replays a log once for all).
func BenchmarkNewMachine(b *testing.B) {
	ca := newVendor(b)
	log := firmwaretestdata.MustLog("rhel8-uefi")
	key := ekKey(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewMachine(ca, log, nil, WithEKKey(key)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGenerateEKKey is what EKKeys saves per machine and run: one
// RSA-2048 key generation (one core).
func BenchmarkGenerateEKKey(b *testing.B) {
	for b.Loop() {
		if _, err := GenerateEKKeys(1); err != nil {
			b.Fatal(err)
		}
	}
}
