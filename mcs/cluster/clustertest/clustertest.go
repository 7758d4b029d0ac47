// Package clustertest runs a real kube-apiserver for cluster-mode tests:
// internal/kubetest's control plane (envtest, the binaries `make tools`
// builds, loopback only, RBAC) plus bootstrap token authentication
// (--enable-bootstrap-token-auth), which kubetest.Start does not turn on
// and which per-node bootstrap tokens need. It also loads the example
// MCO objects into it and asks the API server who a config authenticates
// as.
//
// No kube-controller-manager runs: nothing deletes expired bootstrap
// token Secrets (its tokencleaner) — the API server itself refuses them.
package clustertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// Start runs etcd and kube-apiserver with bootstrap token authentication
// and the MachineConfig, MachineConfigPool and ControllerConfig CRDs, and
// returns an admin (system:masters) config; more CRDs (files or
// directories, e.g. deploy/crds) are installed from crdDirs. Everything
// stops when the test ends. A missing binary fails the test: run `make
// tools`.
func Start(t testing.TB, crdDirs ...string) *rest.Config {
	t.Helper()
	e, err := Launch(t.TempDir(), crdDirs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clustertest: kube-apiserver %s at %s (bootstrap token auth), started in %s",
		testenv.KubeVersion, e.Config.Host, e.Took.Round(time.Millisecond))
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("clustertest: stopping envtest: %v", err)
		}
	})
	return e.Config
}

// Env is a running control plane (Launch).
type Env struct {
	Config *rest.Config
	// Took is how long it took to start.
	Took time.Duration
	env  *envtest.Environment
}

// Stop stops etcd and kube-apiserver.
func (e *Env) Stop() error { return e.env.Stop() }

// Launch is Start for programs (the demo, bench/fleet): the control
// plane's files go under dir, and the caller stops it.
func Launch(dir string, crdDirs ...string) (*Env, error) {
	return LaunchWith(dir, LaunchOptions{CRDDirs: crdDirs})
}

// LaunchOptions are LaunchWith's.
type LaunchOptions struct {
	// CRDDirs are more CRDs to install (files or directories, e.g.
	// deploy/crds).
	CRDDirs []string
	// CommandPrefix, when set, runs etcd and kube-apiserver as this command
	// followed by the binary and its arguments: e.g. setpriv --pdeathsig
	// KILL --, so that they die with the program however it dies. envtest
	// starts each binary by path, with arguments and process attributes of
	// its own, so each runs through a script in dir/bin that execs the
	// prefix; the prefix must exec the binary in turn (keeping the process
	// ID), for envtest's signals to reach it.
	CommandPrefix []string
	// ServingIPs are more addresses the API server's serving certificate
	// names, besides localhost and 127.0.0.1: where a client reaches it
	// through a relay (a VM's guest through QEMU's guestfwd). The API
	// server still listens on loopback only.
	ServingIPs []net.IP
	// Signer, when set, is the API server's client CA and issues the
	// certificates of approved kubelet CSRs once its Run runs
	// (StartSigning).
	Signer *Signer
	// Bare installs no CRD at all, not even the MCO's: a plain cluster,
	// on which the caller applies them as an operator does.
	Bare bool
	// Production authorizes and admits as a production cluster does
	// (kubetest.Options.Production): --authorization-mode=Node,RBAC and
	// the NodeRestriction admission plugin, so that a real kubelet may
	// register its own Node and request its certificates.
	Production bool
}

// LaunchWith is Launch with options.
func LaunchWith(dir string, o LaunchOptions) (*Env, error) {
	// controller-runtime's informers log through its package logger, which
	// warns with a stack trace when it was never set.
	ctrllog.SetLogger(logr.Discard())
	assets, err := testenv.AssetsDir()
	if err != nil {
		return nil, err
	}
	etcdDir, certDir, crds := filepath.Join(dir, "etcd"), filepath.Join(dir, "apiserver"), filepath.Join(dir, "openshift-crds")
	for _, d := range []string{etcdDir, certDir, crds} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("clustertest: %w", err)
		}
	}
	crdDirs := append([]string{crds}, o.CRDDirs...)
	if o.Bare {
		crdDirs = nil
	} else if err := kubetest.CopyOpenShiftCRDs(crds); err != nil {
		return nil, err
	}
	apiserver, etcd := filepath.Join(assets, "kube-apiserver"), filepath.Join(assets, "etcd")
	if len(o.CommandPrefix) > 0 {
		bin := filepath.Join(dir, "bin")
		if err := os.Mkdir(bin, 0o700); err != nil {
			return nil, fmt.Errorf("clustertest: %w", err)
		}
		if apiserver, err = wrap(bin, o.CommandPrefix, apiserver); err != nil {
			return nil, err
		}
		if etcd, err = wrap(bin, o.CommandPrefix, etcd); err != nil {
			return nil, err
		}
	}
	out := new(tail)
	api := &envtest.APIServer{Path: apiserver, CertDir: certDir, Out: out, Err: out}
	if len(o.ServingIPs) > 0 {
		if api.SecureServing.CA, err = servingCerts(certDir, o.ServingIPs); err != nil {
			return nil, err
		}
	}
	api.Configure().Set("enable-bootstrap-token-auth", "true")
	if o.Production {
		api.Configure().Set("authorization-mode", "Node,RBAC")
		api.Configure().Set("enable-admission-plugins", "NodeRestriction")
	}
	if o.Signer != nil {
		api.SecureServing.Authn = o.Signer
	}
	no := false
	env := &envtest.Environment{
		UseExistingCluster:    &no,
		BinaryAssetsDirectory: assets,
		ControlPlane: envtest.ControlPlane{
			APIServer: api,
			Etcd:      &envtest.Etcd{Path: etcd, DataDir: etcdDir, Out: out, Err: out},
		},
		CRDDirectoryPaths:        crdDirs,
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: kubetest.StartTimeout,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	start := time.Now()
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("clustertest: starting envtest: %w\n--- output (tail) ---\n%s", err, out)
	}
	return &Env{Config: cfg, Took: time.Since(start), env: env}, nil
}

// wrap writes dir/<name of bin>, a shell script that execs prefix with bin
// and the script's arguments, and returns its path.
func wrap(dir string, prefix []string, bin string) (string, error) {
	script := "#!/bin/sh\nexec"
	for _, arg := range append(slices.Clone(prefix), bin) {
		script += " '" + strings.ReplaceAll(arg, "'", `'\''`) + "'"
	}
	script += ` "$@"` + "\n"
	path := filepath.Join(dir, filepath.Base(bin))
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		return "", fmt.Errorf("clustertest: %w", err)
	}
	return path, nil
}

// Examples are the objects of an MCO bootstrap directory, decoded.
type Examples struct {
	Pools   []*mcfgv1.MachineConfigPool
	Configs []*mcfgv1.MachineConfig
	CC      *mcfgv1.ControllerConfig
}

// LoadExamples decodes the YAML files of an MCO bootstrap directory
// (deploy/examples/bootstrap).
func LoadExamples(t testing.TB, dir string) *Examples {
	t.Helper()
	ex, err := ReadExamples(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// ReadExamples is LoadExamples for programs (the demo).
func ReadExamples(dir string) (*Examples, error) {
	ex := new(Examples)
	each := func(sub string, fn func([]byte) error) error {
		files, err := filepath.Glob(filepath.Join(dir, sub, "*.yaml"))
		if err != nil || len(files) == 0 {
			return fmt.Errorf("clustertest: no YAML in %s/%s: %v", dir, sub, err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err == nil {
				err = fn(b)
			}
			if err != nil {
				return fmt.Errorf("clustertest: %s: %w", f, err)
			}
		}
		return nil
	}
	return ex, errors.Join(
		each("machine-pools", func(b []byte) error {
			p := new(mcfgv1.MachineConfigPool)
			ex.Pools = append(ex.Pools, p)
			return yaml.Unmarshal(b, p)
		}),
		each("machine-configs", func(b []byte) error {
			c := new(mcfgv1.MachineConfig)
			ex.Configs = append(ex.Configs, c)
			return yaml.Unmarshal(b, c)
		}),
		each("controller-config", func(b []byte) error {
			ex.CC = new(mcfgv1.ControllerConfig)
			return yaml.Unmarshal(b, ex.CC)
		}))
}

// Create creates the objects, as the MCO would have: MachineConfigs and
// the ControllerConfig, then pools, whose status is written through the
// status subresource.
func (ex *Examples) Create(ctx context.Context, t testing.TB, c client.Client) {
	t.Helper()
	if err := ex.CreateAll(ctx, c); err != nil {
		t.Fatal(err)
	}
}

// CreateAll is Create for programs (the demo).
func (ex *Examples) CreateAll(ctx context.Context, c client.Client) error {
	for _, mc := range ex.Configs {
		if err := createConfig(ctx, c, mc); err != nil {
			return err
		}
	}
	if err := createControllerConfig(ctx, c, ex.CC); err != nil {
		return err
	}
	for _, p := range ex.Pools {
		if err := createPool(ctx, c, p); err != nil {
			return err
		}
	}
	return nil
}

// CreateBackwards creates the objects in the order least kind to a server
// that watches them: the pools (with status) first, then the rendered
// MachineConfigs they name, then their source MachineConfigs, the
// ControllerConfig last. After each of the four stages it calls pause
// (nil: none), so that a test can look at the server in between.
func (ex *Examples) CreateBackwards(ctx context.Context, c client.Client, pause func(stage string)) error {
	if pause == nil {
		pause = func(string) {}
	}
	for _, p := range ex.Pools {
		if err := createPool(ctx, c, p); err != nil {
			return err
		}
	}
	pause("pools")
	rendered := func(mc *mcfgv1.MachineConfig) bool {
		for _, o := range mc.OwnerReferences {
			if o.Kind == "MachineConfigPool" {
				return true
			}
		}
		return false
	}
	for _, want := range []bool{true, false} {
		for _, mc := range ex.Configs {
			if rendered(mc) == want {
				if err := createConfig(ctx, c, mc); err != nil {
					return err
				}
			}
		}
		pause(map[bool]string{true: "rendered configs", false: "source configs"}[want])
	}
	if err := createControllerConfig(ctx, c, ex.CC); err != nil {
		return err
	}
	pause("controller config")
	return nil
}

func createConfig(ctx context.Context, c client.Client, mc *mcfgv1.MachineConfig) error {
	if err := c.Create(ctx, mc.DeepCopy()); err != nil {
		return fmt.Errorf("clustertest: create MachineConfig %s: %w", mc.Name, err)
	}
	return nil
}

func createControllerConfig(ctx context.Context, c client.Client, cc *mcfgv1.ControllerConfig) error {
	if err := c.Create(ctx, cc.DeepCopy()); err != nil {
		return fmt.Errorf("clustertest: create ControllerConfig: %w", err)
	}
	return nil
}

// createPool creates p and writes its status through the status
// subresource, as the MCO does.
func createPool(ctx context.Context, c client.Client, p *mcfgv1.MachineConfigPool) error {
	obj := p.DeepCopy()
	if err := c.Create(ctx, obj); err != nil {
		return fmt.Errorf("clustertest: create MachineConfigPool %s: %w", p.Name, err)
	}
	obj.Status = p.Status
	if obj.Status.Conditions == nil {
		obj.Status.Conditions = []mcfgv1.MachineConfigPoolCondition{}
	}
	if obj.Status.CertExpirys == nil {
		obj.Status.CertExpirys = []mcfgv1.CertExpiry{}
	}
	if err := c.Status().Update(ctx, obj); err != nil {
		return fmt.Errorf("clustertest: MachineConfigPool %s status: %w", p.Name, err)
	}
	return nil
}

// AdminKubeconfig writes cfg (envtest's admin user) as a kubeconfig file.
func AdminKubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := WriteKubeconfig(cfg, f, ""); err != nil {
		t.Fatal(err)
	}
	return f
}

// WriteKubeconfig writes cfg (envtest's admin user) as a kubeconfig file;
// with a namespace/name in serviceAccount, the kubeconfig impersonates that
// service account.
func WriteKubeconfig(cfg *rest.Config, file, serviceAccount string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	user := &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	if ns, name, ok := strings.Cut(serviceAccount, "/"); ok {
		user.Impersonate = "system:serviceaccount:" + ns + ":" + name
		user.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	kc.AuthInfos["user"] = user
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "user"}
	kc.CurrentContext = "envtest"
	return clientcmd.WriteToFile(*kc, file)
}

// ServiceAccountKubeconfig writes a kubeconfig that acts as the service account
// namespace/name (admin credentials impersonating it), so RBAC applies as
// to that service account.
func ServiceAccountKubeconfig(t testing.TB, cfg *rest.Config, namespace, name string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := WriteKubeconfig(cfg, f, namespace+"/"+name); err != nil {
		t.Fatal(err)
	}
	return f
}

// NodeBootstrapperSecret makes the node-bootstrapper service account the
// OpenShift MCS mounts, and writes its token and the API server's CA where
// the secret would be mounted.
func NodeBootstrapperSecret(t testing.TB, ctx context.Context, cfg *rest.Config, kc kubernetes.Interface) string {
	t.Helper()
	dir := t.TempDir()
	if err := MakeNodeBootstrapper(ctx, cfg, kc, dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// MakeNodeBootstrapper is NodeBootstrapperSecret for programs (the demo):
// the secret's files go into dir.
func MakeNodeBootstrapper(ctx context.Context, cfg *rest.Config, kc kubernetes.Interface, dir string) error {
	ns := "openshift-machine-config-operator"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "node-bootstrapper"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "node-bootstrapper", &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	for name, b := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": cfg.CAData} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// WhoAmI asks the API server who cfg authenticates as (a
// SelfSubjectReview, what `kubectl auth whoami` does).
func WhoAmI(ctx context.Context, cfg *rest.Config) (authnv1.UserInfo, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return authnv1.UserInfo{}, err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return authnv1.UserInfo{}, err
	}
	return r.Status.UserInfo, nil
}

// WaitWhoAmI retries WhoAmI until it succeeds or timeout passes: the API
// server's bootstrap token authenticator reads Secrets from an informer,
// so a new token authenticates a moment after it was created.
func WaitWhoAmI(ctx context.Context, cfg *rest.Config, timeout time.Duration) (authnv1.UserInfo, error) {
	deadline := time.Now().Add(timeout)
	for {
		u, err := WhoAmI(ctx, cfg)
		if err == nil || time.Now().After(deadline) {
			return u, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tail keeps the last 64 KiB of the control plane's output.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tail) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - 64<<10; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tail) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(string(b.buf))
}

var _ fmt.Stringer = (*tail)(nil)
