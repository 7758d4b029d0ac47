package bootimage_test

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"debug/pe"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/attest/uki"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/internal/ukitest"
)

// debianChain reads Debian's signed shim, GRUB and kernel as
// internal/liveboot caches them (hack/tools.sh boot-chain).
func debianChain(t testing.TB) (parts *liveboot.Parts, shim, grub, kernel []byte) {
	t.Helper()
	parts, err := liveboot.LoadParts(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(parts.Path(name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return parts, read(parts.Shim), read(parts.Grub), read(parts.Kernel)
}

func fingerprint(c *x509.Certificate) string {
	s := sha256.Sum256(c.Raw)
	return hex.EncodeToString(s[:])
}

// liveAuthorities are the authorities the live Debian boot measured
// (firmware-testdata, read with go-eventlog): the db certificate that
// verified the shim, and the shim's vendor certificate that verified GRUB
// and the kernel.
func liveAuthorities(t *testing.T) (db, vendor firmwaretestdata.Authority, sbatLevel string) {
	t.Helper()
	logs, err := firmwaretestdata.Logs()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range logs {
		if l.Name != "debian-12-ovmf-secure-boot" {
			continue
		}
		for _, a := range l.Expected.Authorities {
			switch a.By {
			case "firmware":
				db = a
			case "shim":
				vendor = a
			}
		}
		return db, vendor, l.Expected.SbatLevel
	}
	t.Fatal("no live Debian log")
	return
}

// levelOf reads a SbatLevel's component generations.
func levelOf(t *testing.T, level string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(level), "\n")[1:] {
		c, g, _ := strings.Cut(l, ",")
		n, err := strconv.Atoi(g)
		if err != nil {
			t.Fatalf("SbatLevel line %q", l)
		}
		out[c] = n
	}
	return out
}

// TestDebianBootChain reads Debian's package files and checks what they
// say against what the live boot measured (the signers' certificates are
// the authorities PCR 7 shows; each image's SBAT generation is at least
// the level the shim enforced) and against each other (GRUB's and the
// kernel's signers are issued by the shim's vendor certificate).
func TestDebianBootChain(t *testing.T) {
	_, shimB, grubB, kernelB := debianChain(t)
	db, vendor, level := liveAuthorities(t)
	if db.SHA256 == "" || vendor.SHA256 == "" || level == "" {
		t.Fatalf("the live log's authorities %+v %+v, SbatLevel %q", db, vendor, level)
	}
	enforced := levelOf(t, level)

	shim, err := bootimage.Read(shimB)
	if err != nil {
		t.Fatal(err)
	}
	if shim.Stage() != bootimage.StageShim || len(shim.VendorCerts) != 1 || fingerprint(shim.VendorCerts[0]) != vendor.SHA256 {
		t.Fatalf("shim: stage %q, vendor certificates %d (want the live log's %s)", shim.Stage(), len(shim.VendorCerts), vendor.Subject)
	}
	if shim.VendorDBXEntries == 0 {
		t.Error("the shim's built-in dbx is empty")
	}
	chained := false
	for _, s := range shim.Signatures {
		for _, c := range s.Certificates {
			if fingerprint(c) == db.SHA256 && s.Signer.CheckSignatureFrom(c) == nil {
				chained = true
			}
		}
	}
	if !chained {
		t.Errorf("no signature of the shim is by a certificate %s (the live log's db authority) issued", db.Subject)
	}
	if shim.SBATLevelAutomatic == "" || shim.SBATLevelLatest == "" {
		t.Errorf("the shim carries no SbatLevel: %q %q", shim.SBATLevelAutomatic, shim.SBATLevelLatest)
	}

	for _, tc := range []struct {
		name, stage, component string
		b                      []byte
	}{
		{"GRUB", bootimage.StageBootloader, "grub", grubB},
		{"kernel", bootimage.StageKernel, "", kernelB},
	} {
		img, err := bootimage.Read(tc.b)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if img.Stage() != tc.stage || len(img.Signatures) != 1 {
			t.Fatalf("%s: stage %q, %d signatures", tc.name, img.Stage(), len(img.Signatures))
		}
		if err := img.Signatures[0].Signer.CheckSignatureFrom(shim.VendorCerts[0]); err != nil {
			t.Errorf("%s's signer %s is not issued by the shim's vendor certificate: %v", tc.name, img.Signatures[0].Signer.Subject, err)
		}
		for _, e := range img.SBAT {
			if min, ok := enforced[e.Component]; ok && e.Generation < min {
				t.Errorf("%s: SBAT %s,%d below the enforced level %d", tc.name, e.Component, e.Generation, min)
			}
		}
		if tc.component != "" && !hasComponent(img, tc.component) {
			t.Errorf("%s: no SBAT component %s in %+v", tc.name, tc.component, img.SBAT)
		}
	}
}

func hasComponent(img *bootimage.Image, c string) bool {
	for _, e := range img.SBAT {
		if e.Component == c {
			return true
		}
	}
	return false
}

// certTable is where an image's certificate table is (debug/pe: the
// security data directory's file offset and size), and the offset of
// that directory entry in the file.
func certTable(t *testing.T, b []byte) (off, size uint32, entry int) {
	t.Helper()
	f, err := pe.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	oh, ok := f.OptionalHeader.(*pe.OptionalHeader64)
	if !ok {
		t.Fatal("not a PE32+ image")
	}
	d := oh.DataDirectory[pe.IMAGE_DIRECTORY_ENTRY_SECURITY]
	// The directory entry: e_lfanew + signature(4) + file header(20) +
	// the optional header's fields before its directories (112 in PE32+).
	lfanew := int(binary.LittleEndian.Uint32(b[0x3c:]))
	entry = lfanew + 4 + 20 + 112 + 8*pe.IMAGE_DIRECTORY_ENTRY_SECURITY
	if binary.LittleEndian.Uint32(b[entry:]) != d.VirtualAddress {
		t.Fatal("the security directory entry is not where PE32+ puts it")
	}
	return d.VirtualAddress, d.Size, entry
}

// withTable is image b with its certificate table replaced by table.
func withTable(t *testing.T, b, table []byte) []byte {
	t.Helper()
	off, _, entry := certTable(t, b)
	out := append(bytes.Clone(b[:off]), table...)
	binary.LittleEndian.PutUint32(out[entry+4:], uint32(len(table)))
	if len(table) == 0 {
		binary.LittleEndian.PutUint32(out[entry:], 0)
	}
	return out
}

func tableOf(t *testing.T, b []byte) []byte {
	off, size, _ := certTable(t, b)
	return bytes.Clone(b[off : off+size])
}

// TestForgedImages: images edited the ways a tampered release would be,
// from Debian's real files; each refused for what it is, and an unsigned
// image read for what it is.
func TestForgedImages(t *testing.T) {
	_, _, grub, kernel := debianChain(t)
	signed, err := bootimage.Read(kernel)
	if err != nil {
		t.Fatal(err)
	}
	code := bytes.Clone(kernel)
	code[0x10000] ^= 0xff // in .text, after the signing
	wrongType := tableOf(t, kernel)
	wrongType[6] = 0x01 // WIN_CERT_TYPE_X509
	past := tableOf(t, kernel)
	binary.LittleEndian.PutUint32(past, uint32(len(past)+8))
	brokenSig := tableOf(t, kernel)
	brokenSig[len(brokenSig)-40] ^= 0xff // in the signer's signature, at the SignedData's end
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"a byte of the kernel's code changed after signing", code, bootimage.ErrSignsAnotherImage},
		{"GRUB's signature grafted onto the kernel", withTable(t, kernel, tableOf(t, grub)), bootimage.ErrSignsAnotherImage},
		{"a certificate table entry of another type", withTable(t, kernel, wrongType), bootimage.ErrCertificateTable},
		{"a certificate table entry longer than the table", withTable(t, kernel, past), bootimage.ErrCertificateTable},
		{"the signer's signature corrupted", withTable(t, kernel, brokenSig), bootimage.ErrSignatureInvalid},
		{"not a PE image", []byte("#!/bin/sh\necho not a kernel\n"), bootimage.ErrNotPE},
		{"the kernel cut short", kernel[:0x300], bootimage.ErrNotPE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := bootimage.Read(tc.in)
			if !errors.Is(err, tc.want) {
				t.Fatalf("%v; want %v", err, tc.want)
			}
		})
	}
	t.Run("the kernel unsigned: no signatures, the same Authenticode digest", func(t *testing.T) {
		img, err := bootimage.Read(withTable(t, kernel, nil))
		if err != nil {
			t.Fatal(err)
		}
		if len(img.Signatures) != 0 || !bytes.Equal(img.AuthenticodeSHA256, signed.AuthenticodeSHA256) {
			t.Fatalf("%d signatures, digest %x; want none, %x", len(img.Signatures), img.AuthenticodeSHA256, signed.AuthenticodeSHA256)
		}
	})
	t.Run("GRUB's signature appended to the kernel's: the second entry is refused", func(t *testing.T) {
		table := tableOf(t, kernel)
		table = append(table, make([]byte, (8-len(table)%8)%8)...)
		_, err := bootimage.Read(withTable(t, kernel, append(table, tableOf(t, grub)...)))
		if !errors.Is(err, bootimage.ErrSignsAnotherImage) {
			t.Fatalf("%v; want %v", err, bootimage.ErrSignsAnotherImage)
		}
	})
}

func FuzzRead(f *testing.F) {
	// Small real images: the start of the kernel (its headers), a UKI of
	// Debian's systemd-stub with that start as its .linux, and an unsigned
	// EFI program.
	if p, err := liveboot.LoadParts(testenv.Cache()); err == nil {
		if b, err := os.ReadFile(p.Path(p.Kernel)); err == nil {
			f.Add(b[:4096])
			if stub, err := ukitest.Stub(testenv.Cache()); err == nil {
				dir := f.TempDir()
				linux, osrel, cmdline := filepath.Join(dir, "linux"), filepath.Join(dir, "osrel"), filepath.Join(dir, "cmdline")
				os.WriteFile(linux, b[:4096], 0o644)
				os.WriteFile(osrel, []byte(testOSRelease), 0o644)
				os.WriteFile(cmdline, []byte("console=ttyS0"), 0o644)
				out := filepath.Join(dir, "uki.efi")
				if err := ukitest.Build(stub, out, ukitest.Standard(osrel, cmdline, linux, "")); err != nil {
					f.Fatal(err)
				}
				if u, err := os.ReadFile(out); err == nil {
					f.Add(u)
				}
			}
		}
	}
	if b, err := os.ReadFile("/usr/lib/efitools/x86_64-linux-gnu/HelloWorld.efi"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("MZ"))
	f.Fuzz(func(t *testing.T, b []byte) {
		img, err := bootimage.Read(b)
		if err != nil {
			return
		}
		if len(img.AuthenticodeSHA256) != sha256.Size {
			t.Fatalf("digest of %d bytes", len(img.AuthenticodeSHA256))
		}
		for _, s := range img.Signatures {
			if s.Signer == nil {
				t.Fatal("a signature without a signer")
			}
		}
		if img.Kind == bootimage.KindUKI && img.UKI == nil {
			t.Fatalf("kind %s with UKI %v", img.Kind, img.UKI != nil)
		}
		if img.UKI != nil {
			// The sections read are the stub's, in its order, once each,
			// .linux among them, each within the file's size.
			if _, err := uki.Events(img.UKI.Measured()); err != nil {
				t.Fatal(err)
			}
			if img.UKI.Section(".linux") == nil {
				t.Fatal("a UKI without .linux")
			}
			for _, s := range img.UKI.Sections {
				if s.Size == 0 || s.Size > bootimage.MaxSize {
					t.Fatalf("%s of %d bytes", s.Name, s.Size)
				}
			}
		}
	})
}
