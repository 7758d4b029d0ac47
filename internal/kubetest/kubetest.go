// Package kubetest runs a real kube-apiserver and etcd for tests, through
// controller-runtime's envtest, with the binaries hack/tools.sh builds (see
// internal/testenv). It listens on loopback only, on random ports, with real
// authentication and RBAC; no controllers run (no kube-controller-manager), so
// for example an approved CSR gets no certificate unless a test signs it.
//
// Start costs a few seconds; a package with many tests can share one control
// plane by starting it in its first test and using it from subtests.
package kubetest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nodeproof/nodeproof/internal/testenv"
)

// StartTimeout bounds how long etcd and kube-apiserver may each take to come
// up. envtest's default (20 s) is tight on a 2-core machine running several
// test packages at once.
const StartTimeout = 90 * time.Second

// Start runs etcd and kube-apiserver, installs the CRDs found in crdDirs (files
// or directories; a missing path is an error), and returns an admin
// (system:masters) config. Everything stops, and its files are removed, when
// the test ends. A missing binary fails the test: run `make tools`.
func Start(t testing.TB, crdDirs ...string) *rest.Config {
	t.Helper()
	return StartWith(t, Options{}, crdDirs...)
}

// Options change how Start runs kube-apiserver.
type Options struct {
	// Production authorizes and admits as a production cluster does:
	// --authorization-mode=Node,RBAC and the NodeRestriction admission
	// plugin (a kubelet may read and write only its own Node, its pods'
	// objects, and not its own taints or labels it may not set). Without
	// it: RBAC alone, envtest's default.
	Production bool
}

// StartWith is Start with o.
func StartWith(t testing.TB, o Options, crdDirs ...string) *rest.Config {
	t.Helper()
	assets := testenv.KubebuilderAssets(t)

	// etcd's data, the apiserver's certificates and both processes' output live
	// in the test's own temporary directory: removed after Stop (t.Cleanup runs
	// last-in first-out), kept for reading when start fails.
	dir := t.TempDir()
	etcdDir := filepath.Join(dir, "etcd")
	certDir := filepath.Join(dir, "apiserver")
	for _, d := range []string{etcdDir, certDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatalf("kubetest: %v", err)
		}
	}
	apiLog := &tailBuffer{max: 64 << 10}
	etcdLog := &tailBuffer{max: 64 << 10}

	useExisting := false
	env := &envtest.Environment{
		// Never a real cluster, whatever USE_EXISTING_CLUSTER says.
		UseExistingCluster: &useExisting,
		// Explicit paths: neither KUBEBUILDER_ASSETS nor TEST_ASSET_* in the
		// environment can swap in other binaries than the ones we built.
		BinaryAssetsDirectory: assets,
		ControlPlane: envtest.ControlPlane{
			APIServer: &envtest.APIServer{
				Path:    filepath.Join(assets, "kube-apiserver"),
				CertDir: certDir,
				Out:     apiLog,
				Err:     apiLog,
			},
			Etcd: &envtest.Etcd{
				Path:    filepath.Join(assets, "etcd"),
				DataDir: etcdDir,
				Out:     etcdLog,
				Err:     etcdLog,
			},
		},
		CRDDirectoryPaths:        crdDirs,
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: StartTimeout,
		ControlPlaneStopTimeout:  30 * time.Second,
	}

	if o.Production {
		args := env.ControlPlane.APIServer.Configure()
		args.Set("authorization-mode", "Node,RBAC")
		args.Set("enable-admission-plugins", "NodeRestriction")
	}
	start := time.Now()
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		t.Fatalf("kubetest: starting envtest (kube-apiserver %s, etcd %s): %v\n--- kube-apiserver output (tail) ---\n%s\n--- etcd output (tail) ---\n%s",
			testenv.KubeVersion, testenv.EtcdVersion, err, apiLog.String(), etcdLog.String())
	}
	t.Logf("kubetest: kube-apiserver %s at %s, %d CRD(s), started in %s",
		testenv.KubeVersion, cfg.Host, len(env.CRDs), time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		start := time.Now()
		if err := env.Stop(); err != nil {
			t.Errorf("kubetest: stopping envtest: %v", err)
			return
		}
		t.Logf("kubetest: stopped in %s", time.Since(start).Round(time.Millisecond))
	})
	return cfg
}

// Scheme returns a scheme with the built-in Kubernetes types and OpenShift's
// machineconfiguration.openshift.io/v1 types (MachineConfig, MachineConfigPool,
// ControllerConfig, ...), for controller-runtime clients in tests.
func Scheme(t testing.TB) *kruntime.Scheme {
	t.Helper()
	s := kruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	if err := mcfgv1.AddToScheme(s); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	return s
}

const (
	openshiftAPI = "github.com/openshift/api"
	// Where the openshift/api module keeps the machineconfiguration/v1 CRDs.
	mcoCRDDir = "machineconfiguration/v1/zz_generated.crd-manifests"
)

// The CRDs OpenShiftCRDs copies, by plural resource name. Where the module has
// one file per feature set (Default, TechPreviewNoUpgrade, ...), the Default
// one is taken.
var openshiftCRDs = []string{"machineconfigs", "machineconfigpools", "controllerconfigs"}

// OpenShiftCRDs returns a new temporary directory holding the MachineConfig,
// MachineConfigPool and ControllerConfig CRDs, copied from the very
// github.com/openshift/api module version this test binary was compiled with
// (so the CRD schemas match the Go types the test uses). Pass it to Start.
func OpenShiftCRDs(t testing.TB) string {
	t.Helper()
	dst := t.TempDir()
	if err := CopyOpenShiftCRDs(dst); err != nil {
		t.Fatal(err)
	}
	return dst
}

// CopyOpenShiftCRDs is OpenShiftCRDs for programs (the demo): it copies the
// CRDs into dst.
func CopyOpenShiftCRDs(dst string) error {
	modDir, err := openshiftAPIDir()
	if err != nil {
		return fmt.Errorf("kubetest: locating the %s module: %w", openshiftAPI, err)
	}
	src := filepath.Join(modDir, filepath.FromSlash(mcoCRDDir))
	for _, name := range openshiftCRDs {
		file, err := pickCRD(src, name)
		if err != nil {
			return fmt.Errorf("kubetest: %w", err)
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("kubetest: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dst, filepath.Base(file)), data, 0o644); err != nil {
			return fmt.Errorf("kubetest: %w", err)
		}
	}
	return nil
}

// pickCRD finds the file for one resource: "<anything>_<plural>-Default.crd.yaml"
// if the module splits it by feature set, otherwise "<anything>_<plural>.crd.yaml".
func pickCRD(dir, plural string) (string, error) {
	for _, pattern := range []string{"*_" + plural + "-Default.crd.yaml", "*_" + plural + ".crd.yaml"} {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return "", err
		}
		switch len(m) {
		case 0:
			continue
		case 1:
			return m[0], nil
		default:
			return "", fmt.Errorf("several CRD files for %s in %s: %v", plural, dir, m)
		}
	}
	return "", fmt.Errorf("no CRD file for %s in %s", plural, dir)
}

var (
	modDirOnce sync.Once
	modDir     string
	modDirErr  error
)

// openshiftAPIDir finds the openshift/api module's directory:
//
//  1. From the source position the compiler recorded for a function of
//     machineconfiguration/v1, which this package links: an absolute path
//     into the module cache (or into a local `replace` directory), or, when
//     built with -trimpath, "<module>@<version>/..." which is looked up under
//     $GOMODCACHE (else `go env GOMODCACHE`). This is exactly the version whose
//     Go types the test compiles against, needs no subprocess in the common
//     case, and does not depend on the working directory. (runtime/debug's
//     build info would be the obvious source, but test binaries carry no
//     module dependency list.)
//  2. `go mod download -json github.com/openshift/api` from the working
//     directory (a test runs in its package directory, inside the main
//     module): the version in go.mod, fetched if the cache was cleaned.
func openshiftAPIDir() (string, error) {
	modDirOnce.Do(func() { modDir, modDirErr = findOpenShiftAPIDir() })
	return modDir, modDirErr
}

func findOpenShiftAPIDir() (string, error) {
	has := func(dir string) bool {
		fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(mcoCRDDir)))
		return err == nil && fi.IsDir()
	}
	var tried []string

	dir, version, err := openshiftAPIFromSource()
	if err != nil {
		tried = append(tried, err.Error())
	} else if has(dir) {
		return dir, nil
	} else {
		tried = append(tried, dir+": no "+mcoCRDDir)
	}

	query := openshiftAPI // the go.mod version, from a test's package directory
	if version != "" {
		query += "@" + version // the compiled-in version, from anywhere
	}
	out, err := goCmd("mod", "download", "-json", query)
	if dir := jsonDir(out); err == nil && dir != "" && has(dir) {
		return dir, nil
	}
	tried = append(tried, fmt.Sprintf("go mod download %s: %v", query, err))
	return "", errors.New(strings.Join(tried, "; "))
}

// openshiftAPIFromSource derives the module directory, and its version where
// the path shows it, from the file the compiler recorded for mcfgv1.Resource
// (machineconfiguration/v1/register.go).
func openshiftAPIFromSource() (dir, version string, err error) {
	fn := runtime.FuncForPC(reflect.ValueOf(mcfgv1.Resource).Pointer())
	if fn == nil {
		return "", "", errors.New("no runtime information for mcfgv1.Resource")
	}
	file, _ := fn.FileLine(fn.Entry())
	file = filepath.ToSlash(file)
	const pkgSuffix = "/machineconfiguration/v1"
	pkgDir := path.Dir(file)
	if !strings.HasSuffix(pkgDir, pkgSuffix) {
		return "", "", fmt.Errorf("mcfgv1.Resource compiled from %s, not from .../machineconfiguration/v1", file)
	}
	modRoot := strings.TrimSuffix(pkgDir, pkgSuffix)
	// ".../github.com/openshift/api@<escaped version>" in the module cache, or
	// "github.com/openshift/api@<version>" with -trimpath; a local replace
	// directory has no version.
	if _, v, ok := strings.Cut(path.Base(modRoot), "@"); ok {
		version = unescapeModule(v)
	}
	if path.IsAbs(modRoot) {
		return filepath.FromSlash(modRoot), version, nil
	}
	if version == "" {
		return "", "", fmt.Errorf("mcfgv1.Resource compiled from %s (trimmed, no module version)", file)
	}
	cache, err := goModCache()
	if err != nil {
		return "", version, err
	}
	ep, err1 := escapeModule(openshiftAPI)
	ev, err2 := escapeModule(version)
	if err := errors.Join(err1, err2); err != nil {
		return "", version, err
	}
	return filepath.Join(cache, filepath.FromSlash(ep)+"@"+ev), version, nil
}

func goModCache() (string, error) {
	if c := os.Getenv("GOMODCACHE"); c != "" {
		return c, nil
	}
	out, err := goCmd("env", "GOMODCACHE")
	if c := strings.TrimSpace(out); err == nil && c != "" {
		return c, nil
	}
	return "", fmt.Errorf("go env GOMODCACHE: %v", err)
}

func goCmd(args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("go", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// jsonDir pulls "Dir" out of `go mod download -json` output without a JSON
// schema of our own.
func jsonDir(out string) string {
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, `"Dir": "`); ok {
			return strings.TrimSuffix(strings.TrimSuffix(v, ","), `"`)
		}
	}
	return ""
}

// escapeModule applies the module cache's case encoding (golang.org/x/mod's
// module.EscapePath / EscapeVersion): every upper-case letter becomes '!'
// followed by its lower-case form.
func escapeModule(s string) (string, error) {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '!' || r >= 0x80:
			return "", fmt.Errorf("cannot escape %q", s)
		case 'A' <= r && r <= 'Z':
			b.WriteByte('!')
			b.WriteRune(r + ('a' - 'A'))
		default:
			b.WriteRune(r)
		}
	}
	if path.Clean(b.String()) != b.String() {
		return "", fmt.Errorf("cannot escape %q", s)
	}
	return b.String(), nil
}

func unescapeModule(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '!' && i+1 < len(s) && 'a' <= s[i+1] && s[i+1] <= 'z' {
			b.WriteByte(s[i+1] - ('a' - 'A'))
			i++
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// tailBuffer keeps the last max bytes written to it (a control plane's output,
// shown only when it fails to start).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
