package liveboot

import (
	"context"
	"debug/pe"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Unified kernel images (UKI): systemd-stub (Parts.Stub, Debian 12's
// systemd 252) with the kernel, the initramfs, the command line and an
// os-release as PE sections. The firmware (or the shim) verifies the one
// image; the stub measures each section it knows into PCR 11 and hands
// the kernel its command line and initramfs.

// UKISectionNames are the sections BuildUKI adds, in the order systemd
// 252's stub measures them into PCR 11 (its unified_sections table:
// .linux, .osrel, .cmdline, .initrd, then .splash, .dtb, .pcrsig and
// .pcrpkey, which BuildUKI does not add); BuildUKI lays them out in this
// order too. 252 knows no .uname (systemd 253 added it): a section the
// stub does not know is neither read nor measured, so none is added.
func UKISectionNames() []string {
	return []string{".linux", ".osrel", ".cmdline", ".initrd"}
}

// UKI is what BuildUKI makes an image of.
type UKI struct {
	// Stub is systemd-stub (Parts.Path(Parts.Stub)); required.
	Stub string
	// Kernel is the kernel image (.linux); required. A signed vmlinuz
	// is taken as it is: the stub hands it over, no one checks its
	// signature.
	Kernel string
	// Initrd is the initramfs (.initrd); none when empty.
	Initrd string
	// Cmdline is the kernel command line (.cmdline, these bytes: no NUL
	// added). With Secure Boot on, the stub ignores any command line its
	// loader passes when the image has one; with none it takes the
	// loader's (which these tests never boot).
	Cmdline string
	// OSRelease is the os-release (.osrel, these bytes); none when empty.
	OSRelease []byte
}

// UKIOSRelease is the os-release the live boot's UKIs carry (Parts.UKI):
// fixed, so that its measurement does not depend on the machine that
// built the image.
const UKIOSRelease = "NAME=\"nodeproof live boot\"\nID=nodeproof-liveboot\nPRETTY_NAME=\"nodeproof live boot (Debian 12 kernel)\"\n"

// UKI is the live boot's UKI of p's stub and kernel: the initramfs initrd,
// KernelCmdline and UKIOSRelease.
func (p *Parts) UKI(initrd string) (UKI, error) {
	if p.Stub == "" {
		return UKI{}, fmt.Errorf("liveboot: these parts have no systemd-stub: %s", PartsHint)
	}
	return UKI{Stub: p.Path(p.Stub), Kernel: p.Path(p.Kernel), Initrd: initrd, Cmdline: KernelCmdline, OSRelease: []byte(UKIOSRelease)}, nil
}

// UKISection is one section BuildUKI added: its name, where it is (the
// relative virtual address the stub finds it at) and its size (the
// section's VirtualSize: what the stub reads and measures).
type UKISection struct {
	Name string
	RVA  uint32
	Size uint32
	// Src is the file it was made of.
	Src string
}

// ukiPage is the least alignment of a UKI's added sections.
const ukiPage = 4096

// maxUKISection bounds each section (a kernel is ~8 MiB, an initramfs
// tens).
const maxUKISection = 1 << 30

// BuildUKI writes the UKI of u to out (unsigned: KeyPair.Sign signs it)
// and returns its sections. The sections (UKISectionNames' order, those
// u has) are added by objcopy (binutils) to a copy of the stub, each at an
// address computed from the stub's PE headers: the first after the
// stub's image (SizeOfImage and every section's end), each next after
// the one before, every one aligned to the stub's SectionAlignment or a
// 4 KiB page, whichever is larger (Debian's stub aligns to 512 bytes;
// Debian's shim sets each section's memory attributes when it loads the
// image, and says "Invalid call dxe_update_mem_attrs ... addr is not page
// aligned" of every section that does not start on a page). The image is
// read back: each section must be where it was put with its
// input's size as its VirtualSize.
func BuildUKI(ctx context.Context, u UKI, out string) ([]UKISection, error) {
	if u.Stub == "" || u.Kernel == "" {
		return nil, errors.New("liveboot: a UKI needs a stub and a kernel")
	}
	stub, err := pe.Open(u.Stub)
	if err != nil {
		return nil, fmt.Errorf("liveboot: the stub %s: %w", u.Stub, err)
	}
	defer stub.Close()
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".uki-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	src := map[string]string{".linux": u.Kernel, ".initrd": u.Initrd}
	for name, data := range map[string][]byte{".cmdline": []byte(u.Cmdline), ".osrel": u.OSRelease} {
		if len(data) == 0 {
			continue
		}
		src[name] = filepath.Join(tmp, strings.TrimPrefix(name, "."))
		if err := os.WriteFile(src[name], data, 0o644); err != nil {
			return nil, err
		}
	}
	var secs []UKISection
	for _, name := range UKISectionNames() {
		if src[name] == "" {
			continue
		}
		fi, err := os.Stat(src[name])
		if err != nil {
			return nil, fmt.Errorf("liveboot: the UKI's %s: %w", name, err)
		}
		if fi.Size() == 0 || fi.Size() > maxUKISection {
			return nil, fmt.Errorf("liveboot: the UKI's %s (%s) has %d bytes (1 to %d)", name, src[name], fi.Size(), maxUKISection)
		}
		secs = append(secs, UKISection{Name: name, Size: uint32(fi.Size()), Src: src[name]})
	}
	base, err := ukiLayout(stub, secs)
	if err != nil {
		return nil, err
	}
	var args []string
	for _, s := range secs {
		args = append(args, "--add-section", s.Name+"="+s.Src, "--change-section-vma", fmt.Sprintf("%s=%#x", s.Name, base+uint64(s.RVA)))
	}
	built := filepath.Join(tmp, "uki.efi")
	if err := run(ctx, nil, "objcopy", append(args, u.Stub, built)...); err != nil {
		return nil, err
	}
	if err := checkUKI(built, secs); err != nil {
		return nil, err
	}
	if err := os.Rename(built, out); err != nil {
		return nil, err
	}
	for i := range secs {
		if strings.HasPrefix(secs[i].Src, tmp) {
			secs[i].Src = ""
		}
	}
	return secs, nil
}

// ukiLayout sets each section's RVA: after the stub's image and after the
// section before, aligned to the stub's SectionAlignment or a page,
// whichever is larger. It returns the stub's ImageBase (objcopy takes
// addresses with it).
func ukiLayout(stub *pe.File, secs []UKISection) (uint64, error) {
	var align, sizeOfImage uint32
	var base uint64
	switch h := stub.OptionalHeader.(type) {
	case *pe.OptionalHeader64:
		align, sizeOfImage, base = h.SectionAlignment, h.SizeOfImage, h.ImageBase
	case *pe.OptionalHeader32:
		align, sizeOfImage, base = h.SectionAlignment, h.SizeOfImage, uint64(h.ImageBase)
	default:
		return 0, errors.New("liveboot: the stub has no PE optional header")
	}
	if align == 0 || align&(align-1) != 0 {
		return 0, fmt.Errorf("liveboot: the stub's SectionAlignment %#x is not a power of two", align)
	}
	next := uint64(sizeOfImage)
	for _, s := range stub.Sections {
		if s.Name == ".linux" || s.Name == ".initrd" {
			return 0, fmt.Errorf("liveboot: the stub already has a %s section: not a stub", s.Name)
		}
		next = max(next, uint64(s.VirtualAddress)+uint64(max(s.VirtualSize, s.Size)))
	}
	a := max(uint64(align), ukiPage)
	for i := range secs {
		next = (next + a - 1) &^ (a - 1)
		if next+uint64(secs[i].Size) > 1<<32-1 {
			return 0, errors.New("liveboot: the UKI's sections run past 4 GiB")
		}
		secs[i].RVA = uint32(next)
		next += uint64(secs[i].Size)
	}
	return base, nil
}

// checkUKI reads the built image back: every section in secs must be
// there, where it was put, its VirtualSize its input's size.
func checkUKI(path string, secs []UKISection) error {
	f, err := pe.Open(path)
	if err != nil {
		return fmt.Errorf("liveboot: objcopy's UKI: %w", err)
	}
	defer f.Close()
	for _, want := range secs {
		s := f.Section(want.Name)
		switch {
		case s == nil:
			return fmt.Errorf("liveboot: objcopy's UKI has no %s", want.Name)
		case s.VirtualAddress != want.RVA || s.VirtualSize != want.Size || s.Size < want.Size:
			return fmt.Errorf("liveboot: objcopy put %s at %#x (%d bytes, %d in the file); want %#x (%d)", want.Name, s.VirtualAddress, s.VirtualSize, s.Size, want.RVA, want.Size)
		}
	}
	return nil
}

// ESP layouts of a UKI: the firmware runs what is at its removable-media
// path (ESPShim); Debian's shim runs grubx64.efi beside itself (ESPGrub).

// BuildUKIDisk writes a boot disk whose ESP holds the UKI at
// /EFI/BOOT/BOOTX64.EFI: the firmware verifies it against db and runs it.
func BuildUKIDisk(ctx context.Context, uki, out string) error {
	return BuildDisk(ctx, out, map[string]File{ESPShim: {Src: uki}})
}

// BuildUKIShimDisk writes a boot disk whose ESP holds shim (Debian's,
// Parts.Shim) at /EFI/BOOT/BOOTX64.EFI and the UKI as
// /EFI/BOOT/grubx64.efi: the firmware verifies the shim (Microsoft's
// UEFI CA in db), the shim verifies the UKI against db or its MokList.
func BuildUKIShimDisk(ctx context.Context, shim, uki, out string) error {
	return BuildDisk(ctx, out, map[string]File{ESPShim: {Src: shim}, ESPGrub: {Src: uki}})
}

// The signer lab's UKI boots: the live boot's UKI (Parts.UKI of the
// current parts) signed, or not, and laid out on the ESP one way or the
// other.
const (
	// UKIDirectDB: signed by the test db signer, run by the firmware.
	UKIDirectDB = "uki-direct-db"
	// UKIShimMOK: signed by the test MOK signer, run by Debian's shim
	// (its MokList holds the MOK CA).
	UKIShimMOK = "uki-shim-mok"
	// UKIShimDB: signed by the test db signer, run by Debian's shim
	// (verified against db).
	UKIShimDB = "uki-shim-db"
	// UKIDirectMOK: signed by the test MOK signer, run by the firmware,
	// whose db lacks the MOK CA: refused.
	UKIDirectMOK = "uki-direct-mok"
	// UKIDirectUnsigned: not signed, run by the firmware: refused.
	UKIDirectUnsigned = "uki-direct-unsigned"
)

// UKIBoots lists every boot SignerLab.UKIDisk makes.
var UKIBoots = []string{UKIDirectDB, UKIShimMOK, UKIShimDB, UKIDirectMOK, UKIDirectUnsigned}

// UKIBootDisk is a boot disk SignerLab.UKIDisk made.
type UKIBootDisk struct {
	// Disk is the boot disk; Image the UKI on it (signed or not).
	Disk, Image string
	// UKI is what the image was made of (its initramfs under the work
	// directory), Sections where BuildUKI put them.
	UKI      UKI
	Sections []UKISection
}

// UKIDisk builds the boot disk of UKI boot name (UKIBoots) for g under
// work/name: g's initramfs, the UKI of the current parts (Parts.UKI),
// signed as name says, on the ESP as name says.
func (l *SignerLab) UKIDisk(ctx context.Context, name string, g *Guest, work string) (*UKIBootDisk, error) {
	var signer *KeyPair
	shim := false
	switch name {
	case UKIDirectDB:
		signer = &l.Keys.DBSigner
	case UKIShimMOK:
		signer, shim = &l.Keys.MOKSigner, true
	case UKIShimDB:
		signer, shim = &l.Keys.DBSigner, true
	case UKIDirectMOK:
		signer = &l.Keys.MOKSigner
	case UKIDirectUnsigned:
	default:
		return nil, fmt.Errorf("liveboot: no UKI boot %q (%s)", name, strings.Join(UKIBoots, ", "))
	}
	dir := filepath.Join(work, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	initrd := filepath.Join(dir, "initrd.img")
	if err := g.BuildInitramfs(ctx, l.Current, initrd); err != nil {
		return nil, err
	}
	u, err := l.Current.UKI(initrd)
	if err != nil {
		return nil, err
	}
	d := &UKIBootDisk{Disk: filepath.Join(dir, "boot.img"), Image: filepath.Join(dir, "uki.efi"), UKI: u}
	unsigned := d.Image
	if signer != nil {
		unsigned = filepath.Join(dir, "uki-unsigned.efi")
	}
	if d.Sections, err = BuildUKI(ctx, u, unsigned); err != nil {
		return nil, err
	}
	if signer != nil {
		if err := signer.Sign(ctx, unsigned, d.Image); err != nil {
			return nil, err
		}
	}
	if shim {
		err = BuildUKIShimDisk(ctx, l.Current.Path(l.Current.Shim), d.Image, d.Disk)
	} else {
		err = BuildUKIDisk(ctx, d.Image, d.Disk)
	}
	if err != nil {
		return nil, err
	}
	return d, nil
}
