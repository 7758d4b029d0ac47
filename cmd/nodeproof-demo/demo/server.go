package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	neturl "net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store/kubestore"
	"github.com/nodeproof/nodeproof/systemtest"
)

// Examples is where the example inputs are, relative to the module root.
const Examples = "deploy/examples"

// plane is a running control plane with nodeproof serve and approve.
type plane struct {
	sys    *systemtest.World
	cfg    *rest.Config
	kc     kubernetes.Interface
	url    string // the server, https://127.0.0.1:port
	port   int
	bundle []byte // its CA bundle
	stop   func()
}

// planeOptions change how startPlane sets up for a live VM.
type planeOptions struct {
	// ServingIPs are more addresses the API server's and the server's
	// certificates name (where a VM's guest reaches them).
	ServingIPs []net.IP
	// APIServerURL is the API server's URL the served kubeconfigs name
	// (default: its loopback URL).
	APIServerURL func(apiPort int) string
}

// startPlane starts a real etcd and kube-apiserver set up as a
// deployment leaves them (systemtest: CRDs, RBAC, the example
// MachineConfigs), a software TPM vendor and the policy, then `nodeproof
// serve` (cluster mode) and `nodeproof approve` in this process.
func startPlane(ctx context.Context, o Options, root string, pol func(*systemtest.World) *policytest.Builder, po planeOptions, step, info func(string, ...any)) (*plane, error) {
	step("A Kubernetes control plane starts: real etcd and kube-apiserver %s on loopback (built by `make tools`)", testenv.KubeVersion)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// etcd and kube-apiserver die with the demo, however it dies.
	prefix, err := dieWithParent()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	sys, err := systemtest.Start(ctx, systemtest.Options{Root: root, Dir: mkdir(o.Dir, "world"), Cluster: true, CommandPrefix: prefix, ServingIPs: po.ServingIPs,
		TPM: true, Policy: pol})
	if err != nil {
		return nil, err
	}
	pl := &plane{sys: sys, stop: sys.Close}
	fail := func(err error) (*plane, error) { pl.stop(); return nil, err }
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	cfg := sys.Config
	pl.cfg, pl.kc = cfg, sys.KC
	info("API server %s, up in %s; NodeAttestation CRDs, RBAC from %s, the example MachineConfigs and pools loaded",
		cfg.Host, time.Since(start).Round(100*time.Millisecond), sys.Path("deploy"))
	admin, approverKC, tokenDir, policyFile := sys.Admin, sys.Approver, sys.TokenDir, sys.PolicyFile

	step("nodeproof serve (cluster mode) and nodeproof approve start")
	klog.SetLogger(logr.Discard()) // client-go's leader election narrates through klog
	state := filepath.Join(o.Dir, "server")
	apiURL := cfg.Host
	hosts := []string{"127.0.0.1"}
	if po.APIServerURL != nil {
		u, err := neturl.Parse(cfg.Host)
		if err != nil {
			return fail(err)
		}
		port, err := strconv.Atoi(u.Port())
		if err != nil {
			return fail(err)
		}
		apiURL = po.APIServerURL(port)
	}
	for _, ip := range po.ServingIPs {
		hosts = append(hosts, ip.String())
	}
	approverREST, err := clientcmd.BuildConfigFromFlags("", approverKC)
	if err != nil {
		return fail(err)
	}
	approverREST.QPS, approverREST.Burst = 50, 100
	loaded, err := policy.Load(policyFile)
	if err != nil {
		return fail(err)
	}
	sctx, stop := context.WithCancel(ctx)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ready := make(chan net.Addr, 1)
	served, approved := make(chan error, 1), make(chan error, 1)
	go func() {
		served <- serve.Run(sctx, serve.Config{
			Listen: "127.0.0.1", TLSMinVersion: "VersionTLS12",
			Kubeconfig: admin, APIServerURL: apiURL, TokenDir: tokenDir,
			CertStore: "state-dir", TokenStore: "file",
			Policy: policyFile, StateDir: state, Hosts: hosts,
			TokenTTL: 10 * time.Minute, Grace: time.Hour, Reload: 10 * time.Second, Clock: o.Clock, Log: quiet,
			Ready: func(secure, _ net.Addr) { ready <- secure },
		})
	}()
	go func() {
		approved <- approver.Runner{
			REST: approverREST, StoreNamespace: "nodeproof", LeaderElect: true, LeaseNamespace: "nodeproof",
			Identity: "demo", Clock: o.Clock, Log: quiet,
			Policy: loaded, Nodes: true, // the node controller: Attested condition and taint
		}.Run(sctx)
	}()
	pl.stop = func() { stop(); <-served; <-approved; sys.Close() }
	select {
	case a := <-ready:
		pl.url = "https://" + a.String()
		pl.port = a.(*net.TCPAddr).Port
	case err := <-served:
		served <- err
		return fail(fmt.Errorf("server: %w", err))
	}
	if pl.bundle, err = os.ReadFile(filepath.Join(state, "certs", "current", certs.CABundleFileName)); err != nil {
		return fail(err)
	}
	info("server %s (TLS, HTTP/1.1; its own CA in %s); approver leading on Lease nodeproof/nodeproof-approver", pl.url, filepath.Join(state, "certs"))
	return pl, nil
}

func mkdir(parent, name string) string {
	d := filepath.Join(parent, name)
	os.MkdirAll(d, 0o700)
	return d
}

// printRecord shows the NodeAttestation record the server wrote for node:
// the verdict's claims as the approver will read them.
func printRecord(ctx context.Context, cfg *rest.Config, node string, info func(string, ...any)) error {
	st, err := storeOf(cfg)
	if err != nil {
		return err
	}
	recs, err := st.RecordsForNode(ctx, node)
	if err != nil {
		return err
	}
	if len(recs) == 0 {
		return fmt.Errorf("no NodeAttestation for %s", node)
	}
	r := recs[0]
	info("verdict ALLOWED; NodeAttestation nodeproof/%s written (kubectl get nodeattestations -n nodeproof):", r.ID)
	info("  node %s, pool %s, evidence %s, identity %.40s…", r.NodeName, r.Pool, r.Kind, r.Identity)
	info("  claims: %s", r.Summary)
	info("  kubelet key SHA-256 %x, bootstrap token %s, expires %s", r.KubeletKeySHA256[:8], "system:bootstrap:"+r.BootstrapTokenID, r.Expires.UTC().Format(time.RFC3339))
	return nil
}

// storeOf is the cluster's NodeAttestation store (namespace nodeproof).
func storeOf(cfg *rest.Config) (*kubestore.Store, error) {
	cl, err := kubestore.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	return kubestore.New(cl, "nodeproof", time.Now)
}
