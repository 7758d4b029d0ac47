// Package bootimage reads what a boot image says about itself: a PE/COFF
// file the firmware or the shim verifies and measures — the shim, GRUB, a
// kernel's EFI stub, a unified kernel image (UKI). It gives the image's
// Authenticode SHA-256 digest (what they measure into PCR 4), its
// signatures (each PKCS#7 SignedData of its certificate table: the signer
// and the certificates it carries), its SBAT entries, and for a shim the
// vendor certificates and SBAT levels built into it; for a unified kernel
// image the sections systemd-stub measures into PCR 11 (with attest/uki),
// its os-release and its kernel's version.
//
// It is for the operator's side (`nodeproof policy learn --efi`): the files
// are ones the operator trusts to have been released, and nothing here
// judges a machine. saferwall/pe reads the headers, the sections and the
// Authenticode digest; smallstep/pkcs7 the signatures. The certificate
// table is walked here: saferwall/pe reads only its first entry, and what
// UEFI verifies is every entry's top-level SignedData (nested Microsoft
// signatures are not looked at by firmware or the shim, nor here).
package bootimage

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/saferwall/pe"
	"github.com/smallstep/pkcs7"

	"github.com/nodeproof/nodeproof/attest/uefivar"
	"github.com/nodeproof/nodeproof/fsutil"
)

// MaxSize bounds an image: kernels are ~10 MB and UKIs with an initrd
// ~100 MB.
const MaxSize = 512 << 20

// Errors Read wraps, for callers (and tests) to tell refusals apart.
var (
	// ErrNotPE: not a PE/COFF image, or too large.
	ErrNotPE = errors.New("not a PE/COFF boot image")
	// ErrCertificateTable: the certificate table or an entry of it does
	// not hold together.
	ErrCertificateTable = errors.New("certificate table malformed")
	// ErrSignatureInvalid: a signature does not parse or verify, or signs
	// something other than an Authenticode digest.
	ErrSignatureInvalid = errors.New("signature invalid")
	// ErrSignsAnotherImage: a valid signature whose Authenticode digest is
	// not this image's (the image changed after signing, or the signature
	// is another image's).
	ErrSignsAnotherImage = errors.New("signature of another image")
	// ErrSection: a .sbat or .vendor_cert section that does not read.
	ErrSection = errors.New("section malformed")
)

// Kind is what an image is, as its sections tell.
type Kind string

// Kinds of image.
const (
	// KindShim: it has a .vendor_cert section (the shim's built-in keys).
	KindShim Kind = "shim"
	// KindUKI: it has a .linux section (systemd-stub with a kernel), as
	// systemd-stub finds it (readUKI).
	KindUKI Kind = "uki"
	// KindImage: anything else (GRUB, a kernel's EFI stub).
	KindImage Kind = "image"
)

// Image is what a boot image says about itself.
type Image struct {
	Kind Kind
	// AuthenticodeSHA256 is its Authenticode digest in SHA-256: what the
	// firmware and the shim measure into PCR 4 for it.
	AuthenticodeSHA256 []byte
	// Signatures are its certificate table's signatures, in order (none
	// when it is not signed).
	Signatures []Signature
	// SBAT are the entries of its .sbat section.
	SBAT []SBATEntry
	// VendorCerts are a shim's built-in vendor certificates (its
	// .vendor_cert section's authorized part: a certificate, or an
	// EFI_SIGNATURE_LIST db); VendorHashes that db's image hashes;
	// VendorDBXEntries counts the entries of its built-in dbx.
	VendorCerts      []*x509.Certificate
	VendorHashes     [][]byte
	VendorDBXEntries int
	// SBATLevelAutomatic and SBATLevelLatest are the SbatLevel
	// revocations a shim carries (its .sbatlevel section): the one it
	// applies by default, and the newest it knows ("" when it has none).
	SBATLevelAutomatic, SBATLevelLatest string
	// Linux is set for a Linux kernel's EFI stub (x86's boot protocol
	// header "HdrS", or arm64's "ARM\x64" magic).
	Linux bool
	// KernelVersion is the version a Linux kernel names itself by (`uname
	// -r`: "6.1.0-56-amd64"): an x86 kernel's boot protocol kernel_version
	// string, or a UKI's .uname section; "" when it names none.
	KernelVersion string
	// FileSHA256 is the SHA-256 of the whole file: what GRUB measures into
	// PCR 9 when it reads it.
	FileSHA256 []byte
	// UKI is what a unified kernel image holds (its sections as
	// systemd-stub measures them into PCR 11, its os-release, its
	// kernel's version); nil for any other image.
	UKI *UKI
}

// Boot stages, as attest/policy's bootComponents name them.
const (
	StageShim       = "shim"
	StageBootloader = "bootloader"
	StageKernel     = "kernel"
	// StageUKI is a unified kernel image: systemd-stub with the kernel,
	// its command line and initrd, signed as one (`policy learn --efi
	// uki=FILE`).
	StageUKI = "uki"
)

// Stage is the boot stage the image is, by what it says: the shim (a
// .vendor_cert section), a boot loader (an SBAT component grub or
// systemd-boot), a UKI (a .linux section), a kernel (a Linux kernel's
// header); "" when it says none of these.
func (img *Image) Stage() string {
	switch {
	case img.Kind == KindShim:
		return StageShim
	case img.Kind == KindUKI:
		return StageUKI
	case img.Linux:
		return StageKernel
	}
	for _, e := range img.SBAT {
		if e.Component == "grub" || e.Component == "systemd-boot" {
			return StageBootloader
		}
	}
	return ""
}

// Signature is one PKCS#7 SignedData of the certificate table.
type Signature struct {
	// Signer is the certificate that signed; Certificates all the
	// SignedData carries (the signer and, often, its issuers).
	Signer       *x509.Certificate
	Certificates []*x509.Certificate
	// Hash is the digest algorithm of the signed Authenticode digest.
	Hash crypto.Hash
}

// SBATEntry is one line of a .sbat section
// (component,generation,vendor,package,version,url).
type SBATEntry struct {
	Component  string
	Generation int
	Vendor     string
	Package    string
	Version    string
	URL        string
}

// ReadFile reads the image at path (see Read).
func ReadFile(path string) (*Image, error) {
	b, err := fsutil.ReadFileMax(path, MaxSize)
	if errors.Is(err, fsutil.ErrTooLarge) {
		return nil, fmt.Errorf("%s: larger than %d bytes: not a boot image", path, MaxSize)
	} else if err != nil {
		return nil, err
	}
	img, err := Read(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return img, nil
}

// Read reads an image. It refuses, with an error saying which:
//   - more than MaxSize bytes, or not a PE/COFF image (saferwall/pe), or
//     a section table past the file or with sections saferwall/pe left
//     out (sectionTable);
//   - a certificate table outside the file, or an entry that is not a
//     WIN_CERTIFICATE of revision 2.0 and type PKCS_SIGNED_DATA, or whose
//     length runs past the table;
//   - a signature whose SignedData does not parse, whose signer's
//     signature does not verify (pkcs7's Verify: the signer certificate
//     it carries, its authenticated attributes; no chain, no time), whose
//     content is not an Authenticode SpcIndirectDataContent, or whose
//     signed digest is not this image's Authenticode digest in that hash;
//   - two sections named .sbat, .vendor_cert, .sbatlevel or .uname (which
//     one a reader takes is its own choice);
//   - a .sbat section that is not CSV lines of at least two fields with a
//     numeric generation;
//   - a .vendor_cert section whose table points outside it, or whose
//     authorized part is neither a certificate nor a signature list;
//   - for a unified kernel image (a section systemd-stub takes for
//     .linux), sections the stub would read otherwise than this reader
//     (readUKI's list: ErrUKI).
//
// An unsigned image is not an error: it has no Signatures.
func Read(b []byte) (*Image, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("bootimage: %w: %d bytes exceeds %d", ErrNotPE, len(b), MaxSize)
	}
	f, err := pe.NewBytes(b, &pe.Options{Fast: true})
	if err != nil {
		return nil, fmt.Errorf("bootimage: %w: %v", ErrNotPE, err)
	}
	defer f.Close()
	if err := f.Parse(); err != nil {
		return nil, fmt.Errorf("bootimage: %w: %v", ErrNotPE, err)
	}
	img := &Image{Kind: KindImage, AuthenticodeSHA256: f.Authentihash(),
		Linux: len(b) >= 0x206 && string(b[0x202:0x206]) == "HdrS" || len(b) >= 0x3c && string(b[0x38:0x3c]) == "ARM\x64"}
	if len(img.AuthenticodeSHA256) != sha256.Size {
		return nil, fmt.Errorf("bootimage: %w: no Authenticode digest (headers out of bounds)", ErrNotPE)
	}
	table, err := sectionTable(f, b)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	img.FileSHA256 = sum[:]
	img.KernelVersion = x86KernelVersion(b)
	offset, size, err := certificateTable(f)
	if err != nil {
		return nil, err
	}
	if size > 0 {
		if uint64(offset)+uint64(size) > uint64(len(b)) {
			return nil, fmt.Errorf("bootimage: %w: the table (%d bytes at %d) runs past the file", ErrCertificateTable, size, offset)
		}
		if img.Signatures, err = signatures(f, b[offset:offset+size]); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	for _, s := range f.Sections {
		data, err := sectionData(f, b, s)
		if err != nil {
			return nil, err
		}
		name := sectionName(f, s)
		switch name {
		case ".sbat", ".vendor_cert", ".sbatlevel", ".uname":
			if seen[name] {
				return nil, fmt.Errorf("bootimage: %w: two %s sections", ErrSection, name)
			}
			seen[name] = true
		}
		switch name {
		case ".sbat":
			if img.SBAT, err = parseSBAT(data); err != nil {
				return nil, fmt.Errorf("bootimage: %w: .sbat: %v", ErrSection, err)
			}
		case ".vendor_cert":
			img.Kind = KindShim
			if err := img.vendorCert(data); err != nil {
				return nil, fmt.Errorf("bootimage: %w: .vendor_cert: %v", ErrSection, err)
			}
		case ".sbatlevel":
			img.SBATLevelAutomatic, img.SBATLevelLatest = sbatLevels(data)
		case ".uname":
			if v := versionWord(data); v != "" {
				img.KernelVersion = v
			}
		}
	}
	if isUKI(table) {
		if img.Kind == KindImage {
			img.Kind = KindUKI
		}
		if img.UKI, err = readUKI(f, b, table, img); err != nil {
			return nil, err
		}
	}
	return img, nil
}

// x86KernelVersion reads an x86 Linux kernel's version (the boot
// protocol's kernel_version, Documentation/arch/x86/boot.rst): at 0x20E a
// 16-bit pointer, less 0x200, to a NUL-terminated string whose first word
// is `uname -r`; "" when the header is not there.
func x86KernelVersion(b []byte) string {
	if len(b) < 0x210 || string(b[0x202:0x206]) != "HdrS" {
		return ""
	}
	off := int(binary.LittleEndian.Uint16(b[0x20E:])) + 0x200
	if off <= 0x200 || off >= len(b) {
		return ""
	}
	return versionWord(b[off:min(len(b), off+256)])
}

// versionWord is the first word of a NUL-terminated version string, when
// it is printable and short.
func versionWord(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	w, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	if w == "" || len(w) > 64 {
		return ""
	}
	for _, c := range w {
		if c <= ' ' || c > '~' {
			return ""
		}
	}
	return w
}

// certificateTable is the certificate table's file offset and size (the
// security data directory holds a file offset, not an RVA).
func certificateTable(f *pe.File) (offset, size uint32, err error) {
	var dir pe.DataDirectory
	switch oh := f.NtHeader.OptionalHeader.(type) {
	case pe.ImageOptionalHeader64:
		dir = oh.DataDirectory[pe.ImageDirectoryEntryCertificate]
	case pe.ImageOptionalHeader32:
		dir = oh.DataDirectory[pe.ImageDirectoryEntryCertificate]
	default:
		return 0, 0, fmt.Errorf("bootimage: %w: no optional header", ErrNotPE)
	}
	return dir.VirtualAddress, dir.Size, nil
}

// WIN_CERTIFICATE's revision and type for Authenticode.
const (
	winCertRevision2      = 0x0200
	winCertTypePKCSSigned = 0x0002
)

// signatures reads every WIN_CERTIFICATE of the table (each 8-byte
// aligned) and checks each signs this image.
func signatures(f *pe.File, table []byte) ([]Signature, error) {
	var out []Signature
	for len(table) > 0 {
		if len(table) < 8 {
			return nil, fmt.Errorf("bootimage: %w: an entry shorter than its header", ErrCertificateTable)
		}
		length := binary.LittleEndian.Uint32(table[0:4])
		rev, typ := binary.LittleEndian.Uint16(table[4:6]), binary.LittleEndian.Uint16(table[6:8])
		if length < 8 || uint64(length) > uint64(len(table)) {
			return nil, fmt.Errorf("bootimage: %w: an entry of %d bytes in %d", ErrCertificateTable, length, len(table))
		}
		if rev != winCertRevision2 || typ != winCertTypePKCSSigned {
			return nil, fmt.Errorf("bootimage: %w: an entry of revision %#x, type %#x (want 0x200, PKCS_SIGNED_DATA)", ErrCertificateTable, rev, typ)
		}
		s, err := signature(f, table[8:length])
		if err != nil {
			return nil, fmt.Errorf("bootimage: signature %d: %w", len(out)+1, err)
		}
		out = append(out, s)
		next := (uint64(length) + 7) &^ 7
		if next >= uint64(len(table)) {
			break
		}
		table = table[next:]
	}
	return out, nil
}

// Authenticode's SpcIndirectDataContent: an attribute (the image's data,
// not read here), then the DigestInfo of the image's Authenticode digest.
type spcAttribute struct {
	Type  asn1.ObjectIdentifier
	Value asn1.RawValue `asn1:"optional"`
}

type digestInfo struct {
	Algorithm struct {
		Algorithm  asn1.ObjectIdentifier
		Parameters asn1.RawValue `asn1:"optional"`
	}
	Digest []byte
}

var (
	oidSPCIndirectData = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 2, 1, 4}
	oidSHA1            = asn1.ObjectIdentifier{1, 3, 14, 3, 2, 26}
	oidSHA256          = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 1}
	oidSHA384          = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 2}
	oidSHA512          = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 3}
)

func signature(f *pe.File, der []byte) (Signature, error) {
	p7, err := pkcs7.Parse(der)
	if err != nil {
		return Signature{}, fmt.Errorf("%w: the SignedData does not parse: %v", ErrSignatureInvalid, err)
	}
	signer := p7.GetOnlySigner()
	if signer == nil {
		return Signature{}, fmt.Errorf("%w: %d signers, or the signer's certificate missing; Authenticode has one", ErrSignatureInvalid, len(p7.Signers))
	}
	if err := p7.Verify(); err != nil {
		return Signature{}, fmt.Errorf("%w: it does not verify: %v", ErrSignatureInvalid, err)
	}
	// p7.Content is the SpcIndirectDataContent's contents (its SEQUENCE's
	// elements), as its messageDigest attribute hashes them.
	var attr spcAttribute
	rest, err := asn1.Unmarshal(p7.Content, &attr)
	if err != nil || !attr.Type.Equal(oidSPCIndirectData) && !strings.HasPrefix(attr.Type.String(), "1.3.6.1.4.1.311.2.1.") {
		return Signature{}, fmt.Errorf("%w: the signed content is not an Authenticode SpcIndirectDataContent", ErrSignatureInvalid)
	}
	var di digestInfo
	if rest, err = asn1.Unmarshal(rest, &di); err != nil || len(rest) != 0 {
		return Signature{}, fmt.Errorf("%w: the signed content has no DigestInfo", ErrSignatureInvalid)
	}
	var h crypto.Hash
	switch alg := di.Algorithm.Algorithm; {
	case alg.Equal(oidSHA256):
		h = crypto.SHA256
	case alg.Equal(oidSHA1):
		h = crypto.SHA1
	case alg.Equal(oidSHA384):
		h = crypto.SHA384
	case alg.Equal(oidSHA512):
		h = crypto.SHA512
	default:
		return Signature{}, fmt.Errorf("%w: the signed digest's algorithm %s", ErrSignatureInvalid, alg)
	}
	if !h.Available() {
		return Signature{}, fmt.Errorf("%w: the signed digest's algorithm %v is not linked in", ErrSignatureInvalid, h)
	}
	got := f.AuthentihashExt(h.New())
	if len(got) != 1 || !bytes.Equal(got[0], di.Digest) {
		return Signature{}, fmt.Errorf("%w: its %v digest is not this image's", ErrSignsAnotherImage, h)
	}
	return Signature{Signer: signer, Certificates: p7.Certificates, Hash: h}, nil
}

// sectionName is a section's name, its long form (/<offset> into the COFF
// string table) resolved.
func sectionName(f *pe.File, s pe.Section) string {
	n := s.String()
	if off, ok := strings.CutPrefix(n, "/"); ok {
		if i, err := strconv.ParseUint(off, 10, 32); err == nil {
			if long, ok := f.COFF.StringTableM[f.COFF.StringTableOffset+uint32(i)]; ok {
				return long
			}
		}
	}
	return n
}

// sectionData is a section's bytes in the file: its raw data, cut to its
// virtual size (the rest is file alignment).
func sectionData(f *pe.File, b []byte, s pe.Section) ([]byte, error) {
	h := s.Header
	end := uint64(h.PointerToRawData) + uint64(h.SizeOfRawData)
	if end > uint64(len(b)) {
		return nil, fmt.Errorf("bootimage: %w: %s runs past the file", ErrSection, sectionName(f, s))
	}
	data := b[h.PointerToRawData:end]
	if h.VirtualSize > 0 && h.VirtualSize < uint32(len(data)) {
		data = data[:h.VirtualSize]
	}
	return data, nil
}

// Bounds of an SBAT section.
const (
	maxSBATLines = 256
	maxSBATField = 256
)

// parseSBAT reads a .sbat section: CSV lines of component, generation,
// then vendor, package, version and URL (shim's SBAT.md); NUL padding
// ends it.
func parseSBAT(data []byte) ([]SBATEntry, error) {
	if i := bytes.IndexByte(data, 0); i >= 0 {
		data = data[:i]
	}
	text := strings.TrimSuffix(string(data), "\n")
	if text == "" {
		return nil, nil
	}
	lines := strings.Split(text, "\n")
	if len(lines) > maxSBATLines {
		return nil, fmt.Errorf("%d lines (at most %d)", len(lines), maxSBATLines)
	}
	var out []SBATEntry
	for _, l := range lines {
		f := strings.Split(l, ",")
		if len(f) < 2 || len(f) > 6 || f[0] == "" {
			return nil, fmt.Errorf("line %q is not component,generation[,vendor,package,version,url]", cut(l))
		}
		for _, s := range f {
			if len(s) > maxSBATField {
				return nil, fmt.Errorf("line %q has a field longer than %d", cut(l), maxSBATField)
			}
		}
		g, err := strconv.Atoi(f[1])
		if err != nil || g < 0 {
			return nil, fmt.Errorf("line %q: generation %q", cut(l), cut(f[1]))
		}
		f = append(f, "", "", "", "")
		out = append(out, SBATEntry{Component: f[0], Generation: g, Vendor: f[2], Package: f[3], Version: f[4], URL: f[5]})
	}
	return out, nil
}

func cut(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

// vendorCert reads a shim's .vendor_cert section: four UINT32s (the sizes
// and offsets, from the section's start, of the authorized and the
// deauthorized parts), then the parts. The authorized part is a DER
// certificate (VENDOR_CERT_FILE) or an EFI_SIGNATURE_LIST db
// (VENDOR_DB_FILE); the deauthorized part a dbx.
func (img *Image) vendorCert(d []byte) error {
	if len(d) < 16 {
		return errors.New("shorter than its table")
	}
	authSize, deauthSize := binary.LittleEndian.Uint32(d[0:]), binary.LittleEndian.Uint32(d[4:])
	authOff, deauthOff := binary.LittleEndian.Uint32(d[8:]), binary.LittleEndian.Uint32(d[12:])
	part := func(off, size uint32) ([]byte, error) {
		if uint64(off)+uint64(size) > uint64(len(d)) {
			return nil, fmt.Errorf("a part of %d bytes at %d runs past the section's %d", size, off, len(d))
		}
		return d[off : off+size], nil
	}
	auth, err := part(authOff, authSize)
	if err != nil {
		return err
	}
	deauth, err := part(deauthOff, deauthSize)
	if err != nil {
		return err
	}
	if len(auth) > 0 {
		if c, err := x509.ParseCertificate(auth); err == nil {
			img.VendorCerts = []*x509.Certificate{c}
		} else if img.VendorCerts, img.VendorHashes, _, err = signatureLists(auth); err != nil {
			return fmt.Errorf("the authorized part is neither a certificate nor a signature list: %w", err)
		}
	}
	if len(deauth) > 0 {
		_, _, n, err := signatureLists(deauth)
		if err != nil {
			return fmt.Errorf("the built-in dbx: %w", err)
		}
		img.VendorDBXEntries = n
	}
	return nil
}

// signatureLists reads EFI_SIGNATURE_LISTs (attest/uefivar's checks):
// their X.509 certificates, their SHA-256 hashes, and the number of
// entries of any type.
func signatureLists(b []byte) (certs []*x509.Certificate, hashes [][]byte, entries int, err error) {
	l, err := uefivar.ParseLists(b)
	if err != nil {
		return nil, nil, 0, err
	}
	for _, h := range l.SHA256 {
		hashes = append(hashes, h[:])
	}
	return l.Certificates, hashes, l.Entries, nil
}

// sbatLevels reads a shim's .sbatlevel section (sbat_var.S): a UINT32
// format version (0), then the offsets (from the end of the version) of
// two NUL-terminated SbatLevel texts, the automatic and the latest.
func sbatLevels(d []byte) (automatic, latest string) {
	if len(d) < 12 || binary.LittleEndian.Uint32(d) != 0 {
		return "", ""
	}
	body := d[4:]
	text := func(off uint32) string {
		if uint64(off) >= uint64(len(body)) {
			return ""
		}
		s := body[off:]
		if i := bytes.IndexByte(s, 0); i >= 0 {
			s = s[:i]
		}
		return string(s)
	}
	return text(binary.LittleEndian.Uint32(d[4:])), text(binary.LittleEndian.Uint32(d[8:]))
}
