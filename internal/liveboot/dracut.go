package liveboot

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// The dracut initramfs: a node's first boot as on RHCOS and Fedora CoreOS,
// built by Debian's dracut (dracut-core and dracut-network 059) from this
// machine's systemd (dracut copies the host's units and binaries), with
// Ignition's own dracut module (dracut/30ignition of the pinned Ignition
// module), nodeproof's (deploy/node/dracut/50nodeproof) and the live boot's
// end (dracut/99nodeproof-liveboot, embedded). The host's dracut
// configuration and module directory are never used or changed: dracut
// runs on a private copy of /usr/lib/dracut (dracutbasedir) with no
// configuration file.

// DracutKernelModules are the kernel modules of the dracut initramfs's
// module tree (with what they depend on): the busybox guest's
// (GuestModules), what dracut's qemu module asks for (virtio_scsi,
// virtio_console), and the vsock transport that 30ignition requires
// (instmods -c: the build fails without it), and ext4 with the crc32c it
// loads at mount (crypto API, no module dependency) for a real root on a
// disk (the cloud path's BuildCloudRoot).
var DracutKernelModules = append(append([]string(nil), GuestModules...),
	"virtio_scsi", "virtio_console", "vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport", "ext4", "crc32c_generic")

// DracutCmdline is the kernel command line of a dracut first boot:
// Ignition's first boot on QEMU (the config from fw_cfg
// opt/com.coreos/config), an empty tmpfs as the root to write into (no
// installed system: nodeproof-liveboot powers off after Ignition), DHCP
// on QEMU's user network (systemd-networkd), and a failed boot powering
// off instead of waiting at a shell. no_timer_check: under TCG on a busy
// host the kernel's IO-APIC timer check can fail and panic ("IO-APIC +
// timer doesn't work!", seen here once in seven boots). node is the machine's host name (the
// agent's node name).
func DracutCmdline(node string) string {
	return "console=ttyS0 panic=-1 no_timer_check ignition.firstboot ignition.platform.id=qemu root=tmpfs ip=dhcp rd.neednet=1 " +
		"rd.shell=0 rd.emergency=poweroff systemd.show_status=1 systemd.hostname=" + node
}

// IgnitionConfigFwCfg is the fw_cfg item Ignition's qemu platform reads
// its config from (Boot.FwCfgFiles).
const IgnitionConfigFwCfg = "com.coreos/config"

//go:embed dracut/99nodeproof-liveboot
var liveBootModule embed.FS

// DracutGuest is the node's software in the dracut initramfs.
type DracutGuest struct {
	// Agent is a statically linked nodeproof-agent.
	Agent string
	// Ignition is the Ignition binary (linked against libc and libblkid,
	// which dracut brings along).
	Ignition string
	// IgnitionModule is Ignition's dracut/30ignition directory
	// (IgnitionDracutModule).
	IgnitionModule string
	// NodeproofModule is deploy/node/dracut/50nodeproof.
	NodeproofModule string
	// CABundle is the Machine Config Server's CA bundle; Server, Pool and
	// Evidence the agent's settings (agent.env).
	CABundle               []byte
	Server, Pool, Evidence string
	// Stock builds the image's initramfs as a cloud image ships it:
	// Ignition's module only, neither 50nodeproof nor the live boot's end
	// (the agent then comes in the machine's user data and runs after the
	// switch to the real root: fetch mode). Agent, NodeproofModule, the CA
	// bundle and the agent's settings are not used.
	Stock bool
	// Install are more programs for the image (dracut --install), such as
	// the tools a real root made from it (BuildCloudRoot) needs.
	Install []string
	// Drivers are kernel modules the image must hold (dracut
	// --add-drivers), such as CloudRootDrivers.
	Drivers []string
	// Modules are more dracut modules (dracut --add), such as
	// systemd-pcrphase: the initrd of a unified kernel image, where
	// systemd measures its boot phases into PCR 11.
	Modules []string
}

// dracutOmit are dracut modules a first boot on QEMU does not need (they
// would only make the image bigger and the boot slower).
const dracutOmit = "crypt dm lvm mdraid multipath dmraid nvdimm lunmask resume plymouth"

// BuildInitramfs runs dracut for the kernel of parts with the module tree
// kmoddir (FetchModuleTree) and writes the initramfs (zstd) to out.
func (g *DracutGuest) BuildInitramfs(ctx context.Context, parts *Parts, kmoddir, out string) error {
	for k, v := range map[string]string{"Agent": g.Agent, "Ignition": g.Ignition, "IgnitionModule": g.IgnitionModule,
		"NodeproofModule": g.NodeproofModule, "Server": g.Server, "Pool": g.Pool, "Evidence": g.Evidence} {
		if v == "" && (!g.Stock || k == "Ignition" || k == "IgnitionModule") {
			return fmt.Errorf("liveboot: DracutGuest.%s is required", k)
		}
	}
	dracut, err := lookTool("dracut")
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp(filepath.Dir(out), ".dracut-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	base := filepath.Join(work, "dracut")
	if b, err := exec.CommandContext(ctx, "cp", "-a", "/usr/lib/dracut", base).CombinedOutput(); err != nil {
		return fmt.Errorf("liveboot: copying /usr/lib/dracut: %w\n%s", err, b)
	}
	mods := filepath.Join(base, "modules.d")
	// Ignition's module as its packaging installs it: the module zip
	// keeps no modes, and systemd skips a generator it cannot execute
	// (Ignition would then not run at all).
	if err := copyModule(os.DirFS(g.IgnitionModule), ".", filepath.Join(mods, "30ignition"), map[string]bool{"ignition-generator": true}); err != nil {
		return err
	}
	ign, err := stripped(ctx, g.Ignition, work)
	if err != nil {
		return err
	}
	if err := os.Rename(ign, filepath.Join(mods, "30ignition", "ignition")); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(mods, "30ignition", "ignition"), 0o755); err != nil {
		return err
	}
	confdir := filepath.Join(work, "conf.d")
	if err := os.Mkdir(confdir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(work, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	args := []string{"--force", "--quiet", "--conf", "/dev/null", "--confdir", confdir,
		"--no-hostonly", "--no-early-microcode", "--nostrip", "--zstd", "--tmpdir", tmp, "--omit", dracutOmit}
	if len(g.Install) > 0 {
		args = append(args, "--install", strings.Join(g.Install, " "))
	}
	if len(g.Drivers) > 0 {
		args = append(args, "--add-drivers", strings.Join(g.Drivers, " "))
	}
	if g.Stock {
		args = append(args, "--add", "ignition", "--kver", parts.ABI, "--kmoddir", kmoddir, out)
		cmd := exec.CommandContext(ctx, dracut, args...)
		cmd.Env = append(os.Environ(), "dracutbasedir="+base)
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("liveboot: dracut: %w\n%s", err, b)
		}
		return nil
	}
	if err := copyModule(os.DirFS(g.NodeproofModule), ".", filepath.Join(mods, "50nodeproof"), nil); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(mods, "50nodeproof", "nodeproof-agent"), File{Src: g.Agent, Mode: 0o755}); err != nil {
		return err
	}
	if err := copyModule(liveBootModule, "dracut/99nodeproof-liveboot", filepath.Join(mods, "99nodeproof-liveboot"), nil); err != nil {
		return err
	}
	conf := filepath.Join(work, "nodeproof")
	if err := os.Mkdir(conf, 0o755); err != nil {
		return err
	}
	env := fmt.Sprintf("NODEPROOF_SERVER=%s\nNODEPROOF_POOL=%s\nNODEPROOF_EVIDENCE=%s\n", g.Server, g.Pool, g.Evidence)
	if err := os.WriteFile(filepath.Join(conf, "agent.env"), []byte(env), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(conf, "mcs-ca-bundle.crt"), g.CABundle, 0o644); err != nil {
		return err
	}
	args = append(args, "--add", strings.Join(append([]string{"ignition", "nodeproof", "nodeproof-liveboot"}, g.Modules...), " "), "--kver", parts.ABI, "--kmoddir", kmoddir, out)
	cmd := exec.CommandContext(ctx, dracut, args...)
	cmd.Env = append(os.Environ(), "dracutbasedir="+base, "NODEPROOF_CONFIG_DIR="+conf)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("liveboot: dracut: %w\n%s", err, b)
	}
	return nil
}

// copyModule copies the directory dir of fsys to dst: scripts (*.sh) and
// the names in exec executable, the rest 0644.
func copyModule(fsys fs.FS, dir, dst string, exec map[string]bool) error {
	return fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p, dir), "/")
		target := filepath.Join(dst, filepath.FromSlash(rel))
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(p, ".sh") || exec[path.Base(p)] {
			mode = 0o755
		}
		return os.WriteFile(target, b, mode)
	})
}

// IgnitionDracutModule is dracut/30ignition of Ignition's module at
// version, from the Go module cache (go mod download: module zips hold
// every file of the repository).
func IgnitionDracutModule(ctx context.Context, version string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", "github.com/coreos/ignition/v2@"+version).Output()
	if err != nil {
		return "", fmt.Errorf("liveboot: go mod download github.com/coreos/ignition/v2@%s: %w", version, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", fmt.Errorf("liveboot: go mod download: %w", err)
	}
	if m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("liveboot: go mod download github.com/coreos/ignition/v2@%s: %s", version, m.Error)
	}
	dir := filepath.Join(m.Dir, "dracut", "30ignition")
	if _, err := os.Stat(filepath.Join(dir, "module-setup.sh")); err != nil {
		return "", fmt.Errorf("liveboot: Ignition %s has no dracut module: %w", version, err)
	}
	return dir, nil
}

// FetchModuleTree makes the kernel module tree dracut reads for the
// kernel of p (--kmoddir): DracutKernelModules and what they depend on,
// with the package's modules.builtin, modules.builtin.modinfo and
// modules.order, indexed by depmod, in
// cache/boot/modtree-<ABI>_linux-<version>_<hash of the list>/lib/modules/<ABI>. The kernel
// package is downloaded again (apt-get download, never installed); a tree
// already there is kept. It returns the tree's directory.
func FetchModuleTree(ctx context.Context, cache string, p *Parts, say func(string, ...any)) (string, error) {
	pkg := "linux-image-" + p.ABI
	version := p.Packages[pkg]
	if version == "" {
		return "", fmt.Errorf("liveboot: the parts name no version of %s", pkg)
	}
	root := filepath.Join(cache, partsCacheDir)
	// The name says which modules it holds: a changed list makes a new tree.
	sum := sha256.Sum256([]byte(strings.Join(DracutKernelModules, " ")))
	name := sanitize(fmt.Sprintf("modtree-%s_linux-%s_%x", p.ABI, version, sum[:4]))
	tree := filepath.Join(root, name, "lib", "modules", p.ABI)
	if _, err := os.Stat(filepath.Join(tree, "modules.dep")); err == nil {
		say("module tree %s: cached", name)
		return tree, nil
	}
	depmod, err := lookTool("depmod")
	if err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(root, ".fetch-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	say("module tree: apt-get download %s=%s", pkg, version)
	cmd := exec.CommandContext(ctx, "apt-get", "download", pkg+"="+version)
	cmd.Dir = tmp
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("liveboot: apt-get download %s=%s: %w\n%s", pkg, version, err, b)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, pkg+"_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("liveboot: apt-get download %s left %d packages", pkg, len(debs))
	}
	index, err := moduleIndex(ctx, debs[0], p.ABI)
	if err != nil {
		return "", err
	}
	order, err := moduleClosure(index, DracutKernelModules)
	if err != nil {
		return "", err
	}
	prefix := "lib/modules/" + p.ABI + "/"
	out := filepath.Join(tmp, "tree")
	want := map[string]string{}
	for _, f := range []string{"modules.builtin", "modules.builtin.modinfo", "modules.order"} {
		want[prefix+f] = filepath.Join(out, filepath.FromSlash(prefix+f))
	}
	for _, m := range order {
		want[index[m].path] = filepath.Join(out, filepath.FromSlash(index[m].path))
	}
	for _, dst := range want {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", err
		}
	}
	say("module tree: %d modules (%s)", len(order), strings.Join(order, " "))
	if err := extract(ctx, debs[0], want); err != nil {
		return "", err
	}
	if b, err := exec.CommandContext(ctx, depmod, "-b", out, p.ABI).CombinedOutput(); err != nil {
		return "", fmt.Errorf("liveboot: depmod: %w\n%s", err, b)
	}
	dir := filepath.Join(root, name)
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.Rename(out, dir); err != nil {
		return "", err
	}
	return tree, nil
}

// CheckDracut says what this machine lacks to build the dracut
// initramfs, or nil: dracut and depmod, dracut-network's modules, and
// systemd (dracut copies the initramfs's systemd from this machine).
func CheckDracut() error {
	var missing []string
	for _, t := range []string{"dracut", "depmod", "/usr/lib/systemd/systemd", "/usr/lib/systemd/systemd-networkd",
		"/usr/lib/dracut/modules.d/40network", "/usr/lib/dracut/modules.d/45url-lib", "/usr/lib/dracut/modules.d/01systemd-networkd"} {
		if strings.HasPrefix(t, "/") {
			if _, err := os.Stat(t); err != nil {
				missing = append(missing, t)
			}
		} else if _, err := lookTool(t); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("liveboot: no %s (apt-get install --no-install-recommends dracut-core dracut-network; systemd installed)", strings.Join(missing, ", "))
	}
	return nil
}
