// Package liveboot boots a real machine for tests and the demo: a QEMU VM
// (TCG) with OVMF's Secure Boot firmware, Debian's Microsoft-signed shim,
// Debian's signed GRUB and signed kernel, measured into swtpm, and an
// initramfs holding the node's programs. It owns the parts (fetched from
// Debian's packages, never installed), the images (the initramfs and a GPT
// disk with one EFI system partition) and the VM (swtpm per boot, QEMU,
// the serial console). What runs in the guest is the caller's: it hands
// the initramfs its files and reads the console and the data disk back.
//
// Everything here shells out to Debian's tools (apt-get, dpkg-deb, sfdisk,
// mkfs.vfat, mcopy, busybox, qemu-system-x86_64, swtpm) that hack/deps.sh
// installs; a missing one is an error that says how to install it.
package liveboot

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/nodeproof/nodeproof/fsutil"
)

// Debian packages of the boot chain, and the files taken from them.
const (
	ShimPackage   = "shim-signed"
	GrubPackage   = "grub-efi-amd64-signed"
	KernelMeta    = "linux-image-amd64" // depends on the current ABI's signed image
	StubPackage   = "systemd-boot-efi"  // systemd-stub, the UKI's EFI program (unsigned)
	shimFile      = "usr/lib/shim/shimx64.efi.signed"
	grubFile      = "usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed"
	stubFile      = "usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	manifestName  = "manifest.json"
	currentLink   = "current"
	partsCacheDir = "boot"
)

// GuestModules are the kernel modules the guest loads (with what they
// depend on): the virtio PCI transport, network and block devices, the
// EFI variable file system, and QEMU's fw_cfg (how the host tells a boot
// what to do). The TPM (CRB) driver and securityfs are built in.
var GuestModules = []string{"virtio_pci", "virtio_net", "virtio_blk", "efivarfs", "qemu_fw_cfg"}

// Parts are the boot chain, unpacked from Debian's packages into the
// cache: the files as the packages ship them, byte for byte.
type Parts struct {
	// Dir holds them.
	Dir string `json:"-"`
	// ABI is the kernel's ABI (e.g. 6.1.0-56-amd64), as linux-image-amd64
	// depended on when they were fetched.
	ABI string `json:"abi"`
	// Packages maps each package to its version.
	Packages map[string]string `json:"packages"`
	// Shim, Grub and Kernel are file names in Dir: shimx64.efi.signed,
	// grubx64.efi.signed, vmlinuz-<ABI>.
	Shim   string `json:"shim"`
	Grub   string `json:"grub"`
	Kernel string `json:"kernel"`
	// Stub is systemd-stub (linuxx64.efi.stub, from systemd-boot-efi):
	// the EFI program a unified kernel image (BuildUKI) is made of. Debian
	// ships it unsigned. Empty in parts of only a kernel
	// (LoadPreviousKernel).
	Stub string `json:"stub,omitempty"`
	// Modules are the guest's kernel modules, dependencies first (load
	// them in this order), as file names under Dir/modules.
	Modules []string `json:"modules"`
}

// Path is the absolute path of a file of the parts (an absolute name is
// its own path: parts that mix files from several places, WithKernel).
func (p *Parts) Path(name string) string {
	if filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(p.Dir, name)
}

// ModulePaths are the module files in load order.
func (p *Parts) ModulePaths() []string {
	out := make([]string, len(p.Modules))
	for i, m := range p.Modules {
		out[i] = m
		if !filepath.IsAbs(m) {
			out[i] = filepath.Join(p.Dir, "modules", m)
		}
	}
	return out
}

// PartsHint says how to get the parts.
const PartsHint = "run `make tools` (hack/tools.sh boot-chain: Debian's signed shim, GRUB and kernel and systemd-stub, downloaded with apt-get download and unpacked into the cache)"

// LoadParts reads the parts last fetched into cache (hack/tools.sh's
// cache directory).
func LoadParts(cache string) (*Parts, error) {
	return loadManifest(filepath.Join(cache, partsCacheDir, currentLink), "the boot chain", true)
}

// loadManifest reads the parts fetched into dir (what says "what" in its
// errors), checking every file is there: the shim, GRUB and the stub too
// when chain. A chain fetched before the stub was one of its parts (its
// manifest names none) is refused with how to fetch it again.
func loadManifest(dir, what string, chain bool) (*Parts, error) {
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, fmt.Errorf("liveboot: %s is not fetched (%v): %s", what, err, PartsHint)
	}
	p := &Parts{}
	if err := json.Unmarshal(b, p); err != nil {
		return nil, fmt.Errorf("liveboot: %s: %w (delete %s and %s)", filepath.Join(dir, manifestName), err, dir, PartsHint)
	}
	if p.Dir, err = filepath.EvalSymlinks(dir); err != nil {
		return nil, err
	}
	files := append([]string{p.Path(p.Kernel)}, p.ModulePaths()...)
	if chain {
		if p.Shim == "" || p.Grub == "" || p.Stub == "" {
			return nil, fmt.Errorf("liveboot: %s in the cache (%s) was fetched before systemd-stub was one of its parts (its manifest names no shim, GRUB or stub): %s", what, p.Dir, PartsHint)
		}
		files = append(files, p.Path(p.Shim), p.Path(p.Grub), p.Path(p.Stub))
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("liveboot: the cached %s lacks %s (%v): delete %s and %s", what, f, err, p.Dir, PartsHint)
		}
	}
	return p, nil
}

// FetchParts looks the kernel's ABI up (apt-cache depends
// linux-image-amd64), downloads the four packages with apt-get download
// (never installing them: no maintainer script runs on this machine),
// unpacks the shim, GRUB, systemd-stub, the kernel and the guest's modules
// (found by name, their dependencies read from each module's depends=, no
// depmod) into cache/boot/<ABI>-<versions>, and points cache/boot/current
// at it. A fetch already there is kept. say gets one line per step.
func FetchParts(ctx context.Context, cache string, say func(string, ...any)) (*Parts, error) {
	abi, err := kernelABI(ctx)
	if err != nil {
		return nil, err
	}
	kernelPkg := "linux-image-" + abi
	versions := map[string]string{}
	pkgs := []string{ShimPackage, GrubPackage, StubPackage, kernelPkg}
	for _, pkg := range pkgs {
		v, err := candidate(ctx, pkg)
		if err != nil {
			return nil, err
		}
		versions[pkg] = v
	}
	name := sanitize(fmt.Sprintf("%s_shim-%s_grub-%s_stub-%s_linux-%s", abi, versions[ShimPackage], versions[GrubPackage], versions[StubPackage], versions[kernelPkg]))
	root := filepath.Join(cache, partsCacheDir)
	dir := filepath.Join(root, name)
	if _, err := os.Stat(filepath.Join(dir, manifestName)); err == nil {
		say("boot chain %s: cached (%s)", name, dir)
		return point(root, name)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(root, ".fetch-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	debs := filepath.Join(tmp, "debs")
	if err := os.Mkdir(debs, 0o755); err != nil {
		return nil, err
	}
	args := []string{"download"}
	for _, pkg := range pkgs {
		args = append(args, pkg+"="+versions[pkg])
	}
	say("boot chain: apt-get %s", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, "apt-get", args...)
	cmd.Dir = debs
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("liveboot: apt-get %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	out := filepath.Join(tmp, "parts")
	if err := os.MkdirAll(filepath.Join(out, "modules"), 0o755); err != nil {
		return nil, err
	}
	p := &Parts{ABI: abi, Packages: versions, Shim: path.Base(shimFile), Grub: path.Base(grubFile), Stub: path.Base(stubFile), Kernel: "vmlinuz-" + abi}
	deb := func(pkg string) string {
		m, _ := filepath.Glob(filepath.Join(debs, pkg+"_*.deb"))
		if len(m) != 1 {
			return filepath.Join(debs, pkg+"_?.deb")
		}
		return m[0]
	}
	say("boot chain: unpacking the shim, GRUB, systemd-stub and the kernel")
	if err := extract(ctx, deb(ShimPackage), map[string]string{shimFile: filepath.Join(out, p.Shim)}); err != nil {
		return nil, err
	}
	if err := extract(ctx, deb(GrubPackage), map[string]string{grubFile: filepath.Join(out, p.Grub)}); err != nil {
		return nil, err
	}
	if err := extract(ctx, deb(StubPackage), map[string]string{stubFile: filepath.Join(out, p.Stub)}); err != nil {
		return nil, err
	}
	if p.Modules, err = unpackKernel(ctx, deb(kernelPkg), abi, out, p.Kernel, say); err != nil {
		return nil, err
	}
	if err := install(p, out, dir); err != nil {
		return nil, err
	}
	return point(root, name)
}

// install writes p's manifest into out, the directory it was unpacked
// into, and moves out to dir.
func install(p *Parts, out, dir string) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(out, manifestName), b, 0o644); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(out, dir)
}

// unpackKernel unpacks a kernel package's image (as kernelFile) and the
// guest's modules (under modules/) into out, in two passes over its
// files: every module's depends= first, then the image and the modules
// the guest needs. It returns the modules' file names in load order.
func unpackKernel(ctx context.Context, deb, abi, out, kernelFile string, say func(string, ...any)) ([]string, error) {
	mods, err := moduleIndex(ctx, deb, abi)
	if err != nil {
		return nil, err
	}
	order, err := moduleClosure(mods, GuestModules)
	if err != nil {
		return nil, err
	}
	want := map[string]string{"boot/vmlinuz-" + abi: filepath.Join(out, kernelFile)}
	var files []string
	for _, m := range order {
		file := path.Base(mods[m].path)
		want[mods[m].path] = filepath.Join(out, "modules", file)
		files = append(files, file)
	}
	say("boot chain: kernel %s, modules %s", abi, strings.Join(order, " "))
	if err := extract(ctx, deb, want); err != nil {
		return nil, err
	}
	return files, nil
}

// point makes root/current name and loads it.
func point(root, name string) (*Parts, error) {
	if err := link(root, currentLink, name); err != nil {
		return nil, err
	}
	return LoadParts(filepath.Dir(root))
}

// link makes root/at a symbolic link to name, atomically.
func link(root, at, name string) error {
	tmp := filepath.Join(root, "."+at+".tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(name, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(root, at))
}

// previousLink names the previous kernel's directory under cache/boot.
const previousLink = "previous-kernel"

// LoadPreviousKernel reads the kernel FetchPreviousKernel fetched: parts
// with only a kernel and its modules (WithKernel puts it after the current
// shim and GRUB).
func LoadPreviousKernel(cache string) (*Parts, error) {
	return loadManifest(filepath.Join(cache, partsCacheDir, previousLink), "the previous kernel", false)
}

// FetchPreviousKernel fetches Debian's signed kernel of the ABI before
// current's (the highest linux-image-<version>-<n>-amd64 apt knows with a
// lower n: an older kernel Debian signed with the same key), with the
// guest's modules, into cache/boot/kernel-<ABI>_linux-<version>, and points
// cache/boot/previous-kernel at it. A fetch already there is kept.
func FetchPreviousKernel(ctx context.Context, cache string, current *Parts, say func(string, ...any)) (*Parts, error) {
	abi, err := previousABI(ctx, current.ABI)
	if err != nil {
		return nil, err
	}
	pkg := "linux-image-" + abi
	version, err := candidate(ctx, pkg)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(cache, partsCacheDir)
	name := sanitize(fmt.Sprintf("kernel-%s_linux-%s", abi, version))
	dir := filepath.Join(root, name)
	if _, err := os.Stat(filepath.Join(dir, manifestName)); err == nil {
		say("previous kernel %s: cached (%s)", name, dir)
		if err := link(root, previousLink, name); err != nil {
			return nil, err
		}
		return LoadPreviousKernel(cache)
	}
	tmp, err := os.MkdirTemp(root, ".fetch-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	say("previous kernel: apt-get download %s=%s", pkg, version)
	deb, err := downloadDeb(ctx, tmp, pkg, version)
	if err != nil {
		return nil, err
	}
	out := filepath.Join(tmp, "parts")
	if err := os.MkdirAll(filepath.Join(out, "modules"), 0o755); err != nil {
		return nil, err
	}
	p := &Parts{ABI: abi, Packages: map[string]string{pkg: version}, Kernel: "vmlinuz-" + abi}
	if p.Modules, err = unpackKernel(ctx, deb, abi, out, p.Kernel, say); err != nil {
		return nil, err
	}
	if err := install(p, out, dir); err != nil {
		return nil, err
	}
	if err := link(root, previousLink, name); err != nil {
		return nil, err
	}
	return LoadPreviousKernel(cache)
}

// downloadDeb downloads version of pkg into dir (apt-get download: never
// installed) and returns the package file's path.
func downloadDeb(ctx context.Context, dir, pkg, version string) (string, error) {
	cmd := exec.CommandContext(ctx, "apt-get", "download", pkg+"="+version)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("liveboot: apt-get download %s=%s: %w\n%s", pkg, version, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("liveboot: apt-get download %s left %d packages in %s", pkg, len(debs), dir)
	}
	return debs[0], nil
}

// previousABI is the highest kernel ABI of current's series (6.1.0-<n>)
// with a lower n that apt has a signed image of.
func previousABI(ctx context.Context, current string) (string, error) {
	m := regexp.MustCompile(`^(.+)-(\d+)-amd64$`).FindStringSubmatch(current)
	if m == nil {
		return "", fmt.Errorf("liveboot: kernel ABI %q is not <version>-<n>-amd64", current)
	}
	n, _ := strconv.Atoi(m[2])
	out, err := exec.CommandContext(ctx, "apt-cache", "search", "--names-only", "^linux-image-"+regexp.QuoteMeta(m[1])+"-[0-9]+-amd64$").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("liveboot: apt-cache search: %w\n%s", err, out)
	}
	best := -1
	re := regexp.MustCompile(`(?m)^linux-image-` + regexp.QuoteMeta(m[1]) + `-(\d+)-amd64 `)
	for _, f := range re.FindAllStringSubmatch(string(out), -1) {
		if k, _ := strconv.Atoi(f[1]); k < n && k > best {
			best = k
		}
	}
	if best < 0 {
		return "", fmt.Errorf("liveboot: apt knows no signed kernel of ABI %s-<n>-amd64 older than %s", m[1], current)
	}
	return fmt.Sprintf("%s-%d-amd64", m[1], best), nil
}

// WithKernel is p's shim, GRUB and stub with k's kernel and modules (k
// from LoadPreviousKernel): parts of absolute paths.
func (p *Parts) WithKernel(k *Parts) *Parts {
	out := &Parts{ABI: k.ABI, Packages: map[string]string{}, Shim: p.Path(p.Shim), Grub: p.Path(p.Grub), Kernel: k.Path(k.Kernel), Modules: k.ModulePaths()}
	if p.Stub != "" {
		out.Stub = p.Path(p.Stub)
	}
	for n, v := range p.Packages {
		if !strings.HasPrefix(n, "linux-image-") {
			out.Packages[n] = v
		}
	}
	for n, v := range k.Packages {
		out.Packages[n] = v
	}
	return out
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._+-]`)

func sanitize(s string) string { return unsafeChars.ReplaceAllString(s, "_") }

// kernelABI is the ABI linux-image-amd64 depends on now (it moves with
// Debian's point releases).
func kernelABI(ctx context.Context) (string, error) {
	out, err := aptCache(ctx, "depends", KernelMeta)
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^\s*Depends:\s*linux-image-(\S+-amd64)\s*$`).FindStringSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("liveboot: apt-cache depends %s names no linux-image-<abi>-amd64:\n%s", KernelMeta, out)
	}
	return m[1], nil
}

// candidate is the version apt would install of pkg.
func candidate(ctx context.Context, pkg string) (string, error) {
	out, err := aptCache(ctx, "policy", pkg)
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^\s*Candidate:\s*(\S+)\s*$`).FindStringSubmatch(out)
	if m == nil || m[1] == "(none)" {
		return "", fmt.Errorf("liveboot: apt has no candidate for %s (apt-get update, or Debian's main archive missing from the sources):\n%s", pkg, out)
	}
	return m[1], nil
}

// aptCache runs apt-cache; with nothing in apt's lists (a fresh machine
// that never ran apt-get update) it updates them once and asks again.
func aptCache(ctx context.Context, args ...string) (string, error) {
	run := func() (string, error) {
		out, err := exec.CommandContext(ctx, "apt-cache", args...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("liveboot: apt-cache %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	out, err := run()
	if err == nil && !strings.Contains(out, "(none)") && strings.TrimSpace(out) != "" {
		return out, nil
	}
	if upd, uerr := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
		return "", fmt.Errorf("liveboot: apt-get update: %w\n%s", uerr, upd)
	}
	return run()
}

// extract copies the named files of a .deb's data archive to their
// destinations (dpkg-deb --fsys-tarfile, read here: nothing is installed).
func extract(ctx context.Context, deb string, want map[string]string) error {
	left := map[string]string{}
	for k, v := range want {
		left[k] = v
	}
	err := walkDeb(ctx, deb, func(name string, r io.Reader) error {
		dst, ok := left[name]
		if !ok {
			return nil
		}
		delete(left, name)
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
	if err != nil {
		return err
	}
	if len(left) > 0 {
		var miss []string
		for k := range left {
			miss = append(miss, k)
		}
		sort.Strings(miss)
		return fmt.Errorf("liveboot: %s lacks %s", filepath.Base(deb), strings.Join(miss, ", "))
	}
	return nil
}

// walkDeb calls fn for every regular file of deb's data archive, by its
// path without the leading "./".
func walkDeb(ctx context.Context, deb string, fn func(name string, r io.Reader) error) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("liveboot: dpkg-deb: %w", err)
	}
	tr := tar.NewReader(bufio.NewReaderSize(stdout, 1<<20))
	var walkErr error
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			walkErr = fmt.Errorf("liveboot: %s: %w", filepath.Base(deb), err)
			break
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if err := fn(strings.TrimPrefix(h.Name, "./"), tr); err != nil {
			walkErr = err
			break
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil && walkErr == nil {
		walkErr = fmt.Errorf("liveboot: dpkg-deb --fsys-tarfile %s: %w: %s", filepath.Base(deb), err, stderr.String())
	}
	return walkErr
}

// module is one kernel module of the package: its path in the package
// and the modules it depends on.
type module struct {
	path    string
	depends []string
}

// moduleIndex reads every module's depends= from its .modinfo section.
func moduleIndex(ctx context.Context, deb, abi string) (map[string]module, error) {
	prefix := "lib/modules/" + abi + "/"
	mods := map[string]module{}
	err := walkDeb(ctx, deb, func(name string, r io.Reader) error {
		if !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, ".ko") {
			return nil
		}
		b, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		deps, err := ModuleDepends(b)
		if err != nil {
			return fmt.Errorf("liveboot: %s: %w", name, err)
		}
		mods[ModuleName(name)] = module{path: name, depends: deps}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("liveboot: %s holds no modules under %s", filepath.Base(deb), prefix)
	}
	return mods, nil
}

// ModuleName is a module's name from its file name, as the kernel spells
// it (dashes as underscores).
func ModuleName(file string) string {
	return strings.ReplaceAll(strings.TrimSuffix(path.Base(file), ".ko"), "-", "_")
}

// ModuleDepends reads the depends= entry of a kernel module's .modinfo
// section (NUL-separated key=value strings).
func ModuleDepends(ko []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, err
	}
	s := f.Section(".modinfo")
	if s == nil {
		return nil, errors.New("no .modinfo section")
	}
	data, err := s.Data()
	if err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var deps []string
			for _, d := range strings.Split(string(v), ",") {
				if d = strings.TrimSpace(d); d != "" {
					deps = append(deps, strings.ReplaceAll(d, "-", "_"))
				}
			}
			return deps, nil
		}
	}
	return nil, nil
}

// moduleClosure is roots and everything they depend on, each after its
// dependencies.
func moduleClosure(mods map[string]module, roots []string) ([]string, error) {
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(string, []string) error
	visit = func(m string, chain []string) error {
		switch state[m] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("liveboot: module dependency cycle: %s", strings.Join(append(chain, m), " -> "))
		}
		mod, ok := mods[m]
		if !ok {
			return fmt.Errorf("liveboot: the kernel package has no module %s (needed by %s)", m, strings.Join(chain, " -> "))
		}
		state[m] = 1
		deps := slices.Clone(mod.depends)
		sort.Strings(deps)
		for _, d := range deps {
			if err := visit(d, append(chain, m)); err != nil {
				return err
			}
		}
		state[m] = 2
		order = append(order, m)
		return nil
	}
	for _, r := range roots {
		if err := visit(r, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}
