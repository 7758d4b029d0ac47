// Package fleet stands in for many machines provisioning against a real
// nodeproof deployment on one host: a real etcd and kube-apiserver,
// `nodeproof serve` (cluster mode, Kubernetes store) and `nodeproof
// approve` running as processes from their binaries, and machines whose
// TPM is a software model (bench/simtpm: every machine its own EK, EK
// certificate and AK) or whose cloud identity comes from loopback GCE and
// IMDSv2 metadata services. Each machine attests, fetches its full config
// and submits its kubelet client CSR with the bootstrap token the config
// carried, as the agent and the kubelet do, from a loopback source address
// of its own.
//
// `make bench` (bench/scale) measures a thousand of them; the fault tests
// (internal/faults) kill and cut the processes under them.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/bench/bigconfig"
	"github.com/nodeproof/nodeproof/bench/simtpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
	"github.com/nodeproof/nodeproof/internal/faultproxy"
	"github.com/nodeproof/nodeproof/internal/freeport"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/certs/kubecerts"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/mcs/seal"
	"github.com/nodeproof/nodeproof/systemtest"
)

// Policy is the world's attestation policy: TPM machines trusted through
// the fleet's vendor CA (roots), GCP machines of the test project, AWS
// machines of the test account named by instance ID; the provisioning
// token (the token tier) also fetches the worker config.
func Policy(roots string) *policytest.Builder { return PolicyDenying(roots) }

// PolicyDenying is Policy with denied digests in the worker pool
// (tpm.deniedDigests): a revocation, for the day's policy change.
func PolicyDenying(roots string, digests ...string) *policytest.Builder {
	return policytest.New().EKRoot("fleet-vendor", roots).Pool("worker",
		policytest.TPM("ca:fleet-vendor").SecureBoot().GCP().AWS().AWSNodeName(policy.AWSNodeNameInstanceID).Requested().Token().
			Edit(func(p *policy.Pool) { p.TPM.DeniedDigests = digests }))
}

// TB is what the metadata fakes need of a test (testing.TB fits; a program
// can pass its own).
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// Options say how to build a world.
type Options struct {
	// Dir holds everything the world writes (required).
	Dir string
	// Root is the module root (deploy/ is read from it; default ".").
	Root string
	// Nodeproof is the nodeproof binary (required).
	Nodeproof string
	// GrowConfig grows the rendered worker config by ~500 KB of file
	// contents, a realistically large config.
	GrowConfig bool
	// ServeArgs and ApproveArgs are added to the processes' flags;
	// FirstServeArgs to the first server's only (a port of its own, say).
	ServeArgs, ApproveArgs, FirstServeArgs []string
	// Env is added to the processes' environment (GOMEMLIMIT, say).
	Env []string
	// ClientQPS and ClientBurst bound this program's own API client
	// (default 1000 / 2000).
	ClientQPS   float32
	ClientBurst int
	// APIProxy puts a TCP proxy (internal/faultproxy) between the API
	// server and everyone else in the world (the server, the approver, the
	// kubelets), so a test can make the API server unreachable.
	APIProxy bool
	// Log, if set, hears what the world does.
	Log func(format string, args ...any)
	// Replicas is how many servers run (default 1). With more than one
	// they share what replicas share in a real deployment: the sealing
	// keyring (one file), and the CA, serving certificate and provisioning
	// token kept in the cluster (--cert-store=cluster, --token-store=cluster
	// in namespace nodeproof, the leader of Lease nodeproof-server writing);
	// and every machine sends each of its requests to the next replica in
	// turn, so a challenge, its verify and the fetch land on different
	// servers.
	Replicas int
	// Approvers is how many `nodeproof approve` run (default 1), leader
	// elected on the Lease nodeproof-approver: one acts at a time.
	Approvers int
}

// World is a control plane with nodeproof's server and approver running,
// and the trust roots machines are made with.
type World struct {
	o Options
	// Config is an admin config for the API server.
	Config *rest.Config
	KC     kubernetes.Interface
	// URL is the server's TLS port; PlainURL its plain port.
	URL, PlainURL string
	// Bundle is the CA bundle machines trust.
	Bundle []byte
	// GrownBytes is how much the worker config was grown.
	GrownBytes int
	// Server and Approver are the processes (the first of each).
	Server, Approver *Process
	// Servers and Approvers are all of them (Options.Replicas,
	// Options.Approvers); URLs the servers' TLS ports, URL the first.
	Servers, Approvers []*Process
	URLs, PlainURLs    []string
	// CPDir holds the control plane's files (to find its processes).
	CPDir string
	// Proxy stands between the API server and the world (Options.APIProxy).
	Proxy *faultproxy.Proxy
	// StateDir is the server's --state-dir (certificates, sealing keys,
	// provisioning tokens).
	StateDir string
	// PolicyFile is the servers' --policy, which they reload on change.
	PolicyFile string
	// RootsDir is the EK vendor's CA directory the policy names.
	RootsDir string

	sys *systemtest.World
	// ekMu guards ekUsed, how many cached EK keys TPMMachines handed out:
	// each EK is one identity, which enrols once.
	ekMu     sync.Mutex
	ekUsed   int
	vendor   *tpmtest.VendorCA
	rootsDir string
	gceKey   gcptest.Key
	region   *awstest.Region
	fakes    TB
}

// Start builds a world: control plane, CRDs and RBAC from deploy/, the
// example MachineConfigs, the server and the approver. Close stops it.
func Start(ctx context.Context, tb TB, o Options) (w *World, err error) {
	if o.Dir == "" || o.Nodeproof == "" {
		return nil, errors.New("fleet: Dir and Nodeproof are required")
	}
	if o.Root == "" {
		o.Root = "."
	}
	if o.ClientQPS == 0 {
		o.ClientQPS, o.ClientBurst = 1000, 2000
	}
	world := &World{o: o, fakes: tb, CPDir: mkdir(o.Dir, "cp")}
	w = world
	defer func() {
		if err != nil {
			world.Close()
		}
	}()
	// Trust roots: the TPM vendor (a software model's: bench/simtpm).
	if w.vendor, err = tpmtest.NewVendorCA("fleet-vendor", time.Now()); err != nil {
		return nil, err
	}
	w.rootsDir = mkdir(o.Dir, "vendor")
	if err := w.vendor.WriteRoots(w.rootsDir); err != nil {
		return nil, err
	}
	w.logf("starting etcd and kube-apiserver")
	// The cluster as a deployment leaves it, GCP's signing key and an AWS
	// region (systemtest).
	sys, err := systemtest.Start(ctx, systemtest.Options{Root: o.Root, Dir: w.CPDir, Cluster: true, Cloud: true, Fakes: tb,
		EditExamples: func(ex *clustertest.Examples) error {
			if !o.GrowConfig {
				return nil
			}
			for _, mc := range ex.Configs {
				if strings.HasPrefix(mc.Name, "rendered-worker-") {
					if w.GrownBytes, err = bigconfig.Grow(mc); err != nil {
						return err
					}
				}
			}
			return nil
		},
		Policy: func(*systemtest.World) *policytest.Builder { return Policy(w.rootsDir) }})
	if err != nil {
		return nil, err
	}
	w.sys = sys
	w.PolicyFile, w.RootsDir = sys.PolicyFile, w.rootsDir
	cfg := rest.CopyConfig(sys.Config)
	cfg.QPS, cfg.Burst = o.ClientQPS, o.ClientBurst
	w.Config = cfg
	if w.KC, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	w.gceKey, w.region = sys.GCE.Key(), sys.Region
	// What the world's processes and kubelets dial: the API server, or the
	// proxy in front of it.
	reach := rest.CopyConfig(cfg)
	if o.APIProxy {
		u, err := url.Parse(cfg.Host)
		if err != nil {
			return nil, err
		}
		if w.Proxy, err = faultproxy.Start("127.0.0.1:0", u.Host); err != nil {
			return nil, err
		}
		reach.Host = "https://" + w.Proxy.Addr()
		if err := sys.WriteKubeconfigs(reach); err != nil {
			return nil, err
		}
	}

	if o.Replicas < 1 {
		o.Replicas = 1
	}
	if o.Approvers < 1 {
		o.Approvers = 1
	}
	common := append([]string{"serve"}, append(sys.ServeArgs(reach.Host), "--hosts", "127.0.0.1")...)
	if o.Replicas > 1 {
		// What replicas share: the keyring file (made here, before any
		// replica starts), and the state the leader keeps in the cluster.
		keys := filepath.Join(mkdir(o.Dir, "shared"), "keys.json")
		if _, err := seal.LoadOrCreate(keys, time.Now); err != nil {
			return nil, err
		}
		common = append(common, "--keys-file", keys, "--cert-store=cluster", "--certs-namespace", "nodeproof",
			"--token-store=cluster", "--token-secret-namespace", "nodeproof", "--reload-interval", "1s")
	}
	for i := range o.Replicas {
		state := mkdir(o.Dir, fmt.Sprint("server-", i))
		if i == 0 {
			state = mkdir(o.Dir, "server")
			w.StateDir = state
		}
		secure, err := FreePort()
		if err != nil {
			return nil, err
		}
		plain, err := FreePort()
		if err != nil {
			return nil, err
		}
		u, pu := fmt.Sprintf("https://127.0.0.1:%d", secure), fmt.Sprintf("http://127.0.0.1:%d", plain)
		if i == 0 {
			w.URL, w.PlainURL = u, pu
		}
		w.URLs, w.PlainURLs = append(w.URLs, u), append(w.PlainURLs, pu)
		args := append(append([]string(nil), common...), "--state-dir", state, "--leader-elect-id", fmt.Sprint("serve-", i),
			"--secure-port", fmt.Sprint(secure), "--insecure-port", fmt.Sprint(plain), "--gcp-audience-url", w.URL)
		name, logName := "serve", "serve.log"
		if i > 0 {
			name, logName = fmt.Sprint("serve-", i), fmt.Sprintf("serve-%d.log", i)
		}
		args = append(args, o.ServeArgs...)
		if i == 0 {
			args = append(args, o.FirstServeArgs...)
		}
		p := &Process{Name: name, Bin: o.Nodeproof, Log: filepath.Join(o.Dir, logName), Env: o.Env, Args: args}
		if err := p.Start(); err != nil {
			return nil, err
		}
		w.Servers = append(w.Servers, p)
	}
	w.Server = w.Servers[0]
	for i, pu := range w.PlainURLs {
		if err := systemtest.WaitServing(pu, time.Minute); err != nil {
			return nil, fmt.Errorf("%w\n%s", err, w.Servers[i].Tail())
		}
	}
	if o.Replicas == 1 {
		if w.Bundle, err = os.ReadFile(filepath.Join(w.StateDir, "certs", "current", certs.CABundleFileName)); err != nil {
			return nil, err
		}
	} else {
		cm, err := w.KC.CoreV1().ConfigMaps("nodeproof").Get(ctx, kubecerts.CAName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		w.Bundle = []byte(cm.Data[kubecerts.BundleKey])
	}
	for i := range o.Approvers {
		name, logName := "approve", "approve.log"
		if i > 0 {
			name, logName = fmt.Sprint("approve-", i), fmt.Sprintf("approve-%d.log", i)
		}
		p := &Process{Name: name, Bin: o.Nodeproof, Log: filepath.Join(o.Dir, logName), Env: o.Env,
			Args: append(append([]string{"approve"}, sys.ApproveArgs(fmt.Sprint("fleet-", i))...), append([]string{"--metrics-addr", "127.0.0.1:0"}, o.ApproveArgs...)...)}
		if err := p.Start(); err != nil {
			return nil, err
		}
		w.Approvers = append(w.Approvers, p)
	}
	w.Approver = w.Approvers[0]
	return w, nil
}

// Close stops the processes and the control plane.
func (w *World) Close() {
	for _, p := range append(append([]*Process(nil), w.Approvers...), w.Servers...) {
		if p != nil {
			p.Stop()
		}
	}
	if w.Proxy != nil {
		w.Proxy.Close()
	}
	if w.sys != nil {
		w.sys.Close()
	}
}

// WaitServing waits until the server answers on its plain port.
func (w *World) WaitServing(timeout time.Duration) error {
	if err := systemtest.WaitServing(w.PlainURL, timeout); err != nil {
		return fmt.Errorf("%w\n%s", err, w.Server.Tail())
	}
	return nil
}

// spread sends each request to the next of the world's servers in turn
// (a load balancer without affinity); with one server it changes nothing.
type spread struct {
	base http.RoundTripper
	urls []string
	next atomic.Uint64
}

func (s *spread) RoundTrip(req *http.Request) (*http.Response, error) {
	if len(s.urls) > 1 {
		u, err := url.Parse(s.urls[s.next.Add(1)%uint64(len(s.urls))])
		if err != nil {
			return nil, err
		}
		req = req.Clone(req.Context())
		req.URL.Host, req.Host = u.Host, u.Host
	}
	return s.base.RoundTrip(req)
}

// CloseIdleConnections closes the base transport's idle connections
// (http.Client.CloseIdleConnections reaches them through this).
func (s *spread) CloseIdleConnections() {
	if c, ok := s.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// spreadClient makes c send its requests across the world's servers.
func (w *World) spreadClient(c *http.Client) {
	c.Transport = &spread{base: c.Transport, urls: w.URLs}
}

func (w *World) path(p string) string { return filepath.Join(w.o.Root, p) }

func (w *World) logf(format string, args ...any) {
	if w.o.Log != nil {
		w.o.Log(format, args...)
	}
}

// Vendor and RootsDir are the TPM vendor CA machines' EK certificates
// chain to, and where its roots are.
func (w *World) Vendor() (*tpmtest.VendorCA, string) { return w.vendor, w.rootsDir }

// TPMMachines makes n software TPMs of the world's vendor, booted from a
// real RHEL 8 event log (EK keys cached across runs: generating RSA keys
// is the slow part). Every call's machines have EKs no earlier call's
// had: an EK is an identity, and an identity enrols once.
func (w *World) TPMMachines(n int) ([]*simtpm.Machine, error) {
	if n == 0 {
		return nil, nil
	}
	w.ekMu.Lock()
	first := w.ekUsed
	w.ekUsed += n
	w.ekMu.Unlock()
	keys, err := simtpm.EKKeys(first + n)
	if err != nil {
		return nil, err
	}
	return simtpm.NewMachines(w.vendor, firmwaretestdata.MustLog("rhel8-uefi"), keys[first:], nil)
}

// Process is a nodeproof command running as a process, which tests stop,
// kill and start again with the same flags.
type Process struct {
	Name, Bin, Log string
	Args, Env      []string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Start starts the process (again), appending to its log.
func (p *Process) Start() error {
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("fleet: start %s: %w", p.Name, err)
	}
	go func() { cmd.Wait(); f.Close() }()
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	return nil
}

// PID is the running process's.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Kill sends SIGKILL (kill -9: no shutdown, no cleanup) and waits for the
// process to be gone.
func (p *Process) Kill() {
	p.signal(syscall.SIGKILL, 0)
}

// Stop asks the process to stop (SIGTERM), then kills it after 15 s.
func (p *Process) Stop() {
	p.signal(syscall.SIGTERM, 15*time.Second)
}

func (p *Process) signal(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd := p.cmd
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	deadline := time.Now().Add(grace + 5*time.Second)
	for time.Now().Before(deadline) {
		if cmd.Process.Signal(syscall.Signal(0)) != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Kill()
}

// Tail is the end of the process's log.
func (p *Process) Tail() string {
	b, _ := os.ReadFile(p.Log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func mkdir(parent, name string) string {
	d := filepath.Join(parent, name)
	os.MkdirAll(d, 0o700)
	return d
}

// FreePort is a loopback TCP port free a moment ago, for a process that
// takes its port as a flag (freeport.One: below the ephemeral range).
func FreePort() (int, error) { return freeport.One() }
