package demo

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// controlPlane is clustertest.Launch's control plane (etcd and
// kube-apiserver from `make tools`, bootstrap token authentication, the
// OpenShift CRDs and crdDirs), with both binaries started through
// dieWithParent: envtest sets their process attributes itself, and a demo
// killed outright must not leave them running.
type controlPlane struct {
	Config *rest.Config
	Took   time.Duration
	env    *envtest.Environment
}

// Stop stops etcd and kube-apiserver and waits for them.
func (c *controlPlane) Stop() error { return c.env.Stop() }

func launchControlPlane(dir string, crdDirs ...string) (*controlPlane, error) {
	// controller-runtime's informers log through its package logger, which
	// warns with a stack trace when it was never set.
	ctrllog.SetLogger(logr.Discard())
	assets, err := testenv.AssetsDir()
	if err != nil {
		return nil, err
	}
	etcdDir, certDir, crds, bin := filepath.Join(dir, "etcd"), filepath.Join(dir, "apiserver"), filepath.Join(dir, "openshift-crds"), filepath.Join(dir, "bin")
	for _, d := range []string{etcdDir, certDir, crds, bin} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
	}
	if err := kubetest.CopyOpenShiftCRDs(crds); err != nil {
		return nil, err
	}
	apiserver, err := dieWithParent(bin, filepath.Join(assets, "kube-apiserver"))
	if err != nil {
		return nil, err
	}
	etcd, err := dieWithParent(bin, filepath.Join(assets, "etcd"))
	if err != nil {
		return nil, err
	}
	out := new(tail)
	api := &envtest.APIServer{Path: apiserver, CertDir: certDir, Out: out, Err: out}
	api.Configure().Set("enable-bootstrap-token-auth", "true")
	no := false
	env := &envtest.Environment{
		UseExistingCluster:    &no,
		BinaryAssetsDirectory: assets,
		ControlPlane: envtest.ControlPlane{
			APIServer: api,
			Etcd:      &envtest.Etcd{Path: etcd, DataDir: etcdDir, Out: out, Err: out},
		},
		CRDDirectoryPaths:        append([]string{crds}, crdDirs...),
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: kubetest.StartTimeout,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	start := time.Now()
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("demo: starting the control plane: %w\n--- output (tail) ---\n%s", err, out)
	}
	return &controlPlane{Config: cfg, Took: time.Since(start), env: env}, nil
}

// tail keeps the last 64 KiB written to it.
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
