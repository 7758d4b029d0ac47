package bootimage_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/attest/uki"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/internal/ukitest"
)

// ukiParts are a UKI's inputs: Debian's systemd-stub and kernel (the
// cached boot parts), an os-release with quotes and comments, a command
// line and an initrd.
type ukiParts struct {
	stub, kernel, osrel, cmdline, initrd string
}

const testOSRelease = `# written by the image build
PRETTY_NAME="Node OS 1.2 \"edge\" (\$test)"
NAME='Node OS'
ID=nodeos

VERSION_ID=1.2
IMAGE_ID=node-image
IMAGE_VERSION="2026.11.29"
HOME_URL="https://example.com/"
`

func ukiInputs(t *testing.T) ukiParts {
	t.Helper()
	stub, kernel := ukitest.StubAndKernelT(t, testenv.Cache())
	initrd := make([]byte, 70000)
	for i := range initrd {
		initrd[i] = byte(i * 7)
	}
	return ukiParts{
		stub:    stub,
		kernel:  kernel,
		osrel:   ukitest.WriteT(t, "os-release", []byte(testOSRelease)),
		cmdline: ukitest.WriteT(t, "cmdline", []byte("console=ttyS0 root=LABEL=root ro")),
		initrd:  ukitest.WriteT(t, "initrd", initrd),
	}
}

// sectionHeader is the offset in b of the section header named name
// (its 8-byte name field, NUL padded).
func sectionHeader(t *testing.T, b []byte, name string) int {
	t.Helper()
	lfanew := int(binary.LittleEndian.Uint32(b[0x3c:]))
	n := int(binary.LittleEndian.Uint16(b[lfanew+6:]))
	table := lfanew + 24 + int(binary.LittleEndian.Uint16(b[lfanew+20:]))
	var want [8]byte
	copy(want[:], name)
	for i := 0; i < n; i++ {
		h := table + 40*i
		if bytes.Equal(b[h:h+8], want[:]) {
			return h
		}
	}
	t.Fatalf("no section %s", name)
	return 0
}

// Section header fields' offsets.
const (
	hdrVirtualSize    = 8
	hdrVirtualAddress = 12
	hdrSizeOfRawData  = 16
)

// edit is b with f applied to a copy.
func edit(t *testing.T, b []byte, f func(b []byte)) []byte {
	t.Helper()
	out := bytes.Clone(b)
	f(out)
	return out
}

// TestUKI reads UKIs built from Debian's systemd-stub 252 and kernel with
// objcopy: a good one says its sections with the digests of the files
// that went in, in the stub's order, the PCR 11 they give, its os-release
// and its kernel's version; edited ones are refused for what would make
// the stub measure something else than the file says.
func TestUKI(t *testing.T) {
	in := ukiInputs(t)
	path := ukitest.BuildT(t, in.stub, ukitest.Standard(in.osrel, in.cmdline, in.kernel, in.initrd))
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kernel, err := bootimage.ReadFile(in.kernel)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a good UKI", func(t *testing.T) {
		img, err := bootimage.Read(good)
		if err != nil {
			t.Fatal(err)
		}
		if img.Kind != bootimage.KindUKI || img.Stage() != bootimage.StageUKI || img.UKI == nil {
			t.Fatalf("kind %s, stage %q, UKI %v", img.Kind, img.Stage(), img.UKI)
		}
		// objcopy added .osrel, .cmdline, .linux, .initrd in that order;
		// the stub measures .linux first.
		want := []ukitest.Section{{Name: ".linux", File: in.kernel}, {Name: ".osrel", File: in.osrel}, {Name: ".cmdline", File: in.cmdline}, {Name: ".initrd", File: in.initrd}}
		if len(img.UKI.Sections) != len(want) {
			t.Fatalf("sections %+v; want %v", img.UKI.Sections, want)
		}
		for i, w := range want {
			s, sum := img.UKI.Sections[i], ukitest.FileSHA256T(t, w.File)
			if s.Name != w.Name || !bytes.Equal(s.SHA256, sum) {
				t.Errorf("section %d: %s %x; want %s with its file's sha256 %x", i, s.Name, s.SHA256, w.Name, sum)
			}
		}
		pcr, err := uki.PCR11(img.UKI.Measured(), "")
		if chain := ukitest.PCR11T(t, want); err != nil || !bytes.Equal(pcr, chain) {
			t.Errorf("PCR 11 %x, %v; want %x", pcr, err, chain)
		}
		wantOS := bootimage.OSRelease{ID: "nodeos", VersionID: "1.2", PrettyName: `Node OS 1.2 "edge" ($test)`, ImageID: "node-image", ImageVersion: "2026.11.29"}
		if img.UKI.OSRelease != wantOS {
			t.Errorf("os-release %+v; want %+v", img.UKI.OSRelease, wantOS)
		}
		if kernel.KernelVersion == "" || img.UKI.KernelVersion != kernel.KernelVersion || img.KernelVersion != kernel.KernelVersion {
			t.Errorf("kernel version %q (image %q); want the kernel file's %q", img.UKI.KernelVersion, img.KernelVersion, kernel.KernelVersion)
		}
		if img.UKI.Cmdline != "console=ttyS0 root=LABEL=root ro" || img.UKI.PCRSig {
			t.Errorf("command line %q, .pcrsig %v", img.UKI.Cmdline, img.UKI.PCRSig)
		}
		if !hasComponent(img, "systemd") {
			t.Errorf("no SBAT component systemd (the stub's) in %+v", img.SBAT)
		}
	})

	t.Run("signed: its signer as any image's, and the signature covers the command line", func(t *testing.T) {
		signed, k := ukitest.SignT(t, testenv.Cache(), path, "signed.efi")
		b, err := os.ReadFile(signed)
		if err != nil {
			t.Fatal(err)
		}
		img, err := bootimage.Read(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(img.Signatures) != 1 || !img.Signatures[0].Signer.Equal(k.Cert) || img.UKI == nil || len(img.UKI.Sections) != 4 {
			t.Fatalf("%d signatures, UKI %+v", len(img.Signatures), img.UKI)
		}
		h := sectionHeader(t, b, ".cmdline")
		at := binary.LittleEndian.Uint32(b[h+20:])
		_, err = bootimage.Read(edit(t, b, func(b []byte) { b[at] ^= 'c' ^ 'C' }))
		if !errors.Is(err, bootimage.ErrSignsAnotherImage) {
			t.Fatalf("the command line changed after signing: %v; want %v", err, bootimage.ErrSignsAnotherImage)
		}
	})

	t.Run("the stub alone is not a UKI", func(t *testing.T) {
		img, err := bootimage.ReadFile(in.stub)
		if err != nil {
			t.Fatal(err)
		}
		if img.Kind != bootimage.KindImage || img.UKI != nil || img.Stage() != "" {
			t.Fatalf("kind %s, stage %q, UKI %+v", img.Kind, img.Stage(), img.UKI)
		}
	})

	t.Run("a VirtualSize past the raw data: the loader's zeros are measured", func(t *testing.T) {
		h := sectionHeader(t, good, ".cmdline")
		raw := binary.LittleEndian.Uint32(good[h+hdrSizeOfRawData:])
		b := edit(t, good, func(b []byte) { binary.LittleEndian.PutUint32(b[h+hdrVirtualSize:], raw+16) })
		img, err := bootimage.Read(b)
		if err != nil {
			t.Fatal(err)
		}
		cmdline, _ := os.ReadFile(in.cmdline)
		want := sha(append(cmdline, make([]byte, int(raw)+16-len(cmdline))...))
		if s := img.UKI.Section(".cmdline"); s == nil || !bytes.Equal(s.SHA256, want) || s.Size != raw+16 {
			t.Fatalf(".cmdline %+v; want %d bytes, sha256 %x", s, raw+16, want)
		}
	})

	relocated := func(b []byte) {
		// The stub's one relocation block (two ABSOLUTE entries, padding),
		// moved onto .cmdline's page, its first entry a DIR64 at offset 4.
		h := sectionHeader(t, b, ".reloc")
		off := int(binary.LittleEndian.Uint32(b[h+20:]))
		binary.LittleEndian.PutUint32(b[off:], binary.LittleEndian.Uint32(b[sectionHeader(t, b, ".cmdline")+hdrVirtualAddress:]))
		binary.LittleEndian.PutUint16(b[off+8:], 0xa004)
	}
	for _, tc := range []struct {
		name string
		edit func(b []byte)
		want error
		says string
	}{
		{"two .linux sections (the .initrd renamed): the stub would boot the second", func(b []byte) {
			copy(b[sectionHeader(t, b, ".initrd"):], ".linux\x00\x00")
		}, bootimage.ErrUKI, "are both .linux: systemd-stub 252 would use the last"},
		{"a section the stub takes for .linux by its prefix", func(b []byte) {
			copy(b[sectionHeader(t, b, ".initrd"):], ".linuxX\x00")
		}, bootimage.ErrUKI, "reads it as .linux"},
		{"a section running past the file's end", func(b []byte) {
			binary.LittleEndian.PutUint32(b[sectionHeader(t, b, ".initrd")+hdrSizeOfRawData:], 1<<24)
		}, bootimage.ErrSection, "section 12 (\".initrd\") runs past the file"},
		{"a VirtualSize larger than MaxSize", func(b []byte) {
			binary.LittleEndian.PutUint32(b[sectionHeader(t, b, ".initrd")+hdrVirtualSize:], 1<<30)
		}, bootimage.ErrUKI, "a VirtualSize of 1073741824"},
		{"a VirtualSize past SizeOfImage", func(b []byte) {
			binary.LittleEndian.PutUint32(b[sectionHeader(t, b, ".initrd")+hdrVirtualSize:], 1<<28)
		}, bootimage.ErrUKI, "ends past the image's SizeOfImage"},
		{"a VirtualSize of 0 (the stub skips the section)", func(b []byte) {
			binary.LittleEndian.PutUint32(b[sectionHeader(t, b, ".initrd")+hdrVirtualSize:], 0)
		}, bootimage.ErrUKI, "takes it as absent"},
		{".cmdline loaded over .osrel", func(b []byte) {
			binary.LittleEndian.PutUint32(b[sectionHeader(t, b, ".cmdline")+hdrVirtualAddress:], 0x20000)
		}, bootimage.ErrUKI, "overlap in memory"},
		{".initrd's raw data over .linux's", func(b []byte) {
			h := sectionHeader(t, b, ".linux")
			copy(b[sectionHeader(t, b, ".initrd")+20:], b[h+20:h+24])
		}, bootimage.ErrUKI, "overlap in the file"},
		{"a base relocation into .cmdline", relocated, bootimage.ErrUKI, "patches .cmdline"},
		{"a section odd enough that saferwall/pe stops reading the table there", func(b []byte) {
			// Three of its anomalies: VirtualSize and VirtualAddress past
			// 256 MiB, PointerToRawData off the file alignment.
			h := sectionHeader(t, b, ".initrd")
			binary.LittleEndian.PutUint32(b[h+hdrVirtualSize:], 0x10000001)
			binary.LittleEndian.PutUint32(b[h+hdrVirtualAddress:], 0x20000000)
			binary.LittleEndian.PutUint32(b[h+20:], binary.LittleEndian.Uint32(b[h+20:])+1)
		}, bootimage.ErrNotPE, "the section table has 12 sections, the PE reader took 11"},
		{"two .sbat sections (.sdmagic renamed)", func(b []byte) {
			copy(b[sectionHeader(t, b, ".sdmagic"):], ".sbat\x00\x00\x00")
		}, bootimage.ErrSection, "two .sbat sections"},
		{".osrel loaded over the headers", func(b []byte) {
			binary.LittleEndian.PutUint32(b[sectionHeader(t, b, ".osrel")+hdrVirtualAddress:], 0x100)
		}, bootimage.ErrUKI, "the headers and section 9 overlap in memory"},
		{"megabytes of the loader's zeros after .cmdline", func(b []byte) {
			binary.LittleEndian.PutUint32(b[sectionHeader(t, b, ".cmdline")+hdrVirtualSize:], 2<<20)
		}, bootimage.ErrUKI, "of the loader's zeros"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := bootimage.Read(edit(t, good, tc.edit))
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("%v; want %v saying %q", err, tc.want, tc.says)
			}
		})
	}

	t.Run(".uname: the same version read, another refused", func(t *testing.T) {
		for _, tc := range []struct {
			uname string
			ok    bool
		}{{kernel.KernelVersion, true}, {"6.1.0-1-amd64", false}} {
			uname := ukitest.WriteT(t, "uname", []byte(tc.uname))
			secs := append(ukitest.Standard(in.osrel, in.cmdline, in.kernel, ""), ukitest.Section{Name: ".uname", File: uname, VMA: 0x40000})
			img, err := bootimage.ReadFile(ukitest.BuildT(t, in.stub, secs))
			switch {
			case tc.ok && (err != nil || img.KernelVersion != tc.uname || len(img.UKI.Sections) != 3):
				t.Errorf(".uname %s: %v; want read, 3 measured sections (252 does not measure .uname)", tc.uname, err)
			case !tc.ok && (!errors.Is(err, bootimage.ErrUKI) || !strings.Contains(err.Error(), ".uname says")):
				t.Errorf(".uname %s: %v; want %v", tc.uname, err, bootimage.ErrUKI)
			}
		}
	})

	t.Run("an .osrel that is not os-release", func(t *testing.T) {
		bad := ukitest.WriteT(t, "bad-os-release", []byte("ID=debian\nPRETTY_NAME=\"unclosed\nID=again\n"))
		_, err := bootimage.ReadFile(ukitest.BuildT(t, in.stub, ukitest.Standard(bad, in.cmdline, in.kernel, "")))
		if !errors.Is(err, bootimage.ErrUKI) {
			t.Fatalf("%v; want %v", err, bootimage.ErrUKI)
		}
	})
}

func sha(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}
