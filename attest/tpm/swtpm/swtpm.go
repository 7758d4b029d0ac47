// Package swtpm runs software TPMs (swtpm) to try nodeproof without TPM
// hardware — `nodeproof dev tpm` — and for the tests, the demo and the
// bench: a local "manufacturer" CA (swtpm_localca) that issues EK
// certificates, TPM state provisioned with swtpm_setup, swtpm serving the
// TPM command protocol on a loopback TCP port (as a child that dies with
// its parent, Start, or as a daemon that outlives it, StartDaemon), and a
// firmware event log extended into its PCRs (ExtendLog), so that a quote
// and the log agree as on a machine that booted that way.
//
// A software TPM proves nothing about a machine: its EK certificate is
// only as good as the local CA, which anyone can run. Trust it in a test
// pool, never beside real machines.
package swtpm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

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
	cmd   *exec.Cmd // nil for a daemon
	done  chan error
	pid   int // a daemon's
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

// swtpmArgs is the swtpm command line serving stateDir on port and
// port+1, with TPM2_Startup done.
func swtpmArgs(stateDir string, port int) []string {
	return []string{"socket", "--tpm2",
		"--tpmstate", "dir=" + stateDir,
		"--server", "type=tcp,port=" + strconv.Itoa(port) + ",bindaddr=127.0.0.1",
		"--ctrl", "type=tcp,port=" + strconv.Itoa(port+1) + ",bindaddr=127.0.0.1",
		"--flags", "not-need-init,startup-clear"}
}

func start(ctx context.Context, stateDir string, port int) (*TPM, error) {
	cmd := exec.CommandContext(ctx, "swtpm", swtpmArgs(stateDir, port)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start swtpm: %w", err)
	}
	t := &TPM{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, State: stateDir, cmd: cmd, done: make(chan error, 1)}
	go func() { t.done <- cmd.Wait() }()
	exited := false
	if err := t.waitListening(func() error {
		select {
		case err := <-t.done:
			exited = true
			return fmt.Errorf("swtpm exited: %v", err)
		default:
			return nil
		}
	}); err != nil {
		if !exited {
			t.Stop()
		}
		return nil, fmt.Errorf("%w: %s", err, stderr.String())
	}
	return t, nil
}

// waitListening waits up to 10 s for the command port; exited reports a
// process that is gone.
func (t *TPM) waitListening(exited func() error) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := exited(); err != nil {
			return err
		}
		if c, err := net.DialTimeout("tcp", t.Addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
	}
	return errors.New("swtpm did not listen within 10s")
}

// Daemon files, in a daemon's state directory.
const (
	PIDFile  = "swtpm.pid"
	PortFile = "swtpm.port"
	LogFile  = "swtpm.log"
)

// StartDaemon runs swtpm on stateDir as a daemon that outlives this
// process (`nodeproof dev tpm start`), serving commands on loopback port
// (control on port+1), with TPM2_Startup done; its process ID and port go
// into stateDir (PIDFile, PortFile), its log into LogFile. Attach finds it
// again; Stop ends it.
func StartDaemon(ctx context.Context, stateDir string, port int) (*TPM, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	// A daemon changes to / : every path it is given must be absolute.
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, err
	}
	t, err := Attach(stateDir)
	if err == nil {
		return nil, fmt.Errorf("swtpm already runs on %s (pid %d): stop it first", t.Addr, t.pid)
	}
	for _, f := range []string{PIDFile, PortFile} {
		os.Remove(filepath.Join(stateDir, f))
	}
	args := append(swtpmArgs(stateDir, port), "--daemon",
		"--pid", "file="+filepath.Join(stateDir, PIDFile), "--log", "file="+filepath.Join(stateDir, LogFile))
	cmd := exec.CommandContext(ctx, "swtpm", args...)
	// Its own session: a terminal's Ctrl-C in the shell that started it
	// does not reach it.
	cmd.SysProcAttr = daemonAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("swtpm --daemon: %w\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(stateDir, PortFile), []byte(strconv.Itoa(port)+"\n"), 0o600); err != nil {
		return nil, err
	}
	t, err = Attach(stateDir)
	if err != nil {
		return nil, err
	}
	if err := t.waitListening(func() error {
		if !alive(t.pid) {
			b, _ := os.ReadFile(filepath.Join(stateDir, LogFile))
			return fmt.Errorf("swtpm exited: %s", b)
		}
		return nil
	}); err != nil {
		t.Stop()
		return nil, err
	}
	return t, nil
}

// Attach finds the daemon StartDaemon left running on stateDir.
func Attach(stateDir string) (*TPM, error) {
	pidB, err := os.ReadFile(filepath.Join(stateDir, PIDFile))
	if err != nil {
		return nil, fmt.Errorf("no swtpm daemon on %s: %w", stateDir, err)
	}
	portB, err := os.ReadFile(filepath.Join(stateDir, PortFile))
	if err != nil {
		return nil, fmt.Errorf("no swtpm daemon on %s: %w", stateDir, err)
	}
	pid, err1 := strconv.Atoi(strings.TrimSpace(string(pidB)))
	port, err2 := strconv.Atoi(strings.TrimSpace(string(portB)))
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("swtpm daemon files in %s: %w", stateDir, err)
	}
	if !alive(pid) {
		return nil, fmt.Errorf("the swtpm daemon of %s (pid %d) is not running", stateDir, pid)
	}
	return &TPM{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, State: stateDir, pid: pid}, nil
}

// PID is the swtpm process's ID.
func (t *TPM) PID() int {
	if t.cmd != nil && t.cmd.Process != nil {
		return t.cmd.Process.Pid
	}
	return t.pid
}

// Stop ends swtpm and waits for it.
func (t *TPM) Stop() {
	if t.cmd == nil {
		// A daemon: SIGTERM, then SIGKILL after 3 s.
		if p, err := os.FindProcess(t.pid); err == nil && t.pid > 0 {
			_ = p.Signal(syscall.SIGTERM)
			for deadline := time.Now().Add(3 * time.Second); alive(t.pid) && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
			if alive(t.pid) {
				_ = p.Kill()
			}
		}
		for _, f := range []string{PIDFile, PortFile} {
			os.Remove(filepath.Join(t.State, f))
		}
		return
	}
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
	daemon := t.cmd == nil
	t.Stop()
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		var n *TPM
		if daemon {
			n, err = StartDaemon(ctx, t.State, t.Port)
		} else {
			n, err = start(ctx, t.State, t.Port)
		}
		if err == nil {
			t.cmd, t.done, t.pid = n.cmd, n.done, n.pid
			return nil
		}
		time.Sleep(100 * time.Millisecond) // the old process's ports closing
	}
	return fmt.Errorf("swtpm: reboot: %w", err)
}

// ExtendLog extends every measured event of a TCG event log into the
// TPM's SHA-1, SHA-256 and SHA-384 PCRs (a bank the TPM does not have
// allocated ignores its digests; a log without a bank's digests extends
// nothing there), so that the TPM's PCRs are what that machine's firmware
// would have left (from a freshly started TPM). Events
// a TPM at locality 0 cannot reproduce (PCR 17 and up, EV_NO_ACTION) are
// skipped; the result says how many events were extended. On a real TPM
// this would forge a boot: it is for software TPMs.
func ExtendLog(rw io.ReadWriter, log []byte) (int, error) {
	el, err := tcg.ParseEventLog(log, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return 0, fmt.Errorf("parse event log: %w", err)
	}
	n := 0
	for _, bank := range []struct {
		alg  register.HashAlg
		tpm2 tpm2.Algorithm
	}{{register.HashSHA1, tpm2.AlgSHA1}, {register.HashSHA256, tpm2.AlgSHA256}, {register.HashSHA384, tpm2.AlgSHA384}} {
		for _, e := range el.Events(bank.alg) {
			if e.Type == tcg.NoAction || e.Index > 16 || len(e.Digest) == 0 {
				continue
			}
			if err := tpm2.PCRExtend(rw, tpmutil.Handle(e.Index), bank.tpm2, e.Digest, ""); err != nil {
				return n, fmt.Errorf("extend PCR %d: %w", e.Index, err)
			}
			n++
		}
	}
	return n, nil
}
