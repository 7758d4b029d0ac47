// Package swtpm runs software TPMs (swtpm) for tests, the demo and the
// bench: a local "manufacturer" CA (swtpm_localca) that issues EK
// certificates, TPM state provisioned with swtpm_setup, and swtpm serving
// the TPM command protocol on a loopback TCP port.
package swtpm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/attest/tpm"
)

// InstallHint says how to get the binaries this package runs.
const InstallHint = "install them with: apt-get install -y swtpm swtpm-tools (make test does this)"

// Check reports whether swtpm and swtpm_setup are installed.
func Check() error {
	for _, bin := range []string{"swtpm", "swtpm_setup", "swtpm_localca"} {
		if _, err := exec.LookPath(bin); err != nil {
			if _, err2 := os.Stat("/usr/bin/" + bin); err2 != nil {
				return fmt.Errorf("%s not found; %s", bin, InstallHint)
			}
		}
	}
	return nil
}

// Manufacturer is a TPM vendor made of swtpm's local CA: a root and an
// issuing CA kept in Dir, used by swtpm_setup to sign EK certificates.
type Manufacturer struct {
	Dir string
}

// NewManufacturer prepares a manufacturer in dir (created if missing).
// Its CA keys are made by swtpm_localca on first use.
func NewManufacturer(dir string) (*Manufacturer, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "ca"), 0o700); err != nil {
		return nil, err
	}
	localca := fmt.Sprintf("statedir = %[1]s/ca\nsigningkey = %[1]s/ca/signkey.pem\nissuercert = %[1]s/ca/issuercert.pem\ncertserial = %[1]s/ca/certserial\n", dir)
	setup := fmt.Sprintf("create_certs_tool = %s\ncreate_certs_tool_config = %s/swtpm-localca.conf\ncreate_certs_tool_options = %s/swtpm-localca.options\nactive_pcr_banks = sha1,sha256\n",
		localcaPath(), dir, dir)
	options := "--platform-manufacturer nodeproof\n--platform-version 2.1\n--platform-model swtpm\n"
	for name, body := range map[string]string{"swtpm-localca.conf": localca, "swtpm_setup.conf": setup, "swtpm-localca.options": options} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return nil, err
		}
	}
	return &Manufacturer{Dir: dir}, nil
}

func localcaPath() string {
	if p, err := exec.LookPath("swtpm_localca"); err == nil {
		return p
	}
	return "/usr/bin/swtpm_localca"
}

// Provision writes a new TPM's state into stateDir: RSA and ECC EKs with
// certificates from this manufacturer, and the PCR banks named in banks
// (comma-separated; "sha1,sha256" when empty).
func (m *Manufacturer) Provision(ctx context.Context, stateDir string, banks ...string) error {
	pcrBanks := strings.Join(banks, ",")
	if pcrBanks == "" {
		pcrBanks = "sha1,sha256"
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return err
	}
	certs := filepath.Join(stateDir, "ek-certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "swtpm_setup", "--tpm2", "--tpm-state", stateDir,
		"--config", filepath.Join(m.Dir, "swtpm_setup.conf"),
		"--createek", "--create-ek-cert", "--create-platform-cert",
		"--pcr-banks", pcrBanks, "--overwrite", "--write-ek-cert-files", certs)
	cmd.SysProcAttr = procAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("swtpm_setup: %w\n%s", err, out)
	}
	return nil
}

// RootsDir returns a directory holding the manufacturer's root and issuing
// CA certificates as PEM (what a server's EK root set points at). It
// exists once a TPM has been provisioned.
func (m *Manufacturer) RootsDir() (string, error) {
	dir := filepath.Join(m.Dir, "roots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for src, dst := range map[string]string{"ca/swtpm-localca-rootca-cert.pem": "root.pem", "ca/issuercert.pem": "issuer.pem"} {
		b, err := os.ReadFile(filepath.Join(m.Dir, src))
		if err != nil {
			return "", fmt.Errorf("manufacturer CA not made yet (provision a TPM first): %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// TPM is a running swtpm.
type TPM struct {
	// Addr is the command channel, host:port on loopback; the control
	// channel is on the next port, the layout tpm2-tss's swtpm TCTI
	// (`-T swtpm:host=127.0.0.1,port=P`) expects.
	Addr  string
	Port  int
	State string
	cmd   *exec.Cmd
	done  chan error
}

// Start runs swtpm on stateDir, serving commands on a free loopback port
// P and its control channel on P+1, with TPM2_Startup already done (a
// fresh boot: PCRs at their reset values). It returns once the command
// port accepts connections.
func Start(ctx context.Context, stateDir string) (*TPM, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		t, err := start(ctx, stateDir, port)
		if err == nil {
			return t, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func start(ctx context.Context, stateDir string, port int) (*TPM, error) {
	cmd := exec.CommandContext(ctx, "swtpm", "socket", "--tpm2",
		"--tpmstate", "dir="+stateDir,
		"--server", "type=tcp,port="+strconv.Itoa(port)+",bindaddr=127.0.0.1",
		"--ctrl", "type=tcp,port="+strconv.Itoa(port+1)+",bindaddr=127.0.0.1",
		"--flags", "not-need-init,startup-clear")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start swtpm: %w", err)
	}
	t := &TPM{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, State: stateDir, cmd: cmd, done: make(chan error, 1)}
	go func() { t.done <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-t.done:
			return nil, fmt.Errorf("swtpm exited: %v: %s", err, stderr.String())
		default:
		}
		if c, err := net.DialTimeout("tcp", t.Addr, 200*time.Millisecond); err == nil {
			c.Close()
			return t, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Stop()
	return nil, errors.New("swtpm did not listen within 10s: " + stderr.String())
}

// Stop ends swtpm and waits for it.
func (t *TPM) Stop() {
	if t.cmd.Process != nil {
		_ = t.cmd.Process.Signal(os.Interrupt)
		select {
		case <-t.done:
		case <-time.After(3 * time.Second):
			_ = t.cmd.Process.Kill()
			<-t.done
		}
	}
}

// freePort returns a loopback port P with P+1 free too.
func freePort() (int, error) {
	for attempt := 0; attempt < 50; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		next, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+1)))
		l.Close()
		if err == nil {
			next.Close()
			return port, nil
		}
	}
	return 0, errors.New("no two consecutive free loopback ports")
}

// Reboot powers the TPM off and on as a machine's reboot does: an orderly
// TPM2_Shutdown(CLEAR), swtpm stopped, then started again on the same
// ports and state with TPM2_Startup(CLEAR) — a TPM Reset: PCRs back to
// their reset values, the reset count one up. Connections to the old
// process are gone.
func (t *TPM) Reboot(ctx context.Context) error {
	if c, err := tpm.DialSocket("tcp", t.Addr, nil); err == nil {
		_ = tpm2.Shutdown(c, tpm2.StartupClear)
		c.Close()
	}
	t.Stop()
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		var n *TPM
		if n, err = start(ctx, t.State, t.Port); err == nil {
			t.cmd, t.done = n.cmd, n.done
			return nil
		}
		time.Sleep(100 * time.Millisecond) // the old process's ports closing
	}
	return fmt.Errorf("swtpm: reboot: %w", err)
}
