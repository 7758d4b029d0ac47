package liveboot

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nodeproof/nodeproof/internal/swtpm"
)

// OVMF, as Debian's ovmf package installs it: the Secure Boot build of
// the firmware (SMM, 4 MiB flash), and two variable stores: one enrolled
// with Debian's PK, Debian's and Microsoft's KEKs and Microsoft's db (the
// 2011 PCA and UEFI CA) — Secure Boot on — and one with no keys at all
// (setup mode: Secure Boot off).
const (
	OVMFCode         = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	OVMFVarsMS       = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
	OVMFVarsNoKeys   = "/usr/share/OVMF/OVMF_VARS_4M.fd"
	qemuBinary       = "qemu-system-x86_64"
	dataDiskSize     = 4 << 20
	defaultBootLimit = 6 * time.Minute
)

// GuestHost is the address the guest reaches the host's loopback servers
// at: each forwarded port of 10.0.2.100 is relayed to 127.0.0.1 (QEMU's
// guestfwd); the guest's network reaches nothing else (restrict=on).
// Certificates the guest checks must name it.
const GuestHost = "10.0.2.100"

// GuestIP is the guest's static address on QEMU's user network (init.sh
// sets it; its kubelet's --node-ip); GuestAddr with its prefix length.
const (
	GuestIP   = "10.0.2.15"
	GuestAddr = GuestIP + "/24"
)

// Machine is one machine that boots again and again: its TPM state (the
// same EK every boot) and its data disk (the guest's persistent storage,
// and how the guest hands files back).
type Machine struct {
	// Dir holds the TPM state, the data disk and the per-boot files; a
	// short path without commas (swtpm and unix socket limits).
	Dir string
	// TPMState is the swtpm state directory, provisioned once.
	TPMState string
	// DataDisk is a raw disk image the guest keeps a tar archive on
	// (virtio, the second disk: /dev/vdb).
	DataDisk string
}

// NewMachine provisions a TPM (EK certificate from man) and an empty data
// disk in a new directory under parent ("" for the system's temporary
// directory).
func NewMachine(ctx context.Context, man *swtpm.Manufacturer, parent string) (*Machine, error) {
	dir, err := os.MkdirTemp(parent, "np-vm-")
	if err != nil {
		return nil, err
	}
	m := &Machine{Dir: dir, TPMState: filepath.Join(dir, "tpm"), DataDisk: filepath.Join(dir, "data.img")}
	if err := man.Provision(ctx, m.TPMState); err != nil {
		return nil, err
	}
	f, err := os.Create(m.DataDisk)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(dataDiskSize); err != nil {
		f.Close()
		return nil, err
	}
	return m, f.Close()
}

// Close removes the machine's files.
func (m *Machine) Close() error { return os.RemoveAll(m.Dir) }

// Boot is how one boot runs.
type Boot struct {
	// Disk is the boot disk (BuildDisk); the guest's writes to it are
	// discarded (snapshot).
	Disk string
	// Disks are more disks after the data disk (/dev/vdc, /dev/vdd, …),
	// such as a real root (BuildCloudRoot); the guest's writes to them are
	// discarded (snapshot).
	Disks []string
	// SecureBoot picks the OVMF variable store: Microsoft's keys, or none.
	SecureBoot bool
	// Vars, when set, is the variable store to boot with instead (a copy
	// of it: the boot's writes are discarded), such as EnrolVars makes.
	Vars string
	// Forward are the loopback ports the guest may reach, at GuestHost.
	Forward []int
	// FwCfg are QEMU fw_cfg items for the guest (opt/<name>, readable
	// under /sys/firmware/qemu_fw_cfg/by_name/); not measured.
	FwCfg map[string]string
	// FwCfgFiles are fw_cfg items read from host files (opt/<name>,
	// file=<path>), such as Ignition's config (IgnitionConfigFwCfg).
	FwCfgFiles map[string]string
	// Console, when set, gets the serial console as it comes, each line
	// prefixed with the seconds since QEMU started.
	Console io.Writer
	// Progress, when set, is told every 30 s that the boot goes on, with
	// the console's last line.
	Progress func(format string, args ...any)
	// Limit is how long the boot may take (default 6 minutes).
	Limit time.Duration
}

// Line is one console line and when it came, after QEMU started.
type Line struct {
	At   time.Duration
	Text string
}

// Result is what one boot left.
type Result struct {
	// Lines is the serial console.
	Lines []Line
	// Took is from QEMU's start to its exit.
	Took time.Duration
	// Files is what the guest left on its data disk (a tar archive), by
	// path.
	Files map[string][]byte
}

// Console is the console as text, each line with its time.
func (r *Result) Console() string {
	var b strings.Builder
	for _, l := range r.Lines {
		fmt.Fprintf(&b, "%7.2f %s\n", l.At.Seconds(), l.Text)
	}
	return b.String()
}

// Find returns the first console line holding s (and whether there is one).
func (r *Result) Find(s string) (Line, bool) {
	for _, l := range r.Lines {
		if strings.Contains(l.Text, s) {
			return l, true
		}
	}
	return Line{}, false
}

// Check says what this machine lacks to boot a VM, or nil.
func Check() error {
	for _, f := range []string{OVMFCode, OVMFVarsMS, OVMFVarsNoKeys} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("liveboot: %s: %w (apt-get install ovmf; make deps does)", f, err)
		}
	}
	if _, err := lookTool(qemuBinary); err != nil {
		return err
	}
	if _, err := os.Stat(Busybox); err != nil {
		return fmt.Errorf("liveboot: %s: %w (apt-get install busybox-static; make deps does): the guest's network relay runs it", Busybox, err)
	}
	return swtpm.Check()
}

// Boot powers the machine on: a new swtpm process on its TPM state (a
// reboot: fresh PCRs, same EK, reset count one up), a fresh copy of the
// OVMF variable store, and QEMU under TCG (one vCPU, 1 GiB; this
// machine's KVM cannot run UEFI firmware) until the guest powers off.
// The boot disk is read-only to the guest; the data disk is kept.
func (m *Machine) Boot(ctx context.Context, b Boot) (*Result, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	limit := b.Limit
	if limit == 0 {
		limit = defaultBootLimit
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	run, err := os.MkdirTemp(m.Dir, "boot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(run)
	vars := OVMFVarsNoKeys
	switch {
	case b.Vars != "":
		vars = b.Vars
	case b.SecureBoot:
		vars = OVMFVarsMS
	}
	varsCopy := filepath.Join(run, "vars.fd")
	if err := copyFile(vars, varsCopy); err != nil {
		return nil, err
	}
	tpm, err := swtpm.StartForVM(ctx, m.TPMState, filepath.Join(run, "tpm.sock"))
	if err != nil {
		return nil, err
	}
	defer tpm.Stop()
	qemu, _ := lookTool(qemuBinary)
	args := []string{
		"-machine", "q35,smm=on", "-accel", "tcg", "-cpu", "max", "-m", "1024", "-smp", "1",
		"-global", "driver=cfi.pflash01,property=secure,value=on",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + OVMFCode,
		"-drive", "if=pflash,format=raw,unit=1,file=" + varsCopy,
		"-chardev", "socket,id=chrtpm,path=" + tpm.Socket,
		"-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-crb,tpmdev=tpm0",
		"-drive", "if=none,id=boot0,format=raw,snapshot=on,file=" + b.Disk,
		"-device", "virtio-blk-pci,drive=boot0,bootindex=0",
		"-drive", "if=none,id=data0,format=raw,file=" + m.DataDisk,
		"-device", "virtio-blk-pci,drive=data0",
		"-device", "virtio-net-pci,netdev=n0,romfile=",
		"-nographic", "-no-reboot", "-monitor", "none", "-serial", "stdio",
	}
	for i, d := range b.Disks {
		if strings.ContainsAny(d, ",\n") {
			return nil, fmt.Errorf("liveboot: disk %s: no commas or newlines", d)
		}
		args = append(args, "-drive", fmt.Sprintf("if=none,id=disk%d,format=raw,snapshot=on,file=%s", i, d),
			"-device", fmt.Sprintf("virtio-blk-pci,drive=disk%d", i))
	}
	netdev := "user,id=n0,restrict=on"
	for _, p := range b.Forward {
		// One relay process per connection, to the host's loopback only.
		netdev += fmt.Sprintf(",guestfwd=tcp:%s:%d-cmd:%s nc 127.0.0.1 %d", GuestHost, p, Busybox, p)
	}
	args = append(args, "-netdev", netdev)
	for k, v := range b.FwCfg {
		if strings.ContainsAny(k+v, ",\n") {
			return nil, fmt.Errorf("liveboot: fw_cfg item %s: no commas or newlines", k)
		}
		args = append(args, "-fw_cfg", "name=opt/"+k+",string="+v)
	}
	for k, f := range b.FwCfgFiles {
		if strings.ContainsAny(k+f, ",\n") {
			return nil, fmt.Errorf("liveboot: fw_cfg file item %s: no commas or newlines", k)
		}
		args = append(args, "-fw_cfg", "name=opt/"+k+",file="+f)
	}
	cmd := exec.CommandContext(ctx, qemu, args...)
	cmd.Stdin = nil
	cmd.SysProcAttr = procAttr()
	cmd.WaitDelay = 5 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("liveboot: %s: %w", qemuBinary, err)
	}
	res := &Result{}
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := Line{At: time.Since(start), Text: cleanLine(sc.Text())}
			mu.Lock()
			res.Lines = append(res.Lines, l)
			mu.Unlock()
			if b.Console != nil {
				fmt.Fprintf(b.Console, "%7.2f %s\n", l.At.Seconds(), l.Text)
			}
		}
	}()
	ticker := time.NewTicker(30 * time.Second)
	defer ticker.Stop()
	waited := make(chan error, 1)
	go func() { <-done; waited <- cmd.Wait() }()
	var werr error
wait:
	for {
		select {
		case werr = <-waited:
			break wait
		case <-ticker.C:
			if b.Progress != nil {
				mu.Lock()
				last := "(nothing yet)"
				for i := len(res.Lines) - 1; i >= 0; i-- {
					if t := strings.TrimSpace(res.Lines[i].Text); t != "" {
						last = t
						break
					}
				}
				mu.Unlock()
				b.Progress("VM still running, %.0fs so far; console's last line: %s", time.Since(start).Seconds(), truncate(last, 100))
			}
		}
	}
	res.Took = time.Since(start)
	if ctx.Err() != nil {
		return res, fmt.Errorf("liveboot: the VM did not power off within %s: %w", limit, ctx.Err())
	}
	if werr != nil {
		return res, fmt.Errorf("liveboot: %s: %w", qemuBinary, werr)
	}
	files, err := ReadDataDisk(m.DataDisk)
	if err != nil {
		return res, err
	}
	res.Files = files
	return res, nil
}

// ReadDataDisk reads the tar archive the guest left at the start of its
// data disk (an all-zero disk holds none).
func ReadDataDisk(path string) (map[string][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(io.LimitReader(f, dataDiskSize))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return files, fmt.Errorf("liveboot: the data disk's archive: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return files, err
		}
		files[strings.TrimPrefix(h.Name, "./")] = b
	}
}

// cleanLine drops the terminal escapes and carriage returns firmware and
// GRUB write.
func cleanLine(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == 0x1b:
			// CSI: ESC [ params final-byte (0x40-0x7e).
			if i+1 < len(s) && s[i+1] == '[' {
				j := i + 2
				for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
					j++
				}
				i = j
			}
		case c == '\r':
		case c < 0x20 && c != '\t':
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func copyFile(src, dst string) error {
	return writeFile(dst, File{Src: src, Mode: 0o600})
}
