package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/attest/tpm/swtpm"
	"github.com/nodeproof/nodeproof/fsutil"
)

// A dev TPM's directory (--dir): the TPM's state, the event log its PCRs
// were extended from (what the agent sends), and its EK's SHA-256.
const (
	devTPMState   = "state"
	devTPMLog     = "event-log.bin"
	devTPMEKHash  = "ek.sha256"
	devTPMDefPort = 2321 // the TCG reference simulator's, as tpm2-tools expect
)

// devTPMCommand is `nodeproof dev tpm`: a software TPM to try nodeproof
// without TPM hardware (attest/tpm/swtpm). docs/operations.md walks
// through it.
func devTPMCommand() command {
	return command{name: "dev tpm",
		summary: "a software TPM (swtpm) to try a machine without TPM hardware: an EK certificate from a local test CA, PCRs extended from an event log",
		about: "A software TPM proves nothing about a machine: trust its local EK CA in a test pool only, never beside\n" +
			"real machines. Each machine is a directory (--dir): init once, then start (its boot), reboot, stop.",
		actions: []action{
			{name: "init", run: cmdDevTPMInit,
				summary: "make the local EK CA (once, in --ca) and a TPM in --dir with EK certificates from it; print the EK roots and the EK's SHA-256"},
			{name: "start", run: cmdDevTPMStart,
				summary: "run --dir's TPM as a daemon on 127.0.0.1:--port and extend --event-log into its PCRs (the machine boots); print the agent's flags"},
			{name: "reboot", run: cmdDevTPMReboot,
				summary: "reset the running TPM (PCRs cleared, reset count up) and extend --event-log into its PCRs: the machine boots again"},
			{name: "stop", run: cmdDevTPMStop, summary: "stop --dir's TPM"},
		}}
}

// devDir is --dir, required.
func devDir(in *invocation) *string {
	return in.flags().String("dir", "", "the machine's directory: its TPM state, event log and EK hash (required)")
}

func cmdDevTPMInit(ctx context.Context, in *invocation) error {
	fs := in.flags()
	dir := devDir(in)
	ca := fs.String("ca", "", "the local EK CA's directory, shared by every dev TPM that one policy trusts (default: ek-ca beside --dir)")
	banks := fs.String("banks", "sha1,sha256", "the TPM's PCR banks")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	if *dir == "" {
		return in.usageError("--dir is required")
	}
	if *ca == "" {
		*ca = filepath.Join(filepath.Dir(filepath.Clean(*dir)), "ek-ca")
	}
	man, err := swtpm.NewManufacturer(*ca)
	if err != nil {
		return err
	}
	state := filepath.Join(*dir, devTPMState)
	if _, err := os.Stat(state); err == nil {
		return fmt.Errorf("%s holds a TPM already: remove --dir for a new one (a new EK is a new machine)", *dir)
	}
	if err := man.Provision(ctx, state, *banks); err != nil {
		return err
	}
	roots, err := man.RootsDir()
	if err != nil {
		return err
	}
	// The EK the agent presents: read through a collector, as the agent does.
	t, err := swtpm.Start(ctx, state)
	if err != nil {
		return err
	}
	sum, err := ekSHA256(t.Addr)
	t.Stop()
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(*dir, devTPMEKHash), []byte(sum+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(in.stdout, "TPM:       %s (RSA and ECC EKs, certificates from the local EK CA %s)\n", state, *ca)
	fmt.Fprintf(in.stdout, "EK SHA-256: %s (in %s)\n", sum, filepath.Join(*dir, devTPMEKHash))
	fmt.Fprintf(in.stdout, "  an EK inventory entry (trust.ekInventory): {ekSHA256: %s, nodeName: NODE}\n", sum)
	fmt.Fprintf(in.stdout, "EK roots:  %s\n", roots)
	fmt.Fprintf(in.stdout, "  a policy's trust.ekRoots entry: {name: dev, dir: %s} (a test pool only: anyone can run this CA)\n", roots)
	fmt.Fprintf(in.stdout, "next:      nodeproof dev tpm start --dir %s --event-log FILE\n", *dir)
	return nil
}

// ekSHA256 is the SHA-256 of the EK the agent would present (its PKIX DER,
// as EK inventories list it), read from the TPM at addr.
func ekSHA256(addr string) (string, error) {
	ch, err := tpm.DialSocket("tcp", addr, nil)
	if err != nil {
		return "", err
	}
	c, err := tpm.NewCollector(ch)
	if err != nil {
		ch.Close()
		return "", err
	}
	defer c.Close()
	req, err := c.Request()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(req.EKPublic)
	return hex.EncodeToString(sum[:]), nil
}

func cmdDevTPMStart(ctx context.Context, in *invocation) error {
	fs := in.flags()
	dir := devDir(in)
	port := fs.Int("port", devTPMDefPort, "the TPM's command port on 127.0.0.1 (its control port is the next one)")
	logFile := fs.String("event-log", "", "a TCG event log to extend into the PCRs, as the firmware of that boot would have (e.g. a real machine's binary_bios_measurements); empty: PCRs at their reset values")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	if *dir == "" {
		return in.usageError("--dir is required")
	}
	state := filepath.Join(*dir, devTPMState)
	if _, err := os.Stat(state); err != nil {
		return fmt.Errorf("no TPM in %s: nodeproof dev tpm init --dir %s first", *dir, *dir)
	}
	t, err := swtpm.StartDaemon(ctx, state, *port)
	if err != nil {
		return err
	}
	n, err := devBoot(t, *dir, *logFile)
	if err != nil {
		t.Stop()
		return err
	}
	fmt.Fprintf(in.stdout, "swtpm:  running on %s (control %d), pid %d, state %s\n", t.Addr, t.Port+1, t.PID(), state)
	devBooted(in.stdout, t, *dir, *logFile, n)
	return nil
}

func cmdDevTPMReboot(ctx context.Context, in *invocation) error {
	fs := in.flags()
	dir := devDir(in)
	logFile := fs.String("event-log", "", "the event log of this boot (empty: PCRs at their reset values)")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	if *dir == "" {
		return in.usageError("--dir is required")
	}
	t, err := swtpm.Attach(filepath.Join(*dir, devTPMState))
	if err != nil {
		return fmt.Errorf("%w: nodeproof dev tpm start --dir %s", err, *dir)
	}
	if err := t.Reboot(ctx); err != nil {
		return err
	}
	n, err := devBoot(t, *dir, *logFile)
	if err != nil {
		return err
	}
	fmt.Fprintf(in.stdout, "swtpm:  reset (TPM2_Shutdown, restarted on %s, pid %d)\n", t.Addr, t.PID())
	devBooted(in.stdout, t, *dir, *logFile, n)
	return nil
}

func cmdDevTPMStop(_ context.Context, in *invocation) error {
	dir := devDir(in)
	if _, err := in.exactly(0); err != nil {
		return err
	}
	if *dir == "" {
		return in.usageError("--dir is required")
	}
	t, err := swtpm.Attach(filepath.Join(*dir, devTPMState))
	if err != nil {
		return err
	}
	t.Stop()
	fmt.Fprintf(in.stdout, "swtpm on %s (pid %d) stopped\n", t.Addr, t.PID())
	return nil
}

// devBoot extends logFile into the freshly started TPM's PCRs and keeps
// the log in dir (what the agent sends with them); it returns the number
// of measurements.
func devBoot(t *swtpm.TPM, dir, logFile string) (int, error) {
	var log []byte
	if logFile != "" {
		var err error
		if log, err = os.ReadFile(logFile); err != nil {
			return 0, err
		}
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, devTPMLog), log, 0o644); err != nil {
		return 0, err
	}
	if len(log) == 0 {
		return 0, nil
	}
	ch, err := tpm.DialSocket("tcp", t.Addr, nil)
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	return swtpm.ExtendLog(ch, log)
}

// devBooted says what booted and how the agent reaches it.
func devBooted(w io.Writer, t *swtpm.TPM, dir, logFile string, n int) {
	if logFile == "" {
		fmt.Fprintln(w, "PCRs:   at their reset values (no --event-log: a policy that reads the boot refuses it)")
	} else {
		fmt.Fprintf(w, "PCRs:   %d measurements of %s extended (SHA-1 and SHA-256 banks)\n", n, logFile)
	}
	fmt.Fprintf(w, "agent:  nodeproof-agent --evidence tpm --tpm tcp:%s --event-log %s ...\n", t.Addr, filepath.Join(dir, devTPMLog))
}
