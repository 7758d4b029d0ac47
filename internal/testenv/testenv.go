// Package testenv locates the real parts that nodeproof's tests run against —
// the Ignition client, kube-apiserver, kubectl and etcd — which hack/tools.sh (`make
// tools`) builds from the Go module mirror and caches by version.
//
// A missing binary fails the test with a message that says what to run; it
// never skips, so a test run cannot silently pass without the real parts.
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodeproof/nodeproof/internal/freeport"
)

// Versions of the cached tools. They must match hack/tools.sh (a test checks).
const (
	IgnitionVersion = "v2.24.0"
	KubeVersion     = "v1.34.4"
	EtcdVersion     = "v3.6.4"
)

// Cache is the directory hack/tools.sh builds into:
// $NODEPROOF_CACHE, or $HOME/.cache/nodeproof.
func Cache() string {
	if dir := os.Getenv("NODEPROOF_CACHE"); dir != "" {
		return dir
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		// hack/tools.sh would fail the same way ($HOME unset); keep a
		// deterministic answer so the failure message names a path.
		home = "/nonexistent-home"
	}
	return filepath.Join(home, ".cache", "nodeproof")
}

// IgnitionBinary is the path of the real Ignition client (built with
// selinuxRelabel=false, so `-stage files -root DIR` works unprivileged).
func IgnitionBinary(t testing.TB) string {
	t.Helper()
	p, err := IgnitionPath()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// IgnitionPath is IgnitionBinary for programs (the demo): an error that
// says to run `make tools` instead of failing a test.
func IgnitionPath() (string, error) {
	p := filepath.Join(Cache(), "bin", "ignition-"+IgnitionVersion, "ignition")
	return p, executable("ignition "+IgnitionVersion, p)
}

// KubebuilderAssets is the directory holding kube-apiserver and etcd, in the
// layout controller-runtime's envtest expects (BinaryAssetsDirectory or
// KUBEBUILDER_ASSETS).
func KubebuilderAssets(t testing.TB) string {
	t.Helper()
	dir, err := AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// AssetsDir is KubebuilderAssets for programs (the demo).
func AssetsDir() (string, error) {
	dir := filepath.Join(Cache(), "bin", "kubebuilder-assets-"+KubeVersion)
	if err := executable("kube-apiserver "+KubeVersion, filepath.Join(dir, "kube-apiserver")); err != nil {
		return "", err
	}
	return dir, executable("etcd "+EtcdVersion, filepath.Join(dir, "etcd"))
}

// Kubectl is the path of kubectl, built from the same Kubernetes release as
// kube-apiserver (deploy/'s `kubectl apply --dry-run=server -k` test).
func Kubectl(t testing.TB) string {
	t.Helper()
	p, err := KubectlPath()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// KubectlPath is Kubectl for programs (the demo).
func KubectlPath() (string, error) {
	p := filepath.Join(Cache(), "bin", "kubectl-"+KubeVersion, "kubectl")
	return p, executable("kubectl "+KubeVersion, p)
}

// KubeletPath is the statically linked kubelet hack/tools.sh builds (the
// live boot's guest runs it).
func KubeletPath() (string, error) {
	p := filepath.Join(Cache(), "bin", "kubelet-"+KubeVersion, "kubelet")
	return p, executable("kubelet "+KubeVersion, p)
}

// KubeControllerManagerPath is the kube-controller-manager hack/tools.sh
// builds (the live boot's CSR signer).
func KubeControllerManagerPath() (string, error) {
	p := filepath.Join(Cache(), "bin", "kube-controller-manager-"+KubeVersion, "kube-controller-manager")
	return p, executable("kube-controller-manager "+KubeVersion, p)
}

func mustExecutable(t testing.TB, what, path string) {
	t.Helper()
	if err := executable(what, path); err != nil {
		t.Fatal(err)
	}
}

func executable(what, path string) error {
	fi, err := os.Stat(path) // follows the kubebuilder-assets symlinks
	switch {
	case err != nil:
		return fmt.Errorf("%s is not built (%v): run `make tools` (hack/tools.sh) first", what, err)
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("%s at %s is not an executable file: delete it and run `make tools` (hack/tools.sh)", what, path)
	}
	return nil
}

// FreePort is a loopback TCP port free a moment ago (for a process that
// takes its port as a flag), drawn below the ephemeral range
// (freeport.One) so no ":0" or outgoing connection takes it before the
// process binds it.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freeport.One()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
