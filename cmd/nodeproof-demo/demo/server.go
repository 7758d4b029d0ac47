package demo

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	neturl "net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/mcs/pointer"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// Examples is where the example inputs are, relative to the module root.
const Examples = "deploy/examples"

const serverPolicy = `apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
trust:
  ekRoots:
  - {name: swtpm-localca, dir: %s}
pools:
  worker:
    evidence: [tpm]
    tpm: {ekTrust: [ca:swtpm-localca], requireSecureBoot: true, bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}}
    serve: {nodeNames: requested}
`

// runServer is part two: a real API server, `nodeproof serve` in cluster
// mode and `nodeproof approve`, a swtpm machine whose agent attests before
// Ignition, Ignition's fetch, and the kubelet's CSR approved.
func runServer(ctx context.Context, o Options, man *swtpm.Manufacturer, roots string, step, info func(string, ...any)) error {
	examples := o.Examples
	if examples == "" {
		examples = Examples
	}
	deploy := filepath.Dir(examples)
	ignition, err := testenv.IgnitionPath()
	if err != nil {
		return err
	}

	pl, err := startPlane(ctx, o, deploy, examples, fmt.Sprintf(serverPolicy, roots), planeOptions{}, step, info)
	if err != nil {
		return err
	}
	defer pl.stop()
	cfg, kc, url, bundle := pl.cfg, pl.kc, pl.url, pl.bundle

	// The pointer config a machine boots with: the public tier.
	ptr, err := pointer.Build(pointer.Options{URL: url + "/config/worker", CABundle: bundle, HTTPTotal: 60 * time.Second})
	if err != nil {
		return err
	}
	ptrFile := filepath.Join(o.Dir, "worker.ign")
	if err := os.WriteFile(ptrFile, ptr, 0o600); err != nil {
		return err
	}

	step("Anyone on the network runs Ignition with the worker pointer config and no credentials")
	var public []string
	for deadline := time.Now().Add(time.Minute); ; {
		cached, out, err := testenv.RunIgnitionFetchContext(ctx, ignition, mkdir(o.Dir, "ignition-public"), ptrFile, "")
		if err == nil {
			public = paths(cached)
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ignition (public): %w\n%s", err, out)
		}
		os.RemoveAll(filepath.Join(o.Dir, "ignition-public"))
	}
	info("Ignition got the PUBLIC tier: %d files", len(public))
	for _, f := range public {
		info("  %s", f)
	}

	step("A worker machine boots: swtpm with a vendor EK certificate, a real %s boot log; the agent runs before Ignition", o.Log)
	m, err := man.NewMachine(ctx, mkdir(o.Dir, "machine-2"), firmwaretestdata.MustLog(o.Log))
	if err != nil {
		return err
	}
	defer m.Close()
	sysDir, keyFile := mkdir(o.Dir, "machine-2-ignition"), filepath.Join(o.Dir, "machine-2", "pki", "kubelet-client.key.tmp")
	var console bytes.Buffer
	err = agent.Run(ctx, agent.Config{
		Server: url, CABundle: bundle, Pool: "worker", NodeName: "worker-1", Evidence: agent.TPMEvidence{Collector: m.Collector},
		KubeletKeyPath: keyFile, Mode: agent.ModePointer, IgnitionDir: sysDir, Console: &console,
	})
	for _, l := range strings.Split(strings.TrimSpace(console.String()), "\n") {
		info("console| %s", l)
	}
	if err != nil {
		return err
	}
	if err := printRecord(ctx, cfg, "worker-1", info); err != nil {
		return err
	}

	step("Ignition runs on the machine: the agent's per-node pointer config takes precedence")
	cached, out, err := testenv.RunIgnitionFetchContext(ctx, ignition, mkdir(o.Dir, "ignition-full"), ptrFile, sysDir)
	if err != nil {
		return fmt.Errorf("ignition (full): %w\n%s", err, out)
	}
	full := paths(cached)
	info("Ignition got the FULL config: %d files; what only an attested machine gets:", len(full))
	for _, f := range full {
		if !slices.Contains(public, f) {
			info("  + %s", f)
		}
	}

	step("The kubelet starts with that kubeconfig and the key the agent bound, and asks for its client certificate")
	cond, name, err := kubeletCSR(ctx, kc, cached, keyFile, "worker-1")
	if err != nil {
		return err
	}
	info("CSR %s: %s (%s)", name, cond.Type, cond.Reason)
	info("  %s", cond.Message)
	if cond.Type != certv1.CertificateApproved {
		return fmt.Errorf("the attested kubelet's CSR was not approved: %s %s", cond.Type, cond.Reason)
	}

	step("A machine that booted with Secure Boot off tries the same (real Ubuntu 21.04 log)")
	bad, err := man.NewMachine(ctx, mkdir(o.Dir, "machine-3"), firmwaretestdata.MustLog("ubuntu-2104-no-secure-boot"))
	if err != nil {
		return err
	}
	defer bad.Close()
	console.Reset()
	err = agent.Run(ctx, agent.Config{
		Server: url, CABundle: bundle, Pool: "worker", NodeName: "worker-2", Evidence: agent.TPMEvidence{Collector: bad.Collector},
		KubeletKeyPath: filepath.Join(o.Dir, "machine-3", "kubelet.key"), Mode: agent.ModePointer, IgnitionDir: mkdir(o.Dir, "machine-3-ignition"), Console: &console,
	})
	for _, l := range strings.Split(strings.TrimSpace(console.String()), "\n") {
		info("console| %s", l)
	}
	var refused *agent.Refused
	if !errors.As(err, &refused) || refused.Refusal.Reason != "SecureBootDisabled" {
		return fmt.Errorf("the Secure Boot off machine was not refused for Secure Boot: %v", err)
	}
	info("REFUSED as expected: %s", refused.Refusal.Reason)
	step("Done: the public tier went to anyone; the full config and a kubelet certificate only to the attested machine")
	return nil
}

// plane is a running control plane with nodeproof serve and approve.
type plane struct {
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

// startPlane starts a real etcd and kube-apiserver with the CRDs, RBAC and
// example MachineConfigs, then `nodeproof serve` (cluster mode, policy)
// and `nodeproof approve` in this process.
func startPlane(ctx context.Context, o Options, deploy, examples, policy string, po planeOptions, step, info func(string, ...any)) (*plane, error) {
	step("A Kubernetes control plane starts: real etcd and kube-apiserver %s on loopback (built by `make tools`)", testenv.KubeVersion)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// etcd and kube-apiserver die with the demo, however it dies.
	prefix, err := dieWithParent()
	if err != nil {
		return nil, err
	}
	env, err := clustertest.LaunchWith(mkdir(o.Dir, "control-plane"), clustertest.LaunchOptions{
		CRDDirs: []string{filepath.Join(deploy, "crds")}, CommandPrefix: prefix, ServingIPs: po.ServingIPs,
	})
	if err != nil {
		return nil, err
	}
	pl := &plane{stop: func() { env.Stop() }}
	fail := func(err error) (*plane, error) { pl.stop(); return nil, err }
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	cfg := env.Config
	pl.cfg = cfg
	info("API server %s, up in %s; NodeAttestation CRDs, RBAC from %s, the example MachineConfigs and pools loaded",
		cfg.Host, env.Took.Round(100*time.Millisecond), deploy)
	if pl.kc, err = kubernetes.NewForConfig(cfg); err != nil {
		return fail(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		return fail(err)
	}
	if _, err := pl.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeproof"}}, metav1.CreateOptions{}); err != nil {
		return fail(err)
	}
	tokenDir := mkdir(o.Dir, "node-bootstrapper")
	if err := clustertest.MakeNodeBootstrapper(ctx, cfg, pl.kc, tokenDir); err != nil {
		return fail(err)
	}
	for _, f := range []string{"approver/rbac.yaml", "store/rbac.yaml", "cluster/node-bootstrap-rbac.yaml"} {
		if err := kubetest.ApplyFile(ctx, c, filepath.Join(deploy, f)); err != nil {
			return fail(err)
		}
	}
	ex, err := clustertest.ReadExamples(filepath.Join(examples, "bootstrap"))
	if err != nil {
		return fail(err)
	}
	if err := ex.CreateAll(ctx, c); err != nil {
		return fail(err)
	}
	admin, approverKC := filepath.Join(o.Dir, "admin.kubeconfig"), filepath.Join(o.Dir, "approver.kubeconfig")
	if err := clustertest.WriteKubeconfig(cfg, admin, ""); err != nil {
		return fail(err)
	}
	if err := clustertest.WriteKubeconfig(cfg, approverKC, "nodeproof/nodeproof-approver"); err != nil {
		return fail(err)
	}

	step("nodeproof serve (cluster mode) and nodeproof approve start")
	klog.SetLogger(logr.Discard()) // client-go's leader election narrates through klog
	state := filepath.Join(o.Dir, "server")
	policyFile := filepath.Join(o.Dir, "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(policy), 0o600); err != nil {
		return fail(err)
	}
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
	sctx, stop := context.WithCancel(ctx)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ready := make(chan net.Addr, 1)
	served, approved := make(chan error, 1), make(chan error, 1)
	go func() {
		served <- cli.Serve(sctx, cli.ServeConfig{
			Listen: "127.0.0.1", TLSMinVersion: "VersionTLS12",
			Kubeconfig: admin, APIServerURL: apiURL, TokenDir: tokenDir,
			CertStore: "state-dir", TokenStore: "file",
			Policy: policyFile, StateDir: state, Hosts: hosts,
			TokenTTL: 10 * time.Minute, Grace: time.Hour, Reload: 10 * time.Second, Clock: o.Clock, Log: quiet,
			Ready: func(secure, _ net.Addr) { ready <- secure },
		})
	}()
	go func() {
		approved <- cli.Approve(sctx, cli.ApproveConfig{
			Kubeconfig: approverKC, StoreNamespace: "nodeproof", LeaderElect: true, LeaseNamespace: "nodeproof",
			Identity: "demo", QPS: 50, Burst: 100, Clock: o.Clock, Log: quiet,
			Policy: policyFile, Nodes: true, // the node controller: Attested condition and taint
		})
	}()
	pl.stop = func() { stop(); <-served; <-approved; env.Stop() }
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

// paths lists the file paths of an Ignition config.
func paths(cfg []byte) []string {
	var c struct {
		Storage struct {
			Files []struct {
				Path string `json:"path"`
			} `json:"files"`
		} `json:"storage"`
	}
	json.Unmarshal(cfg, &c)
	var out []string
	for _, f := range c.Storage.Files {
		out = append(out, f.Path)
	}
	slices.Sort(out)
	return out
}

// kubeletCSR does what the kubelet's bootstrap does with the kubeconfig
// in the cached config and the key file, and waits for the decision.
func kubeletCSR(ctx context.Context, admin kubernetes.Interface, cached []byte, keyFile, node string) (certv1.CertificateSigningRequestCondition, string, error) {
	var none certv1.CertificateSigningRequestCondition
	kubeconfig, err := agent.ConfigFile(cached, "/etc/kubernetes/kubeconfig")
	if err != nil {
		return none, "", err
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return none, "", fmt.Errorf("served kubeconfig: %w", err)
	}
	if _, err := clustertest.WaitWhoAmI(ctx, rc, 30*time.Second); err != nil {
		return none, "", err
	}
	k, err := keyutil.PrivateKeyFromFile(keyFile)
	if err != nil {
		return none, "", err
	}
	key := k.(crypto.Signer)
	nkc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return none, "", err
	}
	data, err := cert.MakeCSR(key, &pkix.Name{Organization: []string{"system:nodes"}, CommonName: "system:node:" + node}, nil, nil)
	if err != nil {
		return none, "", err
	}
	name, _, err := csr.RequestCertificate(nkc, data, "", certv1.KubeAPIServerClientKubeletSignerName, nil,
		[]certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, key)
	if err != nil {
		return none, "", err
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		got, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return none, "", err
		}
		if len(got.Status.Conditions) > 0 {
			return got.Status.Conditions[0], name, nil
		}
	}
	return none, name, fmt.Errorf("CSR %s undecided after a minute", name)
}
