package demo

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/testenv"
)

// TestDemo runs `make demo`'s flow on swtpm and a real API server and
// checks its verdicts and that it printed each command, so the demo cannot
// rot.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), Options{Dir: t.TempDir(), Out: &out, Clock: time.Now, Root: "../../.."})
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		// Part one, in process.
		"EK trust               ca:swtpm-localca",
		"Secure Boot            on",
		"ALLOWED: worker",
		"REFUSED as expected: BootComponentNotAllowed",
		"REFUSED as expected: QuoteBindingMismatch",
		// Part two: each command printed, and what it did.
		"$ kubectl apply --server-side -k deploy/overlays/kubernetes",
		"$ nodeproof serve --kubeconfig",
		"$ ignition -platform file -stage fetch",
		"attested: node worker-2, pool worker",
		"certificatesigningrequest.certificates.k8s.io/worker-2-client condition met",
		"node/worker-2 condition met",
		"Attested=True",
		"REFUSED at re-attestation by the server (HTTP 403): SecureBootDisabled",
		"taint nodeproof.io/unattested:NoSchedule",
		"$ nodeproof status",
		"leader:      ",
		"replica:     ",
		"$ kubectl nodeproof inspect worker-2",
		"Boot (latest attestation):",
		"REFUSED at re-attestation by the server (HTTP 403): Revoked",
		"taint nodeproof.io/unattested:NoExecute",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

// process is a live process whose command line names a directory.
type process struct {
	pid  string
	comm string
}

// processesUnder lists the live (not zombie) processes whose command line
// mentions dir: everything the demo starts keeps its files under its
// working directory and names them in its arguments.
func processesUnder(t *testing.T, dir string) []process {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []process
	for _, e := range entries {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(dir)) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ...
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < 0 || end+2 >= len(s) || s[end+2] == 'Z' {
			continue
		}
		out = append(out, process{pid: pid, comm: s[open+1 : end]})
	}
	return out
}

func comms(ps []process) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.comm)
	}
	slices.Sort(out)
	return out
}

// TestDemoStops runs the nodeproof-demo command with its default
// temporary directory and stops it once the control plane, the server and
// a swtpm are running: after SIGTERM or SIGINT nothing it started is left
// and its directory is gone; after SIGKILL, which it cannot handle,
// nothing it started is left either (parent-death signals).
func TestDemoStops(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "nodeproof-demo")
	if out, err := exec.Command("go", "build", "-o", bin, "../../../cmd/nodeproof-demo").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// Printed when etcd, kube-apiserver, the server and part one's swtpm
	// all run.
	const when = "==> Anyone on the network runs Ignition"
	cases := []struct {
		name        string
		sig         syscall.Signal
		removesDir  bool
		wantExitSig bool // killed by the signal, rather than exiting
	}{
		{name: "SIGTERM", sig: syscall.SIGTERM, removesDir: true},
		{name: "SIGINT", sig: syscall.SIGINT, removesDir: true},
		{name: "SIGKILL", sig: syscall.SIGKILL, wantExitSig: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir() // the demo's TMPDIR: its default directory goes here
			cmd := exec.Command(bin)
			cmd.Dir = "../../.." // the module root, as under make
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			reached := make(chan struct{})
			var narration bytes.Buffer
			go func() {
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					narration.WriteString(sc.Text() + "\n")
					if strings.HasPrefix(sc.Text(), when) {
						close(reached)
					}
				}
				io.Copy(io.Discard, stdout)
				exited <- cmd.Wait()
			}()
			select {
			case <-reached:
			case err := <-exited:
				t.Fatalf("the demo ended before %q: %v\n%s\n%s", when, err, &narration, &stderr)
			case <-time.After(5 * time.Minute):
				cmd.Process.Kill()
				t.Fatalf("the demo did not reach %q in 5 minutes", when)
			}

			running := comms(processesUnder(t, tmp))
			for _, want := range []string{"etcd", "kube-apiserver", "swtpm"} {
				if !slices.Contains(running, want) {
					t.Fatalf("before the signal: running %v, want %s among them (the test would see nothing)", running, want)
				}
			}
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			signalled := time.Now()
			select {
			case err := <-exited:
				var ee *exec.ExitError
				if err == nil || !errors.As(err, &ee) {
					t.Fatalf("the demo exited with %v after %s", err, tc.name)
				}
				ws := ee.Sys().(syscall.WaitStatus)
				if ws.Signaled() != tc.wantExitSig {
					t.Errorf("exit status %v: killed by a signal %v, want %v", ws, ws.Signaled(), tc.wantExitSig)
				}
			case <-time.After(2 * time.Minute):
				cmd.Process.Kill()
				t.Fatalf("the demo did not stop within 2 minutes of %s", tc.name)
			}
			// A step that ignores the signal (Ignition retrying a stopped
			// server for its 60 s) would show here.
			took := time.Since(signalled)
			t.Logf("stopped %s after %s", took.Round(100*time.Millisecond), tc.name)
			if took > 45*time.Second {
				t.Errorf("the demo took %s to stop after %s", took.Round(time.Second), tc.name)
			}

			// Everything it started is gone (a SIGKILLed parent's children
			// get their parent-death signal at once; allow for a loaded
			// machine).
			deadline := time.Now().Add(30 * time.Second)
			for left := processesUnder(t, tmp); len(left) > 0; left = processesUnder(t, tmp) {
				if time.Now().After(deadline) {
					for _, p := range left {
						if pid, err := strconv.Atoi(p.pid); err == nil {
							syscall.Kill(pid, syscall.SIGKILL)
						}
					}
					t.Fatalf("after %s, still running: %v", tc.name, left)
				}
				time.Sleep(200 * time.Millisecond)
			}
			entries, err := os.ReadDir(tmp)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			if tc.removesDir && len(names) > 0 {
				t.Errorf("after %s, left in TMPDIR: %v\n%s", tc.name, names, &stderr)
			}
			if !tc.removesDir {
				t.Logf("after %s (which no program can handle), left in TMPDIR: %v", tc.name, names)
			}
		})
	}
}

// TestRunCluster: `make dev-cluster` starts an API server a kubeconfig
// reaches, and Ctrl-C (the context's end) stops it and removes its files.
func TestRunCluster(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cluster")
	ctx, cancel := context.WithCancel(context.Background())
	var out testenv.LockedBuffer
	done := make(chan error, 1)
	go func() { done <- RunCluster(ctx, Options{Dir: dir, Out: &out, Clock: time.Now}) }()
	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if strings.Contains(out.String(), "export KUBECONFIG="+kubeconfig) {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("RunCluster ended: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no kubeconfig printed:\n%s", out.String())
		}
	}
	if b, err := exec.Command(testenv.Kubectl(t), "--kubeconfig", kubeconfig, "get", "--raw", "/readyz").CombinedOutput(); err != nil || !strings.Contains(string(b), "ok") {
		t.Errorf("kubectl get --raw /readyz: %v\n%s", err, b)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left behind in %s: %v", dir, entries)
	}
}
