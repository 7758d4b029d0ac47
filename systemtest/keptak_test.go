package systemtest_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/certs"
)

// TestKeptAKReattestation: the agent's --ak-state, end to end on swtpm and
// the real server. The first re-attestation makes the AK it keeps and
// activates a credential (the server returns a ticket); the next ones,
// across reboots, load the kept AK and quote, with no credential; a
// TPM2_Clear destroys the kept AK, so the agent makes a new one and
// proves it with the EK, and the server sees the TPM's reset count go
// back (TPMClockRollback): a reset TPM is still detected.
func TestKeptAKReattestation(t *testing.T) {
	ctx := context.Background()
	rhel8 := firmwaretestdata.MustLog("rhel8-uefi")
	s := startServer(t, nil)
	bundle, err := os.ReadFile(filepath.Join(s.stateDir, "certs", "current", certs.CABundleFileName))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	logFile, keyFile := filepath.Join(dir, "eventlog"), filepath.Join(dir, "kubelet.key")
	akFile, stateFile := filepath.Join(dir, "tpm-ak.json"), filepath.Join(dir, "reattest.json")
	if err := os.WriteFile(logFile, rhel8, 0o600); err != nil {
		t.Fatal(err)
	}
	m := bootedMachine(t, s.man, rhel8)
	var console bytes.Buffer
	if err := agent.Run(ctx, agent.Config{
		Server: s.url, CABundle: bundle, Pool: "worker", NodeName: "kept-0", Evidence: agent.TPMEvidence{Collector: m.Collector},
		KubeletKeyPath: keyFile, Mode: agent.ModePointer, IgnitionDir: t.TempDir(), Console: &console,
	}); err != nil {
		t.Fatalf("enrolment: %v\n%s", err, console.String())
	}
	m.Collector.Close()
	m.Collector = nil

	// reattest runs the agent's re-attestation as nodeproof-agent
	// --mode=reattest does: the TPM opened by the source, the AK kept in
	// akFile. It returns the refusal reason ("" passed), the credentials
	// the TPM activated and the console.
	boot := 0
	reattest := func(name string) (attest.Reason, int, string) {
		t.Helper()
		var console bytes.Buffer
		ev, closer, err := agent.Sources()[attest.KindTPM](ctx, agent.SourceOptions{
			TPMPath: "tcp:" + m.TPM.Addr, EventLog: logFile, AKState: akFile, Console: &console,
		})
		if err != nil {
			t.Fatalf("%s: open the TPM: %v", name, err)
		}
		defer closer.Close()
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		err = agent.Reattest(rctx, agent.ReattestConfig{
			Server: s.url, CABundle: bundle, Pool: "worker", NodeName: "kept-0", Evidence: ev,
			KubeletKeyPath: keyFile, StatePath: stateFile, Force: true, Console: &console,
			BootID: func() (string, error) { return "boot-" + string(rune('a'+boot)), nil },
		})
		t.Logf("%s:\n%s", name, console.String())
		if err != nil && refusalReason(err) == "" {
			t.Fatalf("%s: %v", name, err)
		}
		return refusalReason(err), closer.(*tpm.Collector).Activations(), console.String()
	}
	reboot := func() {
		t.Helper()
		if err := m.Reboot(ctx, rhel8); err != nil {
			t.Fatal(err)
		}
		boot++
	}

	for _, tc := range []struct {
		name            string
		before          func()
		wantReason      attest.Reason
		wantActivations int
		wantConsole     string
	}{
		{name: "the first re-attestation makes the AK it keeps and activates its credential", wantActivations: 1},
		{name: "the next, same boot: the kept AK and its ticket, no credential"},
		{name: "after a reboot: the kept AK still loads (the SRK is persistent)", before: reboot},
		{name: "after another reboot", before: reboot},
		{name: "after TPM2_Clear: the kept AK is gone, a new one is proven with the EK, and the reset count went back",
			before: func() {
				ch, err := tpm.DialSocket("tcp", m.TPM.Addr, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer ch.Close()
				if err := tpm2.Clear(ch, tpm2.HandlePlatform, tpm2.AuthCommand{Session: tpm2.HandlePasswordSession, Attributes: tpm2.AttrContinueSession}); err != nil {
					t.Fatalf("TPM2_Clear: %v", err)
				}
			},
			wantReason: attest.ReasonTPMClockRollback, wantActivations: 1, wantConsole: "did not load"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != nil {
				tc.before()
			}
			reason, activations, out := reattest(tc.name)
			if tc.wantReason != "" {
				attacktable.Check(t, "lifetime", "a node whose TPM was cleared (TPM2_Clear) re-attests with a new AK", string(tc.wantReason), string(reason))
			} else if reason != "" {
				t.Errorf("refused %s", reason)
			}
			if activations != tc.wantActivations {
				t.Errorf("%d credentials activated, want %d", activations, tc.wantActivations)
			}
			if tc.wantConsole != "" && !strings.Contains(out, tc.wantConsole) {
				t.Errorf("the console does not say %q", tc.wantConsole)
			}
		})
	}
	if fi, err := os.Stat(akFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the kept AK file: %v, %v; want mode 0600", fi, err)
	}
}
