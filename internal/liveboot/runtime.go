package liveboot

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// RuntimePackage is Debian's containerd: the container runtime the live
// boot's kubelet talks CRI to. The kubelet makes its serving CSR only
// once a runtime answered it (its serving certificate manager is made
// after the CRI connection check) and its Node carries addresses.
const RuntimePackage = "containerd"

const (
	containerdFile  = "usr/bin/containerd"
	runtimeCacheDir = "runtime"
)

// ContainerdConfig is the guest's /etc/containerd/config.toml: the CRI
// plugin with the native snapshotter (the initramfs's root is a tmpfs;
// nothing is pulled: no pod runs), no CNI (the node stays NotReady for
// want of a network, which the serving certificate does not need), and
// the plugins a VM without those file systems cannot load turned off.
//
//go:embed containerd.toml
var ContainerdConfig []byte

// Runtime is containerd, unpacked from Debian's package into the cache.
type Runtime struct {
	// Dir holds it.
	Dir string `json:"-"`
	// Version is the package's version.
	Version string `json:"version"`
	// Containerd is the daemon's file name in Dir.
	Containerd string `json:"containerd"`
}

// Path is the daemon's absolute path.
func (r *Runtime) Path() string { return filepath.Join(r.Dir, r.Containerd) }

// RuntimeHint says how to get the runtime.
const RuntimeHint = "run `make tools` (hack/tools.sh boot-chain also fetches Debian's containerd with apt-get download and unpacks it into the cache)"

// LoadRuntime reads the runtime FetchRuntime last fetched into cache.
func LoadRuntime(cache string) (*Runtime, error) {
	dir := filepath.Join(cache, runtimeCacheDir, currentLink)
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, fmt.Errorf("liveboot: the container runtime is not fetched (%v): %s", err, RuntimeHint)
	}
	r := &Runtime{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("liveboot: %s: %w (delete %s and %s)", filepath.Join(dir, manifestName), err, dir, RuntimeHint)
	}
	if r.Dir, err = filepath.EvalSymlinks(dir); err != nil {
		return nil, err
	}
	if r.Containerd == "" || strings.ContainsAny(r.Containerd, "/\\") {
		return nil, fmt.Errorf("liveboot: %s names no daemon file (delete %s and %s)", filepath.Join(dir, manifestName), r.Dir, RuntimeHint)
	}
	if _, err := os.Stat(r.Path()); err != nil {
		return nil, fmt.Errorf("liveboot: the cached container runtime lacks %s (%v): delete %s and %s", r.Path(), err, r.Dir, RuntimeHint)
	}
	return r, nil
}

// FetchRuntime downloads Debian's containerd (the version apt would
// install) with apt-get download, never installing it, unpacks the
// daemon into cache/runtime/containerd-<version> and points
// cache/runtime/current at it. A fetch already there is kept.
func FetchRuntime(ctx context.Context, cache string, say func(string, ...any)) (*Runtime, error) {
	version, err := candidate(ctx, RuntimePackage)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(cache, runtimeCacheDir)
	name := sanitize(RuntimePackage + "-" + version)
	if _, err := os.Stat(filepath.Join(root, name, manifestName)); err == nil {
		say("container runtime %s: cached", name)
		return pointRuntime(cache, root, name)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(root, ".fetch-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	say("container runtime: apt-get download %s=%s", RuntimePackage, version)
	deb, err := downloadDeb(ctx, tmp, RuntimePackage, version)
	if err != nil {
		return nil, err
	}
	out := filepath.Join(tmp, "runtime")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, err
	}
	r := &Runtime{Version: version, Containerd: filepath.Base(containerdFile)}
	if err := extract(ctx, deb, map[string]string{containerdFile: filepath.Join(out, r.Containerd)}); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Join(out, r.Containerd), 0o755); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(out, manifestName), b, 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(out, filepath.Join(root, name)); err != nil && !os.IsExist(err) {
		return nil, err
	}
	return pointRuntime(cache, root, name)
}

// pointRuntime makes root/current name and loads it.
func pointRuntime(cache, root, name string) (*Runtime, error) {
	if err := link(root, currentLink, name); err != nil {
		return nil, err
	}
	return LoadRuntime(cache)
}
