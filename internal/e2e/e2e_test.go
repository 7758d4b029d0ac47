// Package e2e runs the whole flow with real parts: a kube-apiserver and
// etcd, `nodeproof serve` and `nodeproof approve` running as processes
// from their built binaries, swtpm machines with vendor-CA EK
// certificates, the real Ignition binary, the nodeproof-agent binary, and
// the loopback GCE and AWS metadata services.
package e2e

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vincent-petithory/dataurl"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/keyutil"

	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
	"github.com/nodeproof/nodeproof/internal/faultproxy"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/systemtest"
)

// policy is the e2e world's: systemtest.DefaultPolicy, with GCP instances
// at most an hour old and a re-attestation every 10 s (stale after 40 s).
func policy(w *systemtest.World) *policytest.Builder {
	return systemtest.DefaultPolicy(w).Pool("worker", policytest.TPM("ca:"+systemtest.VendorRoot).SecureBoot().
		GCP().MaxInstanceAge(time.Hour).AWS().Requested().Lifetime(10*time.Second, 40*time.Second))
}

// bins builds nodeproof and nodeproof-agent once for the package.
func bins(t *testing.T) (nodeproof, agent string) {
	t.Helper()
	dir := t.TempDir()
	for _, b := range []string{"nodeproof", "nodeproof-agent"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, b), "../../cmd/"+b).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", b, err, out)
		}
	}
	return filepath.Join(dir, "nodeproof"), filepath.Join(dir, "nodeproof-agent")
}

// proc is a binary run until the test ends (SIGTERM, then wait); fault
// tests kill it (SIGKILL) and start it again with the same arguments.
type proc struct {
	t    *testing.T
	name string
	out  *testenv.LockedBuffer
	bin  string
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan error
}

// process starts bin and stops it when the test ends.
func process(t *testing.T, name string, out *testenv.LockedBuffer, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, out: out, bin: bin, args: args}
	p.start()
	t.Cleanup(func() {
		p.mu.Lock()
		cmd, done := p.cmd, p.done
		p.mu.Unlock()
		if cmd == nil {
			return
		}
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil && t.Failed() {
				t.Logf("%s exited: %v", name, err)
			}
			// A server's clean stop is said, with no stack trace.
			if strings.HasPrefix(name, "nodeproof serve") || strings.HasPrefix(name, "nodeproof approve") {
				log := out.String()
				if err != nil || !strings.Contains(log, `"msg":"stopped"`) || strings.Contains(log, "goroutine ") || strings.Contains(log, "SetLogger(...) was never called") {
					t.Errorf("%s stopped on SIGTERM (%v) without saying so, or with a stack trace:\n%s", name, err, tail(log, 4096))
				}
			}
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			t.Errorf("%s did not stop on SIGTERM", name)
		}
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, out)
		}
	})
	return p
}

// start runs the process (again).
func (p *proc) start() {
	p.t.Helper()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
}

// kill is kill -9: no shutdown, whatever was in flight is lost.
func (p *proc) kill() {
	p.t.Helper()
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

// world is the cluster, the server, the approver and the metadata services.
type world struct {
	cfg                  *rest.Config
	kc                   kubernetes.Interface
	nodeproof, agent     string
	url, plainURL        string
	stateDir, bundleFile string
	man                  *swtpm.Manufacturer
	gce                  *gcptest.Server
	region               *awstest.Region
	serverLog            *testenv.LockedBuffer
	approverLog          *testenv.LockedBuffer
	policyFile           string
	server, approver     *proc
	// apiProxy, when the world was started withAPIProxy, stands between
	// the server and the approver and the API server (Cut: an outage).
	apiProxy *faultproxy.Proxy
	// kubelets are the nodes' kubelets once their client certificate was
	// issued (the test's signer: clustertest.StartSigning), by node name.
	mu       sync.Mutex
	kubelets map[string]*rest.Config
}

// kubeletConfig waits for the certificate issued for the CSR name and
// returns a config authenticating with it and the key (PEM), as a kubelet
// with that certificate does.
func (w *world) kubeletConfig(t *testing.T, name string, keyPEM []byte) *rest.Config {
	t.Helper()
	rc, err := clustertest.KubeletConfig(context.Background(), w.kc, w.cfg, name, keyPEM, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// setKubelet records node's kubelet (its current client certificate).
func (w *world) setKubelet(node string, rc *rest.Config) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.kubelets == nil {
		w.kubelets = map[string]*rest.Config{}
	}
	w.kubelets[node] = rc
}

// kubelet is node's kubelet (nil before its first certificate).
func (w *world) kubelet(node string) *rest.Config {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.kubelets[node]
}

// worldOption changes how start builds the world.
type worldOption func(*world)

// withAPIProxy puts a fault proxy between the server and the approver and
// the API server.
func withAPIProxy(t *testing.T) worldOption {
	return func(w *world) {
		u, err := url.Parse(w.cfg.Host)
		if err != nil {
			t.Fatal(err)
		}
		w.apiProxy = faultproxy.New(t, u.Host)
	}
}

func start(t *testing.T, opts ...worldOption) *world {
	w := &world{serverLog: new(testenv.LockedBuffer)}
	w.nodeproof, w.agent = bins(t)
	signer, err := clustertest.NewSigner()
	if err != nil {
		t.Fatal(err)
	}
	sys := systemtest.New(t, "../..", systemtest.Options{Cluster: true, Signer: signer, TPM: true, Cloud: true, Policy: policy})
	w.cfg, w.kc = sys.Config, sys.KC
	signCtx, stopSigning := context.WithCancel(context.Background())
	signed := make(chan error, 1)
	go func() { signed <- signer.Run(signCtx, w.kc) }()
	t.Cleanup(func() {
		stopSigning()
		if err := <-signed; err != nil {
			t.Errorf("the kubelet signer: %v", err)
		}
	})
	for _, o := range opts {
		o(w)
	}
	// What the server and the approver reach the API server through.
	if w.apiProxy != nil {
		procCfg := rest.CopyConfig(w.cfg)
		procCfg.Host = "https://" + w.apiProxy.Addr()
		if err := sys.WriteKubeconfigs(procCfg); err != nil {
			t.Fatal(err)
		}
	}
	w.man, w.gce, w.region, w.policyFile = sys.Manufacturer, sys.GCE, sys.Region, sys.PolicyFile

	w.stateDir = filepath.Join(t.TempDir(), "state")
	secure, plain := testenv.FreePort(t), testenv.FreePort(t)
	w.url, w.plainURL = fmt.Sprintf("https://127.0.0.1:%d", secure), fmt.Sprintf("http://127.0.0.1:%d", plain)
	w.server = process(t, "nodeproof serve", w.serverLog, w.nodeproof, append([]string{"serve"}, append(sys.ServeArgs(w.cfg.Host),
		"--state-dir", w.stateDir, "--hosts", "127.0.0.1", "--secure-port", fmt.Sprint(secure), "--insecure-port", fmt.Sprint(plain),
		"--gcp-audience-url", w.url, "--metrics-addr", "127.0.0.1:0")...)...)
	w.approverLog = new(testenv.LockedBuffer)
	w.approver = process(t, "nodeproof approve", w.approverLog, w.nodeproof, append([]string{"approve"}, append(sys.ApproveArgs("e2e"), "--metrics-addr", "127.0.0.1:0")...)...)
	if err := systemtest.WaitServing(w.plainURL, time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, w.serverLog)
	}
	w.bundleFile = filepath.Join(w.stateDir, "certs", "current", certs.CABundleFileName)
	return w
}

// pointer runs `nodeproof pointer` for pool (no token: the public tier).
func (w *world) pointer(t *testing.T, pool string, extra ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "pointer.ign")
	args := append([]string{"pointer", "--state-dir", w.stateDir, "--url", w.url, "--pool", pool, "--http-total", "20s", "-o", out}, extra...)
	if b, err := exec.Command(w.nodeproof, args...).CombinedOutput(); err != nil {
		t.Fatalf("nodeproof pointer: %v\n%s", err, b)
	}
	return out
}

// runAgent runs the agent binary against the server; it returns its
// console output and exit code.
func (w *world) runAgent(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	return w.exec(t, env, append([]string{"--server", w.url, "--ca-bundle", w.bundleFile, "--timeout", "60s"}, args...)...)
}

// exec runs the agent binary with exactly args.
func (w *world) exec(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(w.agent, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("agent: %v", err)
	return "", -1
}

// get makes a plain GET of the server's path without credentials,
// trusting its CA bundle.
func (w *world) get(t *testing.T, path string) (*http.Response, []byte) {
	t.Helper()
	bundle, err := os.ReadFile(w.bundleFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatal("CA bundle holds no certificate")
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, err := http.NewRequest(http.MethodGet, w.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", api.IgnitionAccept)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

const firstbootUnit = "nodeproof-agent-firstboot.service"

// traversableDir is a temporary directory that other users can pass
// through (t.TempDir's parent is private): Ignition writes the core user's
// SSH keys as that user.
func traversableDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "np-e2e-firstboot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// osImageRoot makes dir the installed system as far as Ignition's files
// stage needs it: the OS image's core user (Ignition adds SSH keys to it
// with usermod --root and writes them as that user).
func osImageRoot(t *testing.T, dir string) string {
	t.Helper()
	for _, d := range []string{"etc", "home/core"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]string{
		"passwd":  "root:x:0:0:root:/root:/bin/bash\ncore:x:1000:1000:CoreOS Admin:/home/core:/bin/bash\n",
		"group":   "root:x:0:\ncore:x:1000:\n",
		"shadow":  "root:*:19000:0:99999:7:::\ncore:*:19000:0:99999:7:::\n",
		"gshadow": "root:*::\ncore:!::\n",
	} {
		mode := os.FileMode(0o644)
		if strings.Contains(name, "shadow") {
			mode = 0o600
		}
		if err := os.WriteFile(filepath.Join(dir, "etc", name), []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(filepath.Join(dir, "home/core"), 1000, 1000); err != nil {
		t.Fatalf("the files stage writes the core user's SSH keys as that user: %v", err)
	}
	return dir
}

// ignitionFiles runs Ignition's files stage on what its fetch stage cached
// in dir, writing into root (unprivileged paths: the binary is built
// without SELinux relabelling).
func ignitionFiles(bin, dir, root string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-platform", "file", "-stage", "files",
		"-config-cache", filepath.Join(dir, "ignition.json"), "-state-file", filepath.Join(dir, "state"),
		"-neednet", filepath.Join(dir, "neednet"), "-root", root, "-log-to-stdout")
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// envFile reads a systemd EnvironmentFile= of KEY=VALUE lines.
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q", path, line)
		}
		env[k] = v
	}
	return env
}

// unitCommand is the unit's ExecStart= as systemd would run it with env,
// its absolute path arguments (other than the program) moved under root.
func unitCommand(t *testing.T, unit string, env map[string]string, root string) []string {
	t.Helper()
	var line string
	for _, l := range strings.Split(unit, "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStart="); ok {
			if line != "" {
				t.Fatal("two ExecStart= lines")
			}
			line = v
		}
	}
	args := strings.Fields(os.Expand(line, func(k string) string {
		v, ok := env[k]
		if !ok {
			t.Fatalf("ExecStart= uses %s, which agent.env does not set", k)
		}
		return v
	}))
	for i, a := range args[1:] {
		if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(v, "/") {
			args[i+1] = k + "=" + filepath.Join(root, v)
		}
	}
	return args
}

// files maps the paths of an Ignition config to their sources.
func files(t *testing.T, cfg []byte) map[string]string {
	t.Helper()
	m, err := systemtest.ConfigFiles(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// kubeletCSR submits the kubelet's client CSR for node, with the key the
// agent made and the kubeconfig the full config carried, as the kubelet's
// bootstrap does, and waits for the decision; once approved, for the
// certificate, which becomes node's kubelet (w.kubelet).
func (w *world) kubeletCSR(t *testing.T, kubeconfig []byte, keyFile, node string) certv1.CertificateSigningRequestCondition {
	t.Helper()
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		t.Fatalf("served kubeconfig: %v", err)
	}
	ctx := context.Background()
	if _, err := clustertest.WaitWhoAmI(ctx, rc, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	k, err := keyutil.PrivateKeyFromFile(keyFile)
	if err != nil {
		t.Fatalf("kubelet key: %v", err)
	}
	key := k.(crypto.Signer)
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	nkc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	data, err := cert.MakeCSR(key, &pkix.Name{Organization: []string{"system:nodes"}, CommonName: "system:node:" + node}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	name, _, err := csr.RequestCertificate(nkc, data, "", certv1.KubeAPIServerClientKubeletSignerName, nil,
		[]certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, key)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := w.kc.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) > 0 {
			if c := got.Status.Conditions[0]; c.Type == certv1.CertificateApproved {
				w.setKubelet(node, w.kubeletConfig(t, name, keyPEM))
			}
			return got.Status.Conditions[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("CSR %s for %s undecided", name, node)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func decode(t *testing.T, src string) []byte {
	t.Helper()
	du, err := dataurl.DecodeString(src)
	if err != nil {
		t.Fatal(err)
	}
	return du.Data
}

// machine is a swtpm machine booted with a firmware log, its TPM free for
// the agent binary (tcp:) and the log in a file.
func (w *world) machine(t *testing.T, logName string) (tpmArg, logFile string) {
	t.Helper()
	log := firmwaretestdata.MustLog(logName)
	// Not t.TempDir(): swtpm takes its state directory inside a
	// comma-separated option, and subtest names hold commas.
	dir, err := os.MkdirTemp("", "np-machine-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	m, err := w.man.NewMachine(context.Background(), dir, log)
	if err != nil {
		t.Fatal(err)
	}
	m.Collector.Close() // the agent binary opens the TPM itself
	m.Collector = nil
	t.Cleanup(func() { m.Close() })
	logFile = filepath.Join(dir, "event.log")
	if err := os.WriteFile(logFile, log, 0o600); err != nil {
		t.Fatal(err)
	}
	return "tcp:" + m.TPM.Addr, logFile
}

func approved(t *testing.T, cond certv1.CertificateSigningRequestCondition, reason string) {
	t.Helper()
	if cond.Type != certv1.CertificateApproved || cond.Reason != reason {
		t.Fatalf("CSR %s %s: %s", cond.Type, cond.Reason, cond.Message)
	}
}

func TestEndToEnd(t *testing.T) {
	w := start(t)

	t.Run("Ignition without credentials gets the public tier only", func(t *testing.T) {
		cached, out, err := testenv.IgnitionFetch(t, w.pointer(t, "worker"), "")
		if err != nil {
			t.Fatalf("ignition: %v\n%s", err, out)
		}
		got := files(t, cached)
		for _, p := range render.ForbiddenPublicPaths() {
			if _, ok := got[p]; ok {
				t.Errorf("the public tier delivered %s", p)
			}
		}
	})

	t.Run("Ignition without credentials for a pool with no public tier is refused", func(t *testing.T) {
		if _, out, err := testenv.IgnitionFetch(t, w.pointer(t, "master"), ""); err == nil {
			t.Fatalf("Ignition fetched the master config without credentials:\n%s", out)
		}
		// What Ignition got: 401 (no credentials, RFC 9110; see
		// docs/protocol.md) with the reason, final.
		resp, body := w.get(t, "/config/master")
		var ref api.Refusal
		if err := json.Unmarshal(body, &ref); err != nil || resp.StatusCode != http.StatusUnauthorized || ref.Reason != "CredentialsRequired" {
			t.Fatalf("GET /config/master without credentials: %d %s, want 401 CredentialsRequired", resp.StatusCode, body)
		}
		if resp.Header.Get("WWW-Authenticate") == "" || resp.Header.Get("Retry-After") != "" {
			t.Errorf("401 headers %v: want WWW-Authenticate and no Retry-After", resp.Header)
		}
	})

	t.Run("mode 1: the agent in the initramfs, then Ignition fetches the full config", func(t *testing.T) {
		tpmArg, logFile := w.machine(t, "rhel8-uefi")
		sysDir, keyFile := t.TempDir(), filepath.Join(t.TempDir(), "pki", "kubelet-client.key.tmp")
		out, code := w.runAgent(t, nil, "--mode", "pointer", "--pool", "worker", "--node-name", "worker-tpm-1",
			"--tpm", tpmArg, "--event-log", logFile, "--kubelet-key", keyFile, "--ignition-dir", sysDir)
		if code != 0 {
			t.Fatalf("agent exit %d:\n%s", code, out)
		}
		// Ignition boots with the platform's public pointer; the agent's
		// user.ign in the system config directory takes precedence.
		cached, iout, err := testenv.IgnitionFetch(t, w.pointer(t, "worker"), sysDir)
		if err != nil {
			t.Fatalf("ignition: %v\n%s", err, iout)
		}
		got := files(t, cached)
		kubeconfig, ok := got[render.KubeconfigPath]
		if !ok {
			t.Fatalf("Ignition's cache has no %s: it did not get the full config", render.KubeconfigPath)
		}
		approved(t, w.kubeletCSR(t, decode(t, kubeconfig), keyFile, "worker-tpm-1"), "NodeproofAttestedTPM")
	})

	t.Run("mode 2: Ignition applies the public tier, its first-boot unit runs the agent, which fetches the rest", func(t *testing.T) {
		// Ignition's fetch and files stages, as on a first boot, into an
		// installed system that is only what the OS image brings.
		dir := traversableDir(t)
		root := osImageRoot(t, filepath.Join(dir, "root"))
		ign := testenv.IgnitionBinary(t)
		cached, iout, err := testenv.RunIgnitionFetch(ign, dir, w.pointer(t, "worker"), "")
		if err != nil {
			t.Fatalf("ignition fetch: %v\n%s", err, iout)
		}
		for _, p := range render.ForbiddenPublicPaths() {
			if _, ok := files(t, cached)[p]; ok {
				t.Fatalf("the public tier delivered %s", p)
			}
		}
		if out, err := ignitionFiles(ign, dir, root); err != nil {
			t.Fatalf("ignition files: %v\n%s", err, out)
		}
		for _, p := range render.ForbiddenPublicPaths() {
			if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("Ignition wrote %s from the public tier (%v)", p, err)
			}
		}

		// What the public tier installed: the unit as deploy/node ships
		// it, enabled; its settings; the server's CA bundle.
		unitFile := filepath.Join(root, "etc/systemd/system", firstbootUnit)
		unit, err := os.ReadFile(unitFile)
		if err != nil {
			t.Fatalf("the public tier did not install the first-boot unit: %v", err)
		}
		if shipped, err := os.ReadFile("../../deploy/node/" + firstbootUnit); err != nil || !bytes.Equal(unit, shipped) {
			t.Errorf("the installed unit is not deploy/node's (%v)", err)
		}
		preset, err := os.ReadFile(filepath.Join(root, "etc/systemd/system-preset/20-ignition.preset"))
		if err != nil || !strings.Contains(string(preset), "enable "+firstbootUnit) {
			t.Errorf("the unit is not enabled: %q %v", preset, err)
		}
		env := envFile(t, filepath.Join(root, "etc/nodeproof/agent.env"))
		if _, err := os.Stat(filepath.Join(root, "etc/nodeproof/mcs-ca-bundle.crt")); err != nil {
			t.Fatalf("no CA bundle from the public tier: %v", err)
		}
		// The example names its cluster's api-int; this cluster's server
		// is on loopback.
		if env["NODEPROOF_SERVER"] != "https://api-int.example.nodeproof.test:22623" || env["NODEPROOF_POOL"] != "worker" || env["NODEPROOF_EVIDENCE"] != "auto" {
			t.Fatalf("agent.env %v", env)
		}
		env["NODEPROOF_SERVER"] = w.url

		// First boot: the unit's command line, with its paths under root,
		// plus what only this test needs: swtpm instead of /dev/tpmrm0,
		// and a node name.
		tpmArg, logFile := w.machine(t, "rhel8-uefi")
		args := unitCommand(t, string(unit), env, root)
		if args[0] != "/usr/bin/nodeproof-agent" {
			t.Fatalf("the unit runs %s", args[0])
		}
		keyFile := filepath.Join(root, "var/lib/kubelet/pki/kubelet-client.key.tmp")
		args = append(args[1:], "--tpm", tpmArg, "--event-log", logFile, "--node-name", "worker-tpm-2", "--kubelet-key", keyFile, "--timeout", "60s")
		out, code := w.exec(t, nil, args...)
		if code != 0 {
			t.Fatalf("agent %q exit %d:\n%s", args, code, out)
		}
		if !strings.Contains(out, "nodeproof-agent: evidence tpm (--evidence auto found the TPM at ") {
			t.Errorf("the console does not say which evidence auto chose:\n%s", out)
		}
		kubeconfig, err := os.ReadFile(filepath.Join(root, render.KubeconfigPath))
		if err != nil {
			t.Fatalf("the agent did not write the kubeconfig: %v\n%s", err, out)
		}
		if _, err := os.Stat(filepath.Join(root, render.EncapsulatedPath)); err != nil {
			t.Errorf("no encapsulated MachineConfig for the first-boot daemon: %v", err)
		}
		approved(t, w.kubeletCSR(t, kubeconfig, keyFile, "worker-tpm-2"), "NodeproofAttestedTPM")
	})

	t.Run("GCP identity", func(t *testing.T) {
		root, keyFile := t.TempDir(), filepath.Join(t.TempDir(), "kubelet.key")
		// --evidence auto: no TPM here, and the metadata server answers.
		out, code := w.runAgent(t, []string{"GCE_METADATA_HOST=" + w.gce.Host()}, "--tpm", filepath.Join(t.TempDir(), "no-tpm"), "--mode", "fetch",
			"--pool", "worker", "--kubelet-key", keyFile, "--root", root)
		if code != 0 {
			t.Fatalf("agent exit %d:\n%s", code, out)
		}
		if !strings.Contains(out, "nodeproof-agent: evidence gcp (--evidence auto found the GCE metadata server at "+w.gce.Host()+")") {
			t.Errorf("the console does not say auto chose gcp:\n%s", out)
		}
		kubeconfig, err := os.ReadFile(filepath.Join(root, render.KubeconfigPath))
		if err != nil {
			t.Fatal(err)
		}
		approved(t, w.kubeletCSR(t, kubeconfig, keyFile, w.gce.Instance().InstanceName), "NodeproofAttestedGCP")
	})

	t.Run("AWS identity", func(t *testing.T) {
		f, err := w.region.Files(awstest.NewDocument("us-east-1", time.Now().Add(-2*time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		imds := awstest.NewIMDS(f)
		defer imds.Close()
		root, keyFile := t.TempDir(), filepath.Join(t.TempDir(), "kubelet.key")
		out, code := w.runAgent(t, []string{"AWS_EC2_METADATA_SERVICE_ENDPOINT=" + imds.URL}, "--evidence", "aws", "--mode", "fetch",
			"--pool", "worker", "--kubelet-key", keyFile, "--root", root)
		if code != 0 {
			t.Fatalf("agent exit %d:\n%s", code, out)
		}
		kubeconfig, err := os.ReadFile(filepath.Join(root, render.KubeconfigPath))
		if err != nil {
			t.Fatal(err)
		}
		approved(t, w.kubeletCSR(t, kubeconfig, keyFile, "ip-10-0-1-2.ec2.internal"), "NodeproofAttestedAWS")
	})

	t.Run("Secure Boot off: the agent prints the server's reason and exits non-zero", func(t *testing.T) {
		tpmArg, logFile := w.machine(t, "ubuntu-2104-no-secure-boot")
		out, code := w.runAgent(t, nil, "--mode", "pointer", "--pool", "worker", "--node-name", "worker-insecure",
			"--tpm", tpmArg, "--event-log", logFile, "--kubelet-key", filepath.Join(t.TempDir(), "k"), "--ignition-dir", t.TempDir())
		if code != 3 || !strings.Contains(out, "REFUSED") || !strings.Contains(out, "SecureBootDisabled") {
			t.Fatalf("exit %d, console:\n%s", code, out)
		}
		t.Logf("console:\n%s", out)
	})

	if bytes.Contains([]byte(w.serverLog.String()), []byte("np1.")) {
		t.Error("a sealed token appears in the server log")
	}
}

// tail is the end of s, at most n bytes.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
