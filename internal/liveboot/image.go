package liveboot

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// File is one file of an image: its content from Src (a host file) or
// Data, and its mode.
type File struct {
	Src  string
	Data []byte
	Mode os.FileMode
}

// Busybox is the statically linked busybox of Debian's busybox-static.
const Busybox = "/bin/busybox"

// BuildInitramfs writes a zstd-compressed newc cpio archive (what the
// kernel unpacks as its initramfs; CONFIG_RD_ZSTD) holding files, keyed by
// their absolute path in the guest, owned by root. Directories are made
// as needed. The archive is made by busybox cpio from a staging directory.
func BuildInitramfs(ctx context.Context, out string, files map[string]File) error {
	if _, err := os.Stat(Busybox); err != nil {
		return fmt.Errorf("liveboot: %s: %w (apt-get install busybox-static; make deps does)", Busybox, err)
	}
	stage, err := os.MkdirTemp(filepath.Dir(out), ".initramfs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	for _, d := range []string{"dev", "proc", "sys", "run", "tmp", "var", "etc", "root"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			return err
		}
	}
	for guest, f := range files {
		if !path.IsAbs(guest) || path.Clean(guest) != guest {
			return fmt.Errorf("liveboot: initramfs path %q is not clean and absolute", guest)
		}
		dst := filepath.Join(stage, filepath.FromSlash(guest))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := writeFile(dst, f); err != nil {
			return err
		}
	}
	var list []string
	err = filepath.WalkDir(stage, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(stage, p)
		if err != nil || rel == "." {
			return err
		}
		list = append(list, rel)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(list)
	var cpio bytes.Buffer
	cmd := exec.CommandContext(ctx, Busybox, "cpio", "-o", "-H", "newc", "-R", "0:0", "--renumber-inodes", "--ignore-devno")
	cmd.Dir = stage
	cmd.Stdin = strings.NewReader(strings.Join(list, "\n") + "\n")
	cmd.Stdout = &cpio
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("liveboot: busybox cpio: %w: %s", err, stderr.String())
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	// The kernel decompresses in emulated code: zstd is the fastest of
	// what Debian's kernel takes, and the smaller archive is less for
	// GRUB to read and measure.
	zw, err := zstd.NewWriter(f, zstd.WithEncoderLevel(zstd.SpeedBetterCompression), zstd.WithEncoderConcurrency(1))
	if err != nil {
		f.Close()
		return err
	}
	if _, err := io.Copy(zw, &cpio); err != nil {
		zw.Close()
		f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeFile(dst string, f File) error {
	mode := f.Mode
	if mode == 0 {
		mode = 0o644
	}
	if f.Src == "" {
		return os.WriteFile(dst, f.Data, mode)
	}
	in, err := os.Open(f.Src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// The boot disk: GPT, one EFI system partition from 1 MiB, 62 MiB
// (a 64 MiB disk: room for the backup GPT at the end) unless its files
// need more (espBytes).
const (
	espStart    = 1 << 20
	espMinBytes = 62 << 20
	espSlack    = 8 << 20 // FAT tables, directories, cluster rounding
	sectorSize  = 512
	espTypeGUID = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
)

// espBytes is the ESP's size for files: espMinBytes, or their sizes and
// espSlack rounded up to a MiB when that is more (the first boot's
// initramfs with the kubelet and containerd).
func espBytes(files map[string]File) (int64, error) {
	var n int64 = espSlack
	for _, f := range files {
		if f.Src == "" {
			n += int64(len(f.Data))
			continue
		}
		fi, err := os.Stat(f.Src)
		if err != nil {
			return 0, err
		}
		n += fi.Size()
	}
	n = (n + 1<<20 - 1) &^ (1<<20 - 1)
	return max(n, espMinBytes), nil
}

// ESP paths of the boot chain: the firmware's removable-media path boots
// the shim; the shim loads grubx64.efi beside it; Debian's signed GRUB
// reads /EFI/debian/grub.cfg (its built-in prefix). No fbx64.efi: shim's
// fallback would write boot entries and reset the machine.
const (
	ESPShim      = "/EFI/BOOT/BOOTX64.EFI"
	ESPGrub      = "/EFI/BOOT/grubx64.efi"
	ESPGrubCfg   = "/EFI/debian/grub.cfg"
	ESPKernel    = "/vmlinuz"
	ESPInitramfs = "/initrd.img"
)

// GrubConfig is a grub.cfg that boots /vmlinuz with /initrd.img at once.
// efi selects linuxefi/initrdefi (the kernel through its EFI stub, which
// hands the firmware's event log to the kernel whether Secure Boot is on
// or off); plain linux/initrd is what update-grub writes, and with Secure
// Boot off Debian's GRUB then boots the kernel without its EFI stub:
// the kernel has no event log at all.
func GrubConfig(efi bool, cmdline string) []byte {
	linux, initrd := "linux", "initrd"
	if efi {
		linux, initrd = "linuxefi", "initrdefi"
	}
	return fmt.Appendf(nil, "set timeout=0\n%s %s %s\n%s %s\nboot\n", linux, ESPKernel, cmdline, initrd, ESPInitramfs)
}

// BuildDisk writes a raw GPT disk image (64 MiB unless the files need
// more) whose one partition, an EFI system partition (FAT), holds files (keyed by their path on the
// ESP). It runs sfdisk, mkfs.vfat and mtools on image files: no loop
// device, no mount, no root needed.
func BuildDisk(ctx context.Context, out string, files map[string]File) error {
	for _, tool := range []string{"sfdisk", "mkfs.vfat", "mcopy", "mmd"} {
		if _, err := lookTool(tool); err != nil {
			return err
		}
	}
	espSize, err := espBytes(files)
	if err != nil {
		return err
	}
	disk, err := os.Create(out)
	if err != nil {
		return err
	}
	defer disk.Close()
	if err := disk.Truncate(espStart + espSize + 1<<20); err != nil {
		return err
	}
	if err := run(ctx, strings.NewReader(fmt.Sprintf("label: gpt\nstart=%d, size=%d, type=%s, name=\"EFI system partition\"\n", espStart/sectorSize, espSize/sectorSize, espTypeGUID)),
		"sfdisk", "--quiet", out); err != nil {
		return err
	}
	esp := out + ".esp"
	defer os.Remove(esp)
	_ = os.Remove(esp)
	if err := run(ctx, nil, "mkfs.vfat", "-C", "-n", "ESP", esp, fmt.Sprint(espSize/1024)); err != nil {
		return err
	}
	dirs := map[string]bool{}
	var names []string
	for p := range files {
		names = append(names, p)
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	sort.Strings(names)
	var ds []string
	for d := range dirs {
		ds = append(ds, d)
	}
	sort.Strings(ds) // parents first
	for _, d := range ds {
		if err := run(ctx, nil, "mmd", "-i", esp, "::"+d); err != nil {
			return err
		}
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".esp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for i, p := range names {
		f := files[p]
		src := f.Src
		if src == "" {
			src = filepath.Join(tmp, fmt.Sprint(i))
			if err := os.WriteFile(src, f.Data, 0o644); err != nil {
				return err
			}
		}
		if err := run(ctx, nil, "mcopy", "-i", esp, src, "::"+p); err != nil {
			return err
		}
	}
	in, err := os.Open(esp)
	if err != nil {
		return err
	}
	defer in.Close()
	if _, err := disk.Seek(espStart, io.SeekStart); err != nil {
		return err
	}
	if _, err := io.Copy(disk, in); err != nil {
		return err
	}
	return disk.Close()
}

// lookTool finds a tool on PATH or in /usr/sbin and /sbin (where fdisk
// and dosfstools put theirs, off a user's PATH).
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		if p := filepath.Join(d, name); isExec(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("liveboot: %s not found: %s", name, toolHint(name))
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

func toolHint(name string) string {
	pkg := map[string]string{
		"sfdisk": "fdisk", "mkfs.vfat": "dosfstools", "mcopy": "mtools", "mmd": "mtools",
		"qemu-system-x86_64": "qemu-system-x86", "swtpm": "swtpm", "objcopy": "binutils",
	}[name]
	if pkg == "" {
		pkg = name
	}
	return "apt-get install " + pkg + " (make deps does)"
}

// run runs a tool with stdin, its output in the error.
func run(ctx context.Context, stdin io.Reader, name string, args ...string) error {
	p, err := lookTool(name)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, p, args...)
	cmd.Stdin = stdin
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("liveboot: %s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}
