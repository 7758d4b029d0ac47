package systemtest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/render"
)

// examplesScript is the integrators' example this test runs as it ships.
const examplesScript = "../deploy/examples/tpm2-tools-attest.sh"

// toolsMachine is a swtpm with the vendor's EK certificate whose PCRs hold
// a real firmware log, free for tpm2-tools (swtpm serves one client).
func toolsMachine(t *testing.T, s *server) (tcti, logFile string) {
	t.Helper()
	for _, bin := range []string{"tpm2_createek", "tpm2_createak", "tpm2_activatecredential", "tpm2_quote", "jq", "curl", "openssl"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: install tpm2-tools, jq, curl and openssl (make deps)", bin)
		}
	}
	state := filepath.Join(t.TempDir(), "tpm")
	if err := s.man.Provision(context.Background(), state); err != nil {
		t.Fatal(err)
	}
	p, err := swtpm.Start(context.Background(), state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	log := firmwaretestdata.MustLog("rhel8-uefi")
	ch, err := tpm.DialSocket("tcp", p.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tpmtest.ExtendLog(ch, log); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	logFile = filepath.Join(t.TempDir(), "binary_bios_measurements")
	if err := os.WriteFile(logFile, log, 0o600); err != nil {
		t.Fatal(err)
	}
	return "swtpm:host=127.0.0.1,port=" + strconv.Itoa(p.Port), logFile
}

// runScript runs the example script with the settings env and returns its
// output and exit status.
func runScript(t *testing.T, env ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	script, err := filepath.Abs(examplesScript)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = t.TempDir()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), 0
}

// TestTPM2ToolsScriptAttacks runs the integrators' example script — the
// whole protocol with tpm2-tools, curl, openssl and jq: tpm2_createek,
// tpm2_createak (no creation data, a TPM2B public area),
// tpm2_activatecredential, tpm2_quote over the SHA-1 and SHA-256 banks —
// against swtpm and the real server, to the full config; and a quote of
// the SHA-1 bank alone, which the pool's policy refuses.
func TestTPM2ToolsScriptAttacks(t *testing.T) {
	s := startServer(t, nil)
	bundle := filepath.Join(s.stateDir, "certs", "current", certs.CABundleFileName)
	base := func(tcti, logFile, out string) []string {
		return []string{"NODEPROOF_SERVER=" + s.url, "NODEPROOF_CA=" + bundle, "NODEPROOF_POOL=worker",
			"TPM2TOOLS_TCTI=" + tcti, "EVENT_LOG=" + logFile, "NODEPROOF_OUT=" + out}
	}

	tcti, logFile := toolsMachine(t, s)
	out := filepath.Join(t.TempDir(), "config.ign")
	console, code := runScript(t, append(base(tcti, logFile, out), "NODEPROOF_NODE=tools-1")...)
	if code != 0 {
		t.Fatalf("the script: exit %d\n%s\n%s", code, console, s.log)
	}
	if !strings.Contains(console, "attested: node tools-1, pool worker") {
		t.Errorf("console:\n%s", console)
	}
	cfg, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got := cachedFiles(t, cfg); got[render.KubeconfigPath] == "" {
		t.Fatalf("the script did not get the full config")
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("config file %v %v: it holds secrets", fi, err)
	}

	tcti, logFile = toolsMachine(t, s)
	console, code = runScript(t, append(base(tcti, logFile, filepath.Join(t.TempDir(), "c.ign")),
		"NODEPROOF_NODE=tools-2", "NODEPROOF_QUOTE_BANKS=sha1:0,1,2,3,4,5,6,7,8,9")...)
	got := "exit " + strconv.Itoa(code)
	if code == 3 && strings.Contains(console, `"reason":"`+string(attest.ReasonPolicySHA1)+`"`) {
		got = string(attest.ReasonPolicySHA1)
	}
	attacktable.Check(t, "TPM interop", "tpm2-tools: a quote of the SHA-1 bank alone", string(attest.ReasonPolicySHA1), got)
}
