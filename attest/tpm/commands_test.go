package tpm_test

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// commandCounter passes a TPM's commands through and counts them by
// command code (a command's header: tag, size, then the code).
type commandCounter struct {
	tpm.Channel
	counts map[tpm2.TPMCC]int
	// keys counts the keys made (CreatePrimary, Create) by algorithm:
	// "RSA", "ECC".
	keys map[string]int
}

func (c *commandCounter) Write(p []byte) (int, error) {
	if len(p) >= 10 {
		cc := tpm2.TPMCC(binary.BigEndian.Uint32(p[6:10]))
		c.counts[cc]++
		if cc == tpm2.TPMCCCreatePrimary || cc == tpm2.TPMCCCreate {
			c.keys[keyAlgorithm(p)]++
		}
	}
	return c.Channel.Write(p)
}

// keyAlgorithm reads the type of the key a CreatePrimary or Create command
// makes: after the header, the one parent handle, the authorization area
// (its size first) and inSensitive (a TPM2B), inPublic's TPMT_PUBLIC
// starts with its algorithm.
func keyAlgorithm(p []byte) string {
	off := 10 + 4
	if len(p) < off+4 {
		return "?"
	}
	off += 4 + int(binary.BigEndian.Uint32(p[off:]))
	if len(p) < off+2 {
		return "?"
	}
	off += 2 + int(binary.BigEndian.Uint16(p[off:]))
	if len(p) < off+4 {
		return "?"
	}
	switch binary.BigEndian.Uint16(p[off+2:]) {
	case uint16(tpm2.TPMAlgRSA):
		return "RSA"
	case uint16(tpm2.TPMAlgECC):
		return "ECC"
	}
	return "?"
}

// Close leaves the TPM open: the test closes it.
func (c *commandCounter) Close() error { return nil }

// take returns the counts so far and starts again.
func (c *commandCounter) take() (map[tpm2.TPMCC]int, map[string]int) {
	out, keys := c.counts, c.keys
	c.counts, c.keys = map[tpm2.TPMCC]int{}, map[string]int{}
	return out, keys
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
// issues for an enrolment on a TPM it has never used and for the
// re-attestations after it, each answered and verified honestly: with a
// new AK each run (an agent that keeps none), with the kept AK and its
// ticket (the agent's --ak-state), and with the kept AK whose ticket no
// longer holds. It fails when a run issues a command it did not, or more
// of one: the slow ones on a real TPM (key generation: CreatePrimary,
// Create; the EK's RSA decryption: ActivateCredential) are what
// docs/benchmarks.md turns into time. Fewer is fine, and says so: lower
// the table.
func TestTPMCommandsPerAttestation(t *testing.T) {
	ca := newCA(t, "Vendor")
	counter := &commandCounter{counts: map[tpm2.TPMCC]int{}, keys: map[string]int{}}
	m := newMachineVia(t, ca, firmwaretestdata.MustLog("rhel8-uefi"), func(ch tpm.Channel) tpm.Channel {
		counter.Channel = ch
		return counter
	})
	v := newVerifier(t, ca, nil)
	var kept []byte
	run := func(name string, ticket []byte, wantCredential bool) (map[tpm2.TPMCC]int, map[string]int, *attest.Claims) {
		t.Helper()
		claims, ch, err := attestTicketed(t, m, v, ticket)
		if err != nil {
			t.Fatalf("%s: honest attestation refused: %v", name, err)
		}
		if got := len(ch.Credential) > 0; got != wantCredential {
			t.Fatalf("%s: the challenge carries a credential: %v, want %v", name, got, wantCredential)
		}
		if kept, err = m.collector.KeepAK(); err != nil {
			t.Fatalf("%s: keep the AK: %v", name, err)
		}
		if err := m.collector.Close(); err != nil {
			t.Fatalf("%s: close: %v", name, err)
		}
		counts, keys := counter.take()
		return counts, keys, claims
	}
	reopen := func(o tpm.CollectorOptions) {
		t.Helper()
		var err error
		if m.collector, err = tpm.NewCollectorWith(counter, o); err != nil {
			t.Fatal(err)
		}
	}
	enrolment, enrolKeys, claims := run("enrolment", nil, true)
	if len(claims.Ticket) == 0 {
		t.Fatal("an attestation that activated a credential handed out no AK ticket")
	}
	reopen(tpm.CollectorOptions{})
	newAK, newAKKeys, _ := run("re-attestation with a new AK", nil, true)
	reopen(tpm.CollectorOptions{AK: kept})
	if ok, err := m.collector.KeptAK(); !ok || err != nil {
		t.Fatalf("the kept AK did not load: %v", err)
	}
	// The enrolment's ticket names the enrolment's AK, not this one (each
	// run before made a new AK): the kept AK activates a credential once.
	activated, activatedKeys, claims := run("re-attestation, kept AK, no ticket", nil, true)
	if len(claims.Ticket) == 0 {
		t.Fatal("the activation of a kept AK handed out no ticket")
	}
	reopen(tpm.CollectorOptions{AK: kept})
	ticketed, ticketedKeys, claims := run("re-attestation, kept AK and its ticket", claims.Ticket, false)
	if len(claims.Ticket) != 0 {
		t.Error("a ticketed attestation handed out another ticket: tickets would renew themselves without an activation")
	}
	m.collector = nil // closed: the machine's cleanup closes the simulator

	for _, tc := range []struct {
		name     string
		got      map[tpm2.TPMCC]int
		want     map[tpm2.TPMCC]int
		gotKeys  map[string]int
		wantKeys map[string]int
	}{
		// The RSA EK (the pool's tpm.ek), the ECC SRK, the ECC AK.
		{name: "enrolment", got: enrolment, want: wantEnrolment, gotKeys: enrolKeys, wantKeys: map[string]int{"RSA": 1, "ECC": 2}},
		{name: "re-attestation, a new AK", got: newAK, want: wantReattestation, gotKeys: newAKKeys, wantKeys: map[string]int{"ECC": 1}},
		{name: "re-attestation, the kept AK, no ticket", got: activated, want: wantKeptActivated, gotKeys: activatedKeys, wantKeys: map[string]int{}},
		{name: "re-attestation, the kept AK and its ticket", got: ticketed, want: wantKeptTicketed, gotKeys: ticketedKeys, wantKeys: map[string]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Logf("%s: %s; keys made: %v", tc.name, describe(tc.got), tc.gotKeys)
			if !maps.Equal(tc.gotKeys, tc.wantKeys) {
				t.Errorf("%s makes keys %v, want %v: an RSA key generation is the slowest command a TPM runs", tc.name, tc.gotKeys, tc.wantKeys)
			}
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
	// The kept AK, loaded (Load under the persisted SRK), whose ticket no
	// longer holds (expired, or the server's keys rotated): the credential
	// is activated again, no key is made.
	wantKeptActivated = map[tpm2.TPMCC]int{
		tpm2.TPMCCActivateCredential: 1, tpm2.TPMCCNVRead: 2, tpm2.TPMCCPolicySecret: 1, tpm2.TPMCCLoad: 1,
		tpm2.TPMCCQuote: 1, tpm2.TPMCCFlushContext: 2, tpm2.TPMCCNVReadPublic: 4, tpm2.TPMCCReadPublic: 5,
		tpm2.TPMCCStartAuthSession: 1, tpm2.TPMCCGetCapability: 5, tpm2.TPMCCPCRRead: 3,
	}
	// The kept AK and its ticket: the AK is loaded and quotes; no key
	// generation, no activation.
	wantKeptTicketed = map[tpm2.TPMCC]int{
		tpm2.TPMCCNVRead: 2, tpm2.TPMCCLoad: 1, tpm2.TPMCCQuote: 1, tpm2.TPMCCFlushContext: 1,
		tpm2.TPMCCNVReadPublic: 3, tpm2.TPMCCReadPublic: 4, tpm2.TPMCCGetCapability: 4, tpm2.TPMCCPCRRead: 3,
	}
)
