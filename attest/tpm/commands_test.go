package tpm_test

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// commandCounter passes a TPM's commands through and counts them by
// command code (a command's header: tag, size, then the code).
type commandCounter struct {
	tpm.Channel
	counts map[tpm2.TPMCC]int
}

func (c *commandCounter) Write(p []byte) (int, error) {
	if len(p) >= 10 {
		c.counts[tpm2.TPMCC(binary.BigEndian.Uint32(p[6:10]))]++
	}
	return c.Channel.Write(p)
}

// Close leaves the TPM open: the test closes it.
func (c *commandCounter) Close() error { return nil }

// take returns the counts so far and starts again.
func (c *commandCounter) take() map[tpm2.TPMCC]int {
	out := c.counts
	c.counts = map[tpm2.TPMCC]int{}
	return out
}

// commandNames names the command codes the agent's TPM evidence issues.
var commandNames = map[tpm2.TPMCC]string{
	tpm2.TPMCCCreatePrimary: "CreatePrimary", tpm2.TPMCCCreate: "Create", tpm2.TPMCCLoad: "Load",
	tpm2.TPMCCActivateCredential: "ActivateCredential", tpm2.TPMCCQuote: "Quote", tpm2.TPMCCPCRRead: "PCR_Read",
	tpm2.TPMCCGetCapability: "GetCapability", tpm2.TPMCCReadPublic: "ReadPublic", tpm2.TPMCCNVReadPublic: "NV_ReadPublic",
	tpm2.TPMCCNVRead: "NV_Read", tpm2.TPMCCFlushContext: "FlushContext", tpm2.TPMCCEvictControl: "EvictControl",
	tpm2.TPMCCStartAuthSession: "StartAuthSession", tpm2.TPMCCPolicySecret: "PolicySecret",
	tpm2.TPMCCCertifyCreation: "CertifyCreation", tpm2.TPMCCCertify: "Certify", tpm2.TPMCCGetRandom: "GetRandom",
	tpm2.TPMCCContextSave: "ContextSave", tpm2.TPMCCContextLoad: "ContextLoad", tpm2.TPMCCSign: "Sign",
}

func commandName(cc tpm2.TPMCC) string {
	if n, ok := commandNames[cc]; ok {
		return n
	}
	return fmt.Sprintf("0x%08x", uint32(cc))
}

// describe writes counts in command-code order: "CreatePrimary 2, …".
func describe(counts map[tpm2.TPMCC]int) string {
	var parts []string
	for _, cc := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s %d", commandName(cc), counts[cc]))
	}
	return strings.Join(parts, ", ")
}

// TestTPMCommandsPerAttestation counts, by command code, the TPM commands
// the agent's TPM evidence (tpm.Collector: open, Request, Answer, Close)
// issues for an enrolment on a TPM it has never used and for a
// re-attestation after it (the agent runs the same collector at every
// boot), each answered and verified honestly. It fails when a run issues
// a command it did not, or more of one: the slow ones on a real TPM (key
// generation: CreatePrimary, Create) are what docs/benchmarks.md turns
// into time. Fewer is fine, and says so: lower the table.
func TestTPMCommandsPerAttestation(t *testing.T) {
	ca := newCA(t, "Vendor")
	counter := &commandCounter{counts: map[tpm2.TPMCC]int{}}
	m := newMachineVia(t, ca, firmwaretestdata.MustLog("rhel8-uefi"), func(ch tpm.Channel) tpm.Channel {
		counter.Channel = ch
		return counter
	})
	v := newVerifier(t, ca, nil)
	run := func(name string) map[tpm2.TPMCC]int {
		t.Helper()
		if _, err := attestOnce(t, m, v); err != nil {
			t.Fatalf("%s: honest attestation refused: %v", name, err)
		}
		if err := m.collector.Close(); err != nil {
			t.Fatalf("%s: close: %v", name, err)
		}
		return counter.take()
	}
	enrolment := run("enrolment")
	var err error
	if m.collector, err = tpm.NewCollector(counter); err != nil {
		t.Fatal(err)
	}
	reattestation := run("re-attestation")
	m.collector = nil // closed: the machine's cleanup closes the simulator

	for _, tc := range []struct {
		name string
		got  map[tpm2.TPMCC]int
		want map[tpm2.TPMCC]int
	}{
		{name: "enrolment", got: enrolment, want: wantEnrolment},
		{name: "re-attestation", got: reattestation, want: wantReattestation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Logf("%s: %s", tc.name, describe(tc.got))
			for cc, n := range tc.got {
				if n > tc.want[cc] {
					t.Errorf("%s issues %d %s (at most %d before): a command more on every boot; if it is needed, raise the table and docs/benchmarks.md's cost", tc.name, n, commandName(cc), tc.want[cc])
				}
			}
			for cc, n := range tc.want {
				if tc.got[cc] < n {
					t.Logf("%s issues %d %s, fewer than the table's %d: lower the table", tc.name, tc.got[cc], commandName(cc), n)
				}
			}
		})
	}
}

// The TPM commands of an enrolment and of a re-attestation, as
// TestTPMCommandsPerAttestation counted them (docs/benchmarks.md).
var (
	// A TPM the agent has never used: the EK and the storage root key are
	// made (CreatePrimary) and persisted (EvictControl), then the AK is
	// made under the SRK (Create, Load, CertifyCreation).
	wantEnrolment = map[tpm2.TPMCC]int{
		tpm2.TPMCCEvictControl: 2, tpm2.TPMCCCreatePrimary: 2, tpm2.TPMCCActivateCredential: 1,
		tpm2.TPMCCCertifyCreation: 1, tpm2.TPMCCNVRead: 2, tpm2.TPMCCPolicySecret: 1, tpm2.TPMCCCreate: 1,
		tpm2.TPMCCLoad: 1, tpm2.TPMCCQuote: 1, tpm2.TPMCCFlushContext: 4, tpm2.TPMCCNVReadPublic: 5,
		tpm2.TPMCCReadPublic: 5, tpm2.TPMCCStartAuthSession: 1, tpm2.TPMCCGetCapability: 6, tpm2.TPMCCPCRRead: 3,
	}
	// Every boot after: the persisted EK and SRK are read, not made; a new
	// AK is still made each time (Create).
	wantReattestation = map[tpm2.TPMCC]int{
		tpm2.TPMCCActivateCredential: 1, tpm2.TPMCCCertifyCreation: 1, tpm2.TPMCCNVRead: 2,
		tpm2.TPMCCPolicySecret: 1, tpm2.TPMCCCreate: 1, tpm2.TPMCCLoad: 1, tpm2.TPMCCQuote: 1,
		tpm2.TPMCCFlushContext: 2, tpm2.TPMCCNVReadPublic: 4, tpm2.TPMCCReadPublic: 5,
		tpm2.TPMCCStartAuthSession: 1, tpm2.TPMCCGetCapability: 5, tpm2.TPMCCPCRRead: 3,
	}
)
