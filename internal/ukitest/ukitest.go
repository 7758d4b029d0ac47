// Package ukitest builds unified kernel images (UKIs) for tests, the way
// a distribution does: systemd-stub (Debian's systemd-boot-efi,
// linuxx64.efi.stub) with sections added by objcopy. Stub finds the stub
// in the cache; it is the one place to repoint when the boot parts'
// manifest carries it.
package ukitest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
)

// StubHint says how to get the stub.
const StubHint = "systemd-stub is not in the cache: `apt-get download systemd-boot-efi` and `dpkg-deb -x` it, then copy usr/lib/systemd/boot/efi/linuxx64.efi.stub into <cache>/boot/systemd-boot-efi_<version>/"

// Stub is the path of systemd-stub (linuxx64.efi.stub) under cache
// (testenv.Cache()): the newest of <cache>/boot/*/linuxx64.efi.stub, by
// name.
func Stub(cache string) (string, error) {
	var found []string
	root := filepath.Join(cache, "boot")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && filepath.Dir(p) != root {
			return filepath.SkipDir // one level: <cache>/boot/<dir>/
		}
		if !d.IsDir() && d.Name() == "linuxx64.efi.stub" {
			found = append(found, p)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if len(found) == 0 {
		return "", errors.New(StubHint)
	}
	sort.Strings(found)
	return found[len(found)-1], nil
}

// Section is one section to add: its name, the file it holds, and its
// address in the image (above the stub's own sections, apart from the
// others).
type Section struct {
	Name string
	File string
	VMA  uint64
}

// Standard are the sections a UKI usually has, at the addresses
// systemd's documentation uses (.osrel 0x20000, .cmdline 0x30000, .linux
// 0x2000000, .initrd 0x3000000); an empty file leaves its section out.
func Standard(osrel, cmdline, linux, initrd string) []Section {
	var out []Section
	for _, s := range []Section{{".osrel", osrel, 0x20000}, {".cmdline", cmdline, 0x30000}, {".linux", linux, 0x2000000}, {".initrd", initrd, 0x3000000}} {
		if s.File != "" {
			out = append(out, s)
		}
	}
	return out
}

// Build writes the UKI stub + sections to out with objcopy (binutils).
func Build(stub, out string, sections []Section) error {
	objcopy, err := exec.LookPath("objcopy")
	if err != nil {
		return fmt.Errorf("ukitest: objcopy (binutils) builds the UKI: %w", err)
	}
	var args []string
	for _, s := range sections {
		args = append(args, "--add-section", s.Name+"="+s.File, "--change-section-vma", fmt.Sprintf("%s=%#x", s.Name, s.VMA))
	}
	cmd := exec.Command(objcopy, append(args, stub, out)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ukitest: objcopy: %w: %s", err, b)
	}
	return nil
}

// BuildT builds a UKI in t's temporary directory (Build), failing t when
// it cannot, and returns its path.
func BuildT(t testing.TB, stub string, sections []Section) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "uki.efi")
	if err := Build(stub, out, sections); err != nil {
		t.Fatal(err)
	}
	return out
}

// WriteT writes b to a file named name in t's temporary directory.
func WriteT(t testing.TB, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
