// Package ukitest builds unified kernel images (UKIs) for tests, the way
// a distribution does: systemd-stub (Debian's systemd-boot-efi,
// linuxx64.efi.stub) with sections added by objcopy, signed by the test
// db signer. Stub and StubAndKernelT are the parts of the boot chain
// internal/liveboot fetched into the cache; SignT signs with its test
// Secure Boot keys; PCR11T is the PCR 11 a test expects, computed apart
// from attest/uki.
package ukitest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nodeproof/nodeproof/internal/liveboot"
)

// Stub is the path of systemd-stub (linuxx64.efi.stub) of the boot chain
// fetched into cache (testenv.Cache(); internal/liveboot's parts: make
// tools fetches them); an error says how to fetch them.
func Stub(cache string) (string, error) {
	p, err := liveboot.LoadParts(cache)
	if err != nil {
		return "", err
	}
	return p.Path(p.Stub), nil
}

// StubAndKernelT are the paths of systemd-stub (Stub's) and Debian's
// kernel of the boot chain fetched into cache, failing t when they are
// not there.
func StubAndKernelT(t testing.TB, cache string) (stub, kernel string) {
	t.Helper()
	stub, err := Stub(cache)
	if err != nil {
		t.Fatal(err)
	}
	p, err := liveboot.LoadParts(cache)
	if err != nil {
		t.Fatal(err)
	}
	return stub, p.Path(p.Kernel)
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

// SignT signs the image at path with the test db signer (internal/liveboot's
// test Secure Boot keys in cache, made there when absent) into a file named
// name in t's temporary directory, failing t when it cannot. It returns the
// signed image's path and the signer.
func SignT(t testing.TB, cache, path, name string) (string, liveboot.KeyPair) {
	t.Helper()
	keys, err := liveboot.EnsureSecureBootKeys(cache)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), name)
	if err := keys.DBSigner.Sign(context.Background(), path, out); err != nil {
		t.Fatal(err)
	}
	return out, keys.DBSigner
}

// FileSHA256T is the sha256 of the file at path, failing t when it cannot
// read it.
func FileSHA256T(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return s[:]
}

// PCR11T is PCR 11 after systemd-stub measured sections in the order given
// (252 measures .linux, .osrel, .cmdline, .initrd in that order): from
// zeros, extended for each section by the sha256 of its name with a NUL,
// then by its file's sha256 (VMA plays no part). It is the value a test
// expects, computed here apart from attest/uki's prediction.
func PCR11T(t testing.TB, sections []Section) []byte {
	t.Helper()
	pcr := make([]byte, 32)
	for _, s := range sections {
		name := sha256.Sum256(append([]byte(s.Name), 0))
		for _, d := range [][]byte{name[:], FileSHA256T(t, s.File)} {
			e := sha256.Sum256(append(pcr, d...))
			pcr = e[:]
		}
	}
	return pcr
}
