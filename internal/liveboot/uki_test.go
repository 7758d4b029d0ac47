package liveboot

import (
	"context"
	"crypto/sha256"
	"debug/pe"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/internal/testenv"
)

// TestBuildUKI builds UKIs of the cached stub and kernel (make tools
// fetches them) and small files, reads each back with debug/pe and checks
// what systemd-stub reads and measures: the stub's sections kept, the
// added ones after them in systemd 252's order, each aligned and after
// the one before, each's first VirtualSize bytes its input (the same
// SHA-256).
func TestBuildUKI(t *testing.T) {
	parts, err := LoadParts(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initrd")
	if err := os.WriteFile(initrd, []byte("an initramfs of 33 odd-sized bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	stub, kernel := parts.Path(parts.Stub), parts.Path(parts.Kernel)
	withSections := filepath.Join(dir, "already.efi")
	if _, err := BuildUKI(context.Background(), UKI{Stub: stub, Kernel: initrd}, withSections); err != nil {
		t.Fatal(err)
	}
	full, err := parts.UKI(initrd)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		uki  UKI
		want []string // the added sections, in order
		err  string
	}{
		{"the live boot's UKI", full, []string{".linux", ".osrel", ".cmdline", ".initrd"}, ""},
		{"a kernel only", UKI{Stub: stub, Kernel: kernel}, []string{".linux"}, ""},
		{"no os-release", UKI{Stub: stub, Kernel: kernel, Initrd: initrd, Cmdline: "console=ttyS0"}, []string{".linux", ".cmdline", ".initrd"}, ""},
		{"no stub", UKI{Kernel: kernel}, nil, "needs a stub and a kernel"},
		{"no kernel", UKI{Stub: stub}, nil, "needs a stub and a kernel"},
		{"an empty initramfs", UKI{Stub: stub, Kernel: kernel, Initrd: empty}, nil, "has 0 bytes"},
		{"a missing initramfs", UKI{Stub: stub, Kernel: kernel, Initrd: filepath.Join(dir, "none")}, nil, "no such file"},
		{"the stub is not a PE image", UKI{Stub: initrd, Kernel: kernel}, nil, "the stub"},
		{"the stub is a UKI already", UKI{Stub: withSections, Kernel: kernel}, nil, "already has a .linux section"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "uki.efi")
			secs, err := BuildUKI(context.Background(), c.uki, out)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("%v; want an error with %q", err, c.err)
				}
				if _, err := os.Stat(out); err == nil {
					t.Error("a refused UKI was written")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkBuiltUKI(t, c.uki, out, secs, c.want)
		})
	}
}

// checkBuiltUKI reads the UKI at out back.
func checkBuiltUKI(t *testing.T, u UKI, out string, secs []UKISection, want []string) {
	t.Helper()
	s, err := pe.Open(u.Stub)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f, err := pe.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	oh := f.OptionalHeader.(*pe.OptionalHeader64)
	stubOH := s.OptionalHeader.(*pe.OptionalHeader64)
	var names []string
	for _, sec := range f.Sections {
		names = append(names, sec.Name)
	}
	var stubNames []string
	stubEnd := stubOH.SizeOfImage
	for _, sec := range s.Sections {
		stubNames = append(stubNames, sec.Name)
		stubEnd = max(stubEnd, sec.VirtualAddress+sec.VirtualSize)
	}
	if wantNames := append(slices.Clone(stubNames), want...); !slices.Equal(names, wantNames) {
		t.Fatalf("sections %v; want %v", names, wantNames)
	}
	if len(secs) != len(want) {
		t.Fatalf("BuildUKI returned %d sections; want %d", len(secs), len(want))
	}
	inputs := map[string][]byte{".cmdline": []byte(u.Cmdline), ".osrel": u.OSRelease}
	for _, name := range []string{".linux", ".initrd"} {
		file := map[string]string{".linux": u.Kernel, ".initrd": u.Initrd}[name]
		if file == "" {
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		inputs[name] = b
	}
	prevEnd := stubEnd
	for i, sec := range f.Sections[len(stubNames):] {
		if a := max(oh.SectionAlignment, 4096); sec.VirtualAddress%a != 0 {
			t.Errorf("%s at %#x: not aligned to %#x", sec.Name, sec.VirtualAddress, a)
		}
		if sec.VirtualAddress < prevEnd {
			t.Errorf("%s at %#x: before the end of what comes before it (%#x)", sec.Name, sec.VirtualAddress, prevEnd)
		}
		prevEnd = sec.VirtualAddress + sec.VirtualSize
		if secs[i].Name != sec.Name || secs[i].RVA != sec.VirtualAddress || secs[i].Size != sec.VirtualSize {
			t.Errorf("BuildUKI says %+v; the image has %s at %#x, %d bytes", secs[i], sec.Name, sec.VirtualAddress, sec.VirtualSize)
		}
		if sec.Characteristics&pe.IMAGE_SCN_MEM_READ == 0 || sec.Characteristics&pe.IMAGE_SCN_CNT_INITIALIZED_DATA == 0 {
			t.Errorf("%s: characteristics %#x: not readable initialised data", sec.Name, sec.Characteristics)
		}
		data, err := io.ReadAll(io.NewSectionReader(sec, 0, int64(sec.VirtualSize)))
		if err != nil {
			t.Fatalf("%s: %v", sec.Name, err)
		}
		if got, want := sha256.Sum256(data), sha256.Sum256(inputs[sec.Name]); got != want || len(data) == 0 {
			t.Errorf("%s: %d bytes, sha256 %x; its input's %x", sec.Name, len(data), got, want)
		}
	}
	if prevEnd > oh.SizeOfImage {
		t.Errorf("SizeOfImage %#x; the sections end at %#x", oh.SizeOfImage, prevEnd)
	}
}

// TestSignUKI signs an unsigned UKI (what KeyPair.Sign's sbattach
// --remove refused before) and signs the signed one again by another key:
// sbverify finds each signer's CA, and only it.
func TestSignUKI(t *testing.T) {
	parts, err := LoadParts(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("sbverify"); err != nil {
		t.Fatal("sbverify: apt-get install sbsigntool (make deps does)")
	}
	keys, err := EnsureSecureBootKeys(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	unsigned := filepath.Join(dir, "uki.efi")
	if _, err := BuildUKI(context.Background(), UKI{Stub: parts.Path(parts.Stub), Kernel: parts.Path(parts.Kernel), Cmdline: KernelCmdline}, unsigned); err != nil {
		t.Fatal(err)
	}
	byDB, byMOK := filepath.Join(dir, "uki-db.efi"), filepath.Join(dir, "uki-mok.efi")
	for _, c := range []struct {
		name         string
		signer       KeyPair
		src, dst     string
		wasSigned    bool
		verifies, no KeyPair
	}{
		{"an unsigned UKI signed by the db signer", keys.DBSigner, unsigned, byDB, false, keys.DBCA, keys.MOKCA},
		{"the signed UKI signed again by the MOK signer", keys.MOKSigner, byDB, byMOK, true, keys.MOKCA, keys.DBCA},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, err := peSigned(c.src); err != nil || got != c.wasSigned {
				t.Fatalf("peSigned(src) = %v, %v; want %v", got, err, c.wasSigned)
			}
			if err := c.signer.Sign(context.Background(), c.src, c.dst); err != nil {
				t.Fatal(err)
			}
			if got, err := peSigned(c.dst); err != nil || !got {
				t.Fatalf("peSigned(dst) = %v, %v", got, err)
			}
			if out, err := exec.Command("sbverify", "--cert", c.verifies.CertPath, c.dst).CombinedOutput(); err != nil {
				t.Errorf("sbverify --cert %s: %v\n%s", c.verifies.Cert.Subject.CommonName, err, out)
			}
			if out, err := exec.Command("sbverify", "--cert", c.no.CertPath, c.dst).CombinedOutput(); err == nil {
				t.Errorf("sbverify --cert %s passed: two signatures?\n%s", c.no.Cert.Subject.CommonName, out)
			}
		})
	}
	if err := keys.DBSigner.Sign(context.Background(), filepath.Join(dir, "none.efi"), filepath.Join(dir, "x.efi")); err == nil {
		t.Error("signed a file that is not there")
	}
}

// TestLoadManifest reads manifests as fetches left them: a boot chain
// with its stub, one fetched before the stub was a part (refused, saying
// to fetch again), one whose stub file is gone, and a previous kernel
// (no shim, GRUB or stub needed).
func TestLoadManifest(t *testing.T) {
	full := Parts{ABI: "6.1.0-1-amd64", Packages: map[string]string{StubPackage: "252"}, Shim: "shimx64.efi.signed", Grub: "grubx64.efi.signed", Stub: "linuxx64.efi.stub", Kernel: "vmlinuz-6.1.0-1-amd64", Modules: []string{"virtio.ko"}}
	noStub := full
	noStub.Stub = ""
	kernelOnly := Parts{ABI: full.ABI, Kernel: full.Kernel, Modules: full.Modules}
	for _, c := range []struct {
		name    string
		parts   Parts
		missing string // a file not written
		chain   bool
		err     string
	}{
		{"a boot chain with its stub", full, "", true, ""},
		{"a boot chain fetched before the stub", noStub, "", true, "fetched before systemd-stub was one of its parts"},
		{"the stub's file gone", full, "linuxx64.efi.stub", true, "lacks"},
		{"a module gone", full, "modules/virtio.ko", true, "lacks"},
		{"a previous kernel", kernelOnly, "", false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			b, err := json.Marshal(c.parts)
			if err != nil {
				t.Fatal(err)
			}
			files := []string{manifestName, c.parts.Kernel, "modules/virtio.ko"}
			for _, f := range []string{c.parts.Shim, c.parts.Grub, c.parts.Stub} {
				if f != "" {
					files = append(files, f)
				}
			}
			for _, f := range files {
				if f == c.missing {
					continue
				}
				data := []byte("x")
				if f == manifestName {
					data = b
				}
				if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			p, err := loadManifest(dir, "the boot chain", c.chain)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "make tools") {
					t.Fatalf("%v; want an error with %q and how to fetch again", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.parts.Stub != "" {
				if got := p.Path(p.Stub); got != filepath.Join(dir, c.parts.Stub) {
					t.Errorf("the stub at %s", got)
				}
				if u, err := p.UKI("/initrd"); err != nil || u.Stub != filepath.Join(dir, c.parts.Stub) {
					t.Errorf("Parts.UKI: %+v, %v", u, err)
				}
				if w := p.WithKernel(p); w.Stub != p.Path(p.Stub) {
					t.Errorf("WithKernel's stub %q", w.Stub)
				}
			} else if _, err := p.UKI("/initrd"); err == nil {
				t.Error("Parts.UKI of parts without a stub")
			}
		})
	}
}
