package liveboot

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

//go:embed init.sh
var initScript []byte

// Guest is the node's software: what its initramfs holds (init.sh says
// what it does with it).
type Guest struct {
	// Agent is a statically linked nodeproof-agent.
	Agent string
	// KubeletCSR, when set, is a statically linked kubelet-csr
	// (internal/liveboot/kubeletcsr).
	KubeletCSR string
	// Kubelet, when set (with KubeletCSR, which helps it), is a
	// statically linked kubelet: the first boot runs its TLS bootstrap
	// instead of kubelet-csr's imitation (init.sh).
	Kubelet string
	// Containerd, with Kubelet, is Debian's containerd (Runtime.Path):
	// the kubelet's container runtime, with ContainerdConfig and its C
	// library (ldd, from this machine). With it the kubelet gets past its
	// runtime check, registers its Node and makes its serving CSR.
	Containerd string
	// Ignition, when set, is the Ignition binary; it is linked against
	// libc and libblkid, which come along from this machine (ldd).
	Ignition string
	// CABundle is the Machine Config Server's CA bundle.
	CABundle []byte
	// Pointer is Ignition's platform config: the pointer to the pool's
	// public tier, as the machine's image carries it.
	Pointer []byte
	// Server is the server's URL as the guest reaches it
	// (https://GuestHost:port); Pool and Node what the agent asks for.
	Server, Pool, Node string
	// Tamper, when set, is shell put into /init right after its first
	// line: an initramfs edited as an attacker would (the tests' tampered
	// boot).
	Tamper string
}

// KernelCmdline is the kernel command line of every live boot.
const KernelCmdline = "console=ttyS0 quiet panic=-1"

// BuildInitramfs writes the guest's initramfs to out.
func (g *Guest) BuildInitramfs(ctx context.Context, parts *Parts, out string) error {
	for k, v := range map[string]string{"Server": g.Server, "Pool": g.Pool, "Node": g.Node, "Agent": g.Agent} {
		if v == "" {
			return fmt.Errorf("liveboot: Guest.%s is required", k)
		}
	}
	env := fmt.Sprintf("NP_SERVER=%s\nNP_POOL=%s\nNP_NODE=%s\n", shellQuote(g.Server), shellQuote(g.Pool), shellQuote(g.Node))
	var mods []string
	init := initScript
	if g.Tamper != "" {
		first, rest, _ := bytes.Cut(initScript, []byte("\n"))
		init = bytes.Join([][]byte{first, []byte(g.Tamper), rest}, []byte("\n"))
	}
	files := map[string]File{
		"/init":                            {Data: init, Mode: 0o755},
		"/bin/busybox":                     {Src: Busybox, Mode: 0o755},
		"/bin/nodeproof-agent":             {Src: g.Agent, Mode: 0o755},
		"/etc/nodeproof/liveboot.env":      {Data: []byte(env)},
		"/etc/nodeproof/mcs-ca-bundle.crt": {Data: g.CABundle},
		"/etc/nodeproof/pointer.ign":       {Data: g.Pointer},
	}
	for _, p := range parts.ModulePaths() {
		name := filepath.Base(p)
		files["/lib/modules/"+name] = File{Src: p}
		mods = append(mods, name)
	}
	files["/etc/nodeproof/modules"] = File{Data: []byte(strings.Join(mods, "\n") + "\n")}
	if g.KubeletCSR != "" {
		files["/bin/kubelet-csr"] = File{Src: g.KubeletCSR, Mode: 0o755}
	}
	if g.Kubelet != "" {
		if g.KubeletCSR == "" {
			return fmt.Errorf("liveboot: Guest.Kubelet needs Guest.KubeletCSR")
		}
		files["/bin/kubelet"] = File{Src: g.Kubelet, Mode: 0o755}
		// The kubelet reads the account database (its user namespace
		// mappings: a "kubelet" user, here none) and fails without one.
		files["/etc/passwd"] = File{Data: []byte("root:x:0:0:root:/root:/bin/sh\n")}
		files["/etc/group"] = File{Data: []byte("root:x:0:\n")}
	}
	if g.Containerd != "" {
		if g.Kubelet == "" {
			return fmt.Errorf("liveboot: Guest.Containerd needs Guest.Kubelet")
		}
		files["/bin/containerd"] = File{Src: g.Containerd, Mode: 0o755}
		files["/etc/containerd/config.toml"] = File{Data: ContainerdConfig}
		if err := addLibraries(ctx, files, g.Containerd); err != nil {
			return err
		}
	}
	if g.Ignition != "" {
		stripped, err := stripped(ctx, g.Ignition, filepath.Dir(out))
		if err != nil {
			return err
		}
		defer os.Remove(stripped)
		files["/bin/ignition"] = File{Src: stripped, Mode: 0o755}
		if err := addLibraries(ctx, files, g.Ignition); err != nil {
			return err
		}
	}
	return BuildInitramfs(ctx, out, files)
}

// BuildBootDisk writes the boot disk: the shim, GRUB, a grub.cfg (see
// GrubConfig for efi), the kernel and initramfs.
func BuildBootDisk(ctx context.Context, parts *Parts, initramfs string, efi bool, out string) error {
	return BuildBootDiskWith(ctx, parts, initramfs, GrubConfig(efi, KernelCmdline), out)
}

// BuildBootDiskWith is BuildBootDisk with this grub.cfg.
func BuildBootDiskWith(ctx context.Context, parts *Parts, initramfs string, grubCfg []byte, out string) error {
	return BuildDisk(ctx, out, map[string]File{
		ESPShim:      {Src: parts.Path(parts.Shim)},
		ESPGrub:      {Src: parts.Path(parts.Grub)},
		ESPGrubCfg:   {Data: grubCfg},
		ESPKernel:    {Src: parts.Path(parts.Kernel)},
		ESPInitramfs: {Src: initramfs},
	})
}

// addLibraries puts what bin loads (SharedLibraries) into files, each at
// its path on this machine.
func addLibraries(ctx context.Context, files map[string]File, bin string) error {
	libs, err := SharedLibraries(ctx, bin)
	if err != nil {
		return err
	}
	for _, l := range libs {
		files[l] = File{Src: l, Mode: 0o755}
	}
	return nil
}

// SharedLibraries lists what a dynamically linked program loads (ldd):
// its libraries and the dynamic loader, as absolute paths.
func SharedLibraries(ctx context.Context, bin string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", bin).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("liveboot: ldd %s: %w\n%s", bin, err, out)
	}
	re := regexp.MustCompile(`(?m)(?:=>\s*)?(/\S+)\s+\(0x`)
	var libs []string
	for _, m := range re.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
	}
	if len(libs) == 0 {
		return nil, fmt.Errorf("liveboot: ldd %s names no library:\n%s", bin, out)
	}
	return libs, nil
}

// stripped is a copy of bin without symbols and debug information (less
// for GRUB to read and measure, and for the kernel to unpack, in emulated
// code); a plain copy where binutils' strip is missing.
func stripped(ctx context.Context, bin, dir string) (string, error) {
	f, err := os.CreateTemp(dir, ".stripped-")
	if err != nil {
		return "", err
	}
	out := f.Name()
	f.Close()
	if p, err := exec.LookPath("strip"); err == nil {
		if b, err := exec.CommandContext(ctx, p, "-o", out, bin).CombinedOutput(); err != nil {
			os.Remove(out)
			return "", fmt.Errorf("liveboot: strip %s: %w\n%s", bin, err, b)
		}
		return out, nil
	}
	return out, copyFile(bin, out)
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	var b bytes.Buffer
	b.WriteByte('\'')
	b.WriteString(strings.ReplaceAll(s, `'`, `'\''`))
	b.WriteByte('\'')
	return b.String()
}
