package liveboot_test

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect/inspecttest"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/systemtest"
)

// binaries are what the test builds: nodeproof for the host, and the
// guest's static programs.
type binaries struct {
	nodeproof, agent, kubeletCSR string
}

// build builds the three programs (the guest's without cgo, stripped).
func build(t testing.TB, say func(string, ...any)) binaries {
	t.Helper()
	dir := t.TempDir()
	b := binaries{nodeproof: filepath.Join(dir, "nodeproof"), agent: filepath.Join(dir, "nodeproof-agent"), kubeletCSR: filepath.Join(dir, "kubelet-csr")}
	for _, c := range []struct {
		out, pkg string
		static   bool
	}{{b.nodeproof, "../../cmd/nodeproof", false}, {b.agent, "../../cmd/nodeproof-agent", true}, {b.kubeletCSR, "./kubeletcsr", true}} {
		start := time.Now()
		args := []string{"build", "-o", c.out}
		if c.static {
			args = append(args, "-ldflags", "-s -w")
		}
		cmd := exec.Command("go", append(args, c.pkg)...)
		cmd.Env = os.Environ()
		if c.static {
			cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
		}
		if out, err := withProgress(say, "go build "+filepath.Base(c.out), cmd.CombinedOutput); err != nil {
			t.Fatalf("go build %s: %v\n%s", c.pkg, err, out)
		}
		say("built %s in %.1fs", filepath.Base(c.out), time.Since(start).Seconds())
	}
	return b
}

// withProgress runs fn, saying every 30 s that what is still going.
func withProgress[T any](say func(string, ...any), what string, fn func() (T, error)) (T, error) {
	done := make(chan struct{})
	defer close(done)
	start := time.Now()
	go func() {
		tick := time.NewTicker(30 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				say("%s: still running, %.0fs so far", what, time.Since(start).Seconds())
			}
		}
	}()
	return fn()
}

// proc is a host program run until the test ends.
type proc struct {
	name string
	out  *testenv.LockedBuffer
	cmd  *exec.Cmd
	done chan error
}

func process(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: new(testenv.LockedBuffer), done: make(chan error, 1)}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			t.Errorf("%s did not stop on SIGTERM", name)
		}
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, p.out)
		}
	})
	return p
}

// world is the cluster and the servers the machine boots against, all on
// loopback; the guest reaches the server and the API server through
// QEMU's guestfwd at liveboot.GuestHost, which their certificates name.
type world struct {
	cfg                 *rest.Config
	kc                  kubernetes.Interface
	bins                binaries
	man                 *swtpm.Manufacturer
	roots               string
	stateDir            string
	serverPort, apiPort int
	policyFile          string
	server, approver    *proc
	admin               string
	// signer is kube-controller-manager's CSR signing controller (the
	// kubelet signers), signing with signerCA: the API server's client
	// CA.
	signer   *proc
	signerCA []byte
}

// SigningDuration is the signer's --cluster-signing-duration: the kubelet's
// certificates live this long after issue (and 5 minutes before: the
// controller backdates NotBefore), so its certificate manager's rotation
// deadline (70-90 % of that life from NotBefore) falls between a minute
// before issue and 6 s after: the boot's second kubelet run renews at once.
const SigningDuration = 40 * time.Second

// guestURL is the server as the guest reaches it.
func (w *world) guestURL() string {
	return fmt.Sprintf("https://%s:%d", liveboot.GuestHost, w.serverPort)
}

// startWorld starts the API server (its certificate also naming
// GuestHost) as a deployment leaves it (systemtest), `nodeproof
// serve` in cluster mode with policy, `nodeproof approve`, and
// kube-controller-manager's CSR signing controller alone, signing with
// the API server's client CA for SigningDuration.
func startWorld(t testing.TB, bins binaries, policy func(*systemtest.World) *policytest.Builder, say func(string, ...any)) *world {
	t.Helper()
	w := &world{bins: bins}
	start := time.Now()
	kcm, err := testenv.KubeControllerManagerPath()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := clustertest.NewSigner()
	if err != nil {
		t.Fatal(err)
	}
	sys := systemtest.New(t, "../..", systemtest.Options{Cluster: true, Production: true, ServingIPs: []net.IP{net.ParseIP(liveboot.GuestHost)}, TPM: true, Policy: policy, Signer: ca})
	w.cfg, w.kc, w.man, w.roots, w.policyFile, w.admin = sys.Config, sys.KC, sys.Manufacturer, sys.EKRoots, sys.PolicyFile, sys.Admin
	u, err := url.Parse(w.cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscan(u.Port(), &w.apiPort); err != nil {
		t.Fatal(err)
	}
	say("kube-apiserver %s at %s (certificate names %s too), up in %.1fs", testenv.KubeVersion, w.cfg.Host, liveboot.GuestHost, time.Since(start).Seconds())
	certFile, keyFile, err := ca.WriteCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w.signerCA = ca.CA()
	w.signer = process(t, "kube-controller-manager", kcm, "--kubeconfig", w.admin, "--controllers", "csrsigning",
		"--cluster-signing-cert-file", certFile, "--cluster-signing-key-file", keyFile, "--cluster-signing-duration", SigningDuration.String(),
		"--leader-elect=false", "--secure-port=0")
	select { // a flag it refuses stops it at once
	case err := <-w.signer.done:
		w.signer.done <- err
		t.Fatalf("kube-controller-manager stopped: %v\n%s", err, w.signer.out)
	case <-time.After(2 * time.Second):
	}

	w.stateDir = filepath.Join(t.TempDir(), "state")
	w.serverPort = testenv.FreePort(t)
	plain := testenv.FreePort(t)
	w.server = process(t, "nodeproof serve", bins.nodeproof, append([]string{"serve"}, append(sys.ServeArgs(fmt.Sprintf("https://%s:%d", liveboot.GuestHost, w.apiPort)),
		"--state-dir", w.stateDir, "--hosts", "127.0.0.1,"+liveboot.GuestHost,
		"--secure-port", fmt.Sprint(w.serverPort), "--insecure-port", fmt.Sprint(plain), "--metrics-addr", "127.0.0.1:0")...)...)
	w.approver = process(t, "nodeproof approve", bins.nodeproof, append([]string{"approve"}, append(sys.ApproveArgs("liveboot"), "--metrics-addr", "127.0.0.1:0")...)...)
	if err := systemtest.WaitServing(fmt.Sprintf("http://127.0.0.1:%d", plain), 2*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, w.server.out)
	}
	say("nodeproof serve at %s (reached from the guest at %s), nodeproof approve and kube-controller-manager (csrsigning) running", fmt.Sprintf("https://127.0.0.1:%d", w.serverPort), w.guestURL())
	return w
}

// caBundle is the server's CA bundle.
func (w *world) caBundle(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(w.stateDir, "certs", "current", certs.CABundleFileName))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pointer is `nodeproof pointer` for the worker pool as the guest reaches
// the server: the platform config the machine's image carries.
func (w *world) pointer(t testing.TB) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "pointer.ign")
	if b, err := exec.Command(w.bins.nodeproof, "pointer", "--state-dir", w.stateDir, "--url", w.guestURL(), "--pool", "worker",
		"--http-total", "60s", "-o", out).CombinedOutput(); err != nil {
		t.Fatalf("nodeproof pointer: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// nodeproofCmd runs the nodeproof binary against the cluster's store.
func (w *world) nodeproofCmd(t testing.TB, args ...string) string {
	t.Helper()
	args = append(args, "--store", "kubernetes", "--kubeconfig", w.admin, "--store-namespace", "nodeproof")
	out, err := exec.Command(w.bins.nodeproof, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nodeproof %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// policyCmd runs nodeproof (a policy command: no store flags) and returns
// what it said on standard error (a policy learn's notes); -o FILE writes
// its standard output there.
func (w *world) policyCmd(t testing.TB, args ...string) string {
	t.Helper()
	var out string
	if i := slices.Index(args, "-o"); i >= 0 {
		out, args = args[i+1], slices.Delete(slices.Clone(args), i, i+2)
	}
	cmd := exec.Command(w.bins.nodeproof, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("nodeproof %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	if out != "" {
		if err := os.WriteFile(out, stdout.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return stderr.String()
}

// inspectUntil is inspecttest.Until through this world's nodeproof.
func (w *world) inspectUntil(t testing.TB, node string, d time.Duration, want func(*inspect.Story) string) *inspect.Story {
	t.Helper()
	return inspecttest.Until(t, func(args ...string) string { return w.nodeproofCmd(t, args...) }, node, d, want)
}

// ekEntry is an EK inventory entry: the EK's SHA-256, the node it names
// and the addresses it attests (a serving certificate's SANs).
type ekEntry struct {
	ek, node  string
	addresses []string
}

// listInventory writes an EK inventory of entries, puts it in a policy
// whose pool "worker" is pool (which should trust "inventory") and waits
// for the server to apply it.
func listInventory(t testing.TB, w *world, pool *policytest.Pool, entries ...ekEntry) {
	t.Helper()
	dir := filepath.Dir(w.policyFile)
	inv := filepath.Join(dir, "ek-inventory.yaml")
	b := []byte("entries:\n")
	for _, e := range entries {
		b = fmt.Appendf(b, "- ekSHA256: %s\n  nodeName: %s\n", e.ek, e.node)
		if len(e.addresses) > 0 {
			b = fmt.Appendf(b, "  addresses: [%s]\n", strings.Join(e.addresses, ", "))
		}
	}
	if err := os.WriteFile(inv, b, 0o600); err != nil {
		t.Fatal(err)
	}
	pol, err := policytest.New().EKRoot(systemtest.VendorRoot, w.roots).EKInventory(inv).Pool("worker", pool).YAML()
	if err != nil {
		t.Fatal(err)
	}
	w.putPolicy(t, pol)
}

// putPolicy replaces the server's --policy file with b (atomically) and
// waits for the server to apply it (its log says "policy reloaded" once
// more).
func (w *world) putPolicy(t testing.TB, b []byte) {
	t.Helper()
	reloads := strings.Count(w.server.out.String(), "policy reloaded")
	tmp := w.policyFile + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, w.policyFile); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); strings.Count(w.server.out.String(), "policy reloaded") == reloads; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server did not apply the policy within a minute\n%s", w.server.out.String())
		}
	}
}

// nodeAttested reports the Node's Attested condition and nodeproof's taint.
func nodeState(s *inspect.Story) (attested corev1.ConditionStatus, reason string, taint corev1.TaintEffect) {
	c := s.Cluster
	if c == nil || c.Condition == nil {
		return "", "", ""
	}
	for _, tt := range c.Taints {
		if tt.Key == approver.TaintUnattested {
			taint = tt.Effect
		}
	}
	return c.Condition.Status, c.Condition.Reason, taint
}

func hasEvent(evs []inspect.Event, object, reason, contains string) bool {
	for _, e := range evs {
		if e.Object == object && e.Reason == reason && strings.Contains(e.Message, contains) {
			return true
		}
	}
	return false
}

// console keeps every boot's console for the test's artifacts.
type consoles struct {
	mu  sync.Mutex
	dir string
}

// save writes one boot's console to the artifact directory and returns
// its path.
func (c *consoles) save(t testing.TB, name string, r *liveboot.Result) string {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if r == nil {
		return ""
	}
	p := filepath.Join(c.dir, name+".console.log")
	if err := os.WriteFile(p, []byte(r.Console()), 0o644); err != nil {
		t.Errorf("saving the console: %v", err)
	}
	return p
}
