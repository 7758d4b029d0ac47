package bootimage

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/saferwall/pe"

	"github.com/nodeproof/nodeproof/attest/uki"
)

// ErrUKI: a unified kernel image whose sections systemd-stub would read
// otherwise than a reader of the file would (two sections it takes for
// the same one, a name it matches by its prefix, a section outside the
// image or overlapping another, base relocations into what it measures),
// or whose .osrel does not read.
var ErrUKI = errors.New("unified kernel image refused")

// UKI is what a unified kernel image holds, as systemd-stub 252 reads it.
type UKI struct {
	// Sections are the sections the stub measures into PCR 11, in its
	// order (uki.Sections252, .pcrsig left out), each with the SHA-256 of
	// its content as loaded: uki.PCR11 of them is what PCR 11 holds.
	Sections []UKISection
	// PCRSig says it has a .pcrsig section (systemd-measure's signature of
	// the expected PCR 11; not measured).
	PCRSig bool
	// OSRelease is its .osrel section read (zero when it has none).
	OSRelease OSRelease
	// Cmdline is its .cmdline section's text ("" when it has none; the
	// stub passes it to the kernel unless the boot loader passes another
	// and Secure Boot is off).
	Cmdline string
	// KernelVersion is the version of the kernel in its .linux section
	// (its x86 boot protocol header's), "" when it names none.
	KernelVersion string
}

// UKISection is one section the stub measures.
type UKISection struct {
	uki.Section
	// Size is the bytes measured: the section's VirtualSize.
	Size uint32
}

// Measured are the sections as uki.Events and uki.PCR11 take them.
func (u *UKI) Measured() []uki.Section {
	out := make([]uki.Section, len(u.Sections))
	for i, s := range u.Sections {
		out[i] = s.Section
	}
	return out
}

// Section returns the measured section named name, or nil.
func (u *UKI) Section(name string) *UKISection {
	for i := range u.Sections {
		if u.Sections[i].Name == name {
			return &u.Sections[i]
		}
	}
	return nil
}

// OSRelease is what an os-release(5) text says, the fields a policy or an
// operator reads (each "" when absent).
type OSRelease struct {
	ID, VersionID, PrettyName, ImageID, ImageVersion string
}

// isUKI says whether systemd-stub would take an image with this section
// table for a UKI: a section whose 8-byte name starts with ".linux" (its
// match, readUKI).
func isUKI(table []pe.ImageSectionHeader) bool {
	for _, h := range table {
		if bytes.HasPrefix(h.Name[:], []byte(".linux")) {
			return true
		}
	}
	return false
}

// sectionTable reads the section headers from b in the table's order (as
// the stub walks them; saferwall/pe sorts its Sections by address): the
// COFF file header's NumberOfSections entries of 40 bytes after the
// optional header. It refuses a table past the file, and a count other
// than saferwall/pe's (it stops reading at a section it finds too odd,
// and the Authenticode digest it computes then leaves sections out).
func sectionTable(f *pe.File, b []byte) ([]pe.ImageSectionHeader, error) {
	if len(b) < 0x40 {
		return nil, fmt.Errorf("bootimage: %w: no DOS header", ErrNotPE)
	}
	lfanew := uint64(binary.LittleEndian.Uint32(b[0x3c:]))
	if lfanew+24 > uint64(len(b)) {
		return nil, fmt.Errorf("bootimage: %w: the PE header past the file", ErrNotPE)
	}
	n := uint64(binary.LittleEndian.Uint16(b[lfanew+6:]))
	start := lfanew + 24 + uint64(binary.LittleEndian.Uint16(b[lfanew+20:]))
	if start+40*n > uint64(len(b)) {
		return nil, fmt.Errorf("bootimage: %w: the section table (%d sections) runs past the file", ErrNotPE, n)
	}
	if int(n) != len(f.Sections) {
		return nil, fmt.Errorf("bootimage: %w: the section table has %d sections, the PE reader took %d", ErrNotPE, n, len(f.Sections))
	}
	out := make([]pe.ImageSectionHeader, n)
	for i := range out {
		e := b[start+40*uint64(i):]
		h := &out[i]
		copy(h.Name[:], e[:8])
		h.VirtualSize = binary.LittleEndian.Uint32(e[8:])
		h.VirtualAddress = binary.LittleEndian.Uint32(e[12:])
		h.SizeOfRawData = binary.LittleEndian.Uint32(e[16:])
		h.PointerToRawData = binary.LittleEndian.Uint32(e[20:])
		if uint64(h.PointerToRawData)+uint64(h.SizeOfRawData) > uint64(len(b)) {
			return nil, fmt.Errorf("bootimage: %w: section %d (%q) runs past the file", ErrSection, i+1, strings.TrimRight(string(h.Name[:]), "\x00"))
		}
	}
	return out, nil
}

// readUKI reads a UKI's sections as systemd-stub 252 finds and measures
// them (src/boot/efi/pe.c's pe_memory_locate_sections and stub.c, v252):
// for each name it knows it takes every section whose 8-byte header name
// starts with that name (a memcmp of the name's length: ".linuxX" is
// .linux too; a long name, "/4" into the string table, never matches),
// the last such section winning; it treats a VirtualSize of 0 as absent;
// and it measures VirtualSize bytes from the section's VirtualAddress in
// the loaded image, which the loader (EDK2's, shim's) filled with the
// first min(VirtualSize, SizeOfRawData) bytes of the section's raw data
// and zeros after them, then patched with the base relocations.
//
// So that what is read here is what the stub measures, it refuses (ErrUKI)
// a file where:
//   - two sections match the same known name (the stub would use the last:
//     exactly what a grafted section would rely on);
//   - a section matches a known name without being exactly it, or a long
//     name resolves to a known name (the stub and other readers disagree);
//   - a known section has a VirtualSize of 0 (the stub skips it), or
//     larger than MaxSize, or ends past SizeOfImage;
//   - a known section's VirtualSize exceeds its raw data by more than
//     maxZeroFill;
//   - two sections, or a section and the headers, overlap in memory
//     (VirtualAddress, VirtualSize) or in the file (PointerToRawData,
//     SizeOfRawData), or a section's raw data and the certificate table;
//   - a base relocation patches a byte of a measured section, or the
//     relocation table does not read;
//   - the .osrel is not an os-release text (parseOSRelease), or .uname
//     names another kernel version than the kernel in .linux.
//
// secs is the section table in its order (sectionTable: each section's
// raw data within the file); section numbers in errors are its, from 1.
func readUKI(f *pe.File, b []byte, secs []pe.ImageSectionHeader, img *Image) (*UKI, error) {
	found := make([]int, len(uki.Sections252))
	for k := range found {
		found[k] = -1
	}
	for i, h := range secs {
		raw := h.Name[:]
		long := sectionName(f, pe.Section{Header: h})
		for k, name := range uki.Sections252 {
			if strings.HasPrefix(string(raw), "/") && long == name {
				return nil, fmt.Errorf("bootimage: %w: section %d is named %s through the string table, which systemd-stub does not read", ErrUKI, i+1, name)
			}
			if !bytes.HasPrefix(raw, []byte(name)) {
				continue
			}
			if rest := raw[len(name):]; len(bytes.TrimRight(rest, "\x00")) != 0 {
				return nil, fmt.Errorf("bootimage: %w: section %d %q: systemd-stub 252 reads it as %s (it compares the first %d bytes)", ErrUKI, i+1, strings.TrimRight(string(raw), "\x00"), name, len(name))
			}
			if j := found[k]; j >= 0 {
				return nil, fmt.Errorf("bootimage: %w: sections %d and %d are both %s: systemd-stub 252 would use the last (%d)", ErrUKI, j+1, i+1, name, i+1)
			}
			found[k] = i
		}
	}
	var sizeOfImage, sizeOfHeaders uint32
	switch oh := f.NtHeader.OptionalHeader.(type) {
	case pe.ImageOptionalHeader64:
		sizeOfImage, sizeOfHeaders = oh.SizeOfImage, oh.SizeOfHeaders
	case pe.ImageOptionalHeader32:
		sizeOfImage, sizeOfHeaders = oh.SizeOfImage, oh.SizeOfHeaders
	}
	certOff, certSize, err := certificateTable(f)
	if err != nil {
		return nil, err
	}
	if err := disjoint(secs, sizeOfHeaders, certOff, certSize); err != nil {
		return nil, err
	}
	u := &UKI{}
	var linux, osrel, cmdline []byte
	for k, name := range uki.Sections252 {
		i := found[k]
		if i < 0 {
			continue
		}
		h := secs[i]
		switch {
		case h.VirtualSize == 0:
			return nil, fmt.Errorf("bootimage: %w: %s has a VirtualSize of 0: systemd-stub takes it as absent", ErrUKI, name)
		case h.VirtualSize > MaxSize:
			return nil, fmt.Errorf("bootimage: %w: %s has a VirtualSize of %d (at most %d)", ErrUKI, name, h.VirtualSize, MaxSize)
		case uint64(h.VirtualAddress)+uint64(h.VirtualSize) > uint64(sizeOfImage):
			return nil, fmt.Errorf("bootimage: %w: %s ends past the image's SizeOfImage %#x", ErrUKI, name, sizeOfImage)
		case h.VirtualSize > h.SizeOfRawData && h.VirtualSize-h.SizeOfRawData > maxZeroFill:
			return nil, fmt.Errorf("bootimage: %w: %s: a VirtualSize of %d over %d bytes of raw data (at most %d bytes of the loader's zeros)", ErrUKI, name, h.VirtualSize, h.SizeOfRawData, maxZeroFill)
		}
		// What the loader copies: the raw data up to VirtualSize; zeros
		// after it, up to VirtualSize.
		n := min(h.VirtualSize, h.SizeOfRawData)
		data := b[h.PointerToRawData : uint64(h.PointerToRawData)+uint64(n)]
		if !uki.Measured252(name) {
			u.PCRSig = true
			continue
		}
		hs := sha256.New()
		hs.Write(data)
		if pad := int64(h.VirtualSize - n); pad > 0 {
			io.CopyN(hs, zeros{}, pad)
		}
		u.Sections = append(u.Sections, UKISection{Section: uki.Section{Name: name, SHA256: hs.Sum(nil)}, Size: h.VirtualSize})
		switch name {
		case ".linux":
			linux = data
		case ".osrel":
			osrel = data
		case ".cmdline":
			cmdline = data
		}
	}
	if linux == nil {
		// isUKI saw a .linux prefix, so found it or refused above.
		return nil, fmt.Errorf("bootimage: %w: no .linux section", ErrUKI)
	}
	if err := relocationsOutside(f, b, secs, found); err != nil {
		return nil, err
	}
	if osrel != nil {
		var err error
		if u.OSRelease, err = parseOSRelease(osrel); err != nil {
			return nil, fmt.Errorf("bootimage: %w: .osrel: %v", ErrUKI, err)
		}
	}
	if cmdline != nil {
		u.Cmdline = strings.TrimRight(string(cmdline), "\x00")
	}
	u.KernelVersion = x86KernelVersion(linux)
	if img.KernelVersion != "" && u.KernelVersion != "" && img.KernelVersion != u.KernelVersion {
		return nil, fmt.Errorf("bootimage: %w: .uname says %q, the kernel in .linux %q", ErrUKI, cut(img.KernelVersion), u.KernelVersion)
	}
	if img.KernelVersion == "" {
		img.KernelVersion = u.KernelVersion
	}
	return u, nil
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// maxZeroFill bounds the zeros a loader puts after a measured section's
// raw data (VirtualSize over SizeOfRawData): objcopy and ukify write the
// content whole, so a large fill is no UKI's, and would only cost hashing.
const maxZeroFill = 1 << 20

// disjoint refuses sections that overlap each other or the headers, in
// memory (each from its VirtualAddress for its VirtualSize, or its
// SizeOfRawData when that is 0, as loaders map them; the headers from 0
// for SizeOfHeaders) or in the file (from PointerToRawData for
// SizeOfRawData; the headers, and the certificate table, whose bytes the
// Authenticode digest leaves out).
func disjoint(secs []pe.ImageSectionHeader, sizeOfHeaders, certOff, certSize uint32) error {
	type span struct {
		start, end uint64
		i          int
	}
	const headers, certTable = -1, -2
	check := func(what string, spans []span) error {
		sort.Slice(spans, func(a, b int) bool { return spans[a].start < spans[b].start })
		name := func(i int) string {
			switch i {
			case headers:
				return "the headers"
			case certTable:
				return "the certificate table"
			}
			return fmt.Sprintf("section %d", i+1)
		}
		for j := 1; j < len(spans); j++ {
			if spans[j].start < spans[j-1].end {
				return fmt.Errorf("bootimage: %w: %s and %s overlap in %s", ErrUKI, name(spans[j-1].i), name(spans[j].i), what)
			}
		}
		return nil
	}
	mem := []span{{0, uint64(sizeOfHeaders), headers}}
	file := []span{{0, uint64(sizeOfHeaders), headers}}
	if certSize > 0 {
		file = append(file, span{uint64(certOff), uint64(certOff) + uint64(certSize), certTable})
	}
	for i, h := range secs {
		size := h.VirtualSize
		if size == 0 {
			size = h.SizeOfRawData
		}
		if size > 0 {
			mem = append(mem, span{uint64(h.VirtualAddress), uint64(h.VirtualAddress) + uint64(size), i})
		}
		if h.SizeOfRawData > 0 {
			file = append(file, span{uint64(h.PointerToRawData), uint64(h.PointerToRawData) + uint64(h.SizeOfRawData), i})
		}
	}
	if err := check("memory", mem); err != nil {
		return err
	}
	return check("the file", file)
}

// Base relocation types that patch nothing (IMAGE_REL_BASED_ABSOLUTE: a
// block's padding).
const relBasedAbsolute = 0

// maxRelocWidth is the most bytes one base relocation patches (DIR64).
const maxRelocWidth = 8

// relocationsOutside refuses base relocations (the .reloc data directory,
// blocks of a page RVA, a block size and 16-bit entries: 4-bit type,
// 12-bit offset) that patch any byte of a section the stub measures: the
// loader applies them before the stub measures, so the measured bytes
// would not be the file's. It refuses a table outside the file's sections
// or a block that does not hold together.
func relocationsOutside(f *pe.File, b []byte, secs []pe.ImageSectionHeader, found []int) error {
	var dir pe.DataDirectory
	switch oh := f.NtHeader.OptionalHeader.(type) {
	case pe.ImageOptionalHeader64:
		dir = oh.DataDirectory[pe.ImageDirectoryEntryBaseReloc]
	case pe.ImageOptionalHeader32:
		dir = oh.DataDirectory[pe.ImageDirectoryEntryBaseReloc]
	}
	if dir.Size == 0 {
		return nil
	}
	// The table's bytes: in the section whose memory holds its RVA.
	var table []byte
	for _, h := range secs {
		if dir.VirtualAddress >= h.VirtualAddress && uint64(dir.VirtualAddress)+uint64(dir.Size) <= uint64(h.VirtualAddress)+uint64(min(h.VirtualSize, h.SizeOfRawData)) {
			off := uint64(h.PointerToRawData) + uint64(dir.VirtualAddress-h.VirtualAddress)
			table = b[off : off+uint64(dir.Size)]
			break
		}
	}
	if table == nil {
		return fmt.Errorf("bootimage: %w: the base relocation table (%d bytes at RVA %#x) is not in a section's data", ErrUKI, dir.Size, dir.VirtualAddress)
	}
	type span struct {
		name       string
		start, end uint64
	}
	var measured []span
	for k, name := range uki.Sections252 {
		if i := found[k]; i >= 0 && uki.Measured252(name) {
			h := secs[i]
			measured = append(measured, span{name, uint64(h.VirtualAddress), uint64(h.VirtualAddress) + uint64(h.VirtualSize)})
		}
	}
	for len(table) > 0 {
		if len(table) < 8 {
			return fmt.Errorf("bootimage: %w: a base relocation block shorter than its header", ErrUKI)
		}
		page, size := binary.LittleEndian.Uint32(table), binary.LittleEndian.Uint32(table[4:])
		if size < 8 || size%2 != 0 || uint64(size) > uint64(len(table)) {
			return fmt.Errorf("bootimage: %w: a base relocation block of %d bytes in %d", ErrUKI, size, len(table))
		}
		for e := 8; e < int(size); e += 2 {
			v := binary.LittleEndian.Uint16(table[e:])
			if v>>12 == relBasedAbsolute {
				continue
			}
			at := uint64(page) + uint64(v&0xfff)
			for _, m := range measured {
				if at < m.end && at+maxRelocWidth > m.start {
					return fmt.Errorf("bootimage: %w: a base relocation at RVA %#x patches %s, which the stub measures as loaded", ErrUKI, at, m.name)
				}
			}
		}
		table = table[size:]
	}
	return nil
}

// Bounds of an os-release text.
const (
	maxOSRelease      = 64 << 10
	maxOSReleaseLines = 512
)

// parseOSRelease reads an os-release(5) text: newline-separated KEY=value
// assignments, blank lines and lines starting with "#" ignored; a value
// unquoted (a backslash escapes the next character; no whitespace,
// quote, "$" or "`" unescaped), or enclosed in double quotes (a backslash
// escapes `"`, `\`, "$" and "`", and is kept before anything else) or
// single quotes (no escapes), with nothing after the closing quote. NUL
// padding at the end is dropped. It refuses more than maxOSRelease bytes
// or maxOSReleaseLines lines, text that is not UTF-8 or holds a NUL, a
// line of another form, a key that is not [A-Za-z_][A-Za-z0-9_]*, and a
// key given twice (the shell's last-wins is not followed).
func parseOSRelease(b []byte) (OSRelease, error) {
	out, err := osRelease(b)
	if err != nil {
		return OSRelease{}, err
	}
	return out, nil
}

func osRelease(b []byte) (OSRelease, error) {
	var out OSRelease
	b = bytes.TrimRight(b, "\x00")
	switch {
	case len(b) > maxOSRelease:
		return out, fmt.Errorf("%d bytes (at most %d)", len(b), maxOSRelease)
	case bytes.IndexByte(b, 0) >= 0:
		return out, errors.New("a NUL inside the text")
	case !utf8.Valid(b):
		return out, errors.New("not UTF-8")
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) > maxOSReleaseLines {
		return out, fmt.Errorf("%d lines (at most %d)", len(lines), maxOSReleaseLines)
	}
	seen := map[string]bool{}
	for n, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		key, raw, ok := strings.Cut(l, "=")
		if !ok || !osReleaseKey(key) {
			return out, fmt.Errorf("line %d %q is not KEY=value", n+1, cut(l))
		}
		if seen[key] {
			return out, fmt.Errorf("line %d: %s given twice", n+1, key)
		}
		seen[key] = true
		v, err := osReleaseValue(raw)
		if err != nil {
			return out, fmt.Errorf("line %d (%s): %v", n+1, key, err)
		}
		switch key {
		case "ID":
			out.ID = v
		case "VERSION_ID":
			out.VersionID = v
		case "PRETTY_NAME":
			out.PrettyName = v
		case "IMAGE_ID":
			out.ImageID = v
		case "IMAGE_VERSION":
			out.ImageVersion = v
		}
	}
	return out, nil
}

func osReleaseKey(k string) bool {
	for i, c := range k {
		if c != '_' && (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return k != ""
}

// osReleaseValue unquotes one value (parseOSRelease).
func osReleaseValue(raw string) (string, error) {
	var v strings.Builder
	switch {
	case strings.HasPrefix(raw, "'"):
		end := strings.IndexByte(raw[1:], '\'')
		if end < 0 {
			return "", errors.New("a single quote not closed")
		}
		if end+2 != len(raw) {
			return "", errors.New("text after the closing quote")
		}
		return raw[1 : end+1], nil
	case strings.HasPrefix(raw, `"`):
		for i := 1; i < len(raw); i++ {
			switch c := raw[i]; c {
			case '\\':
				if i+1 < len(raw) && strings.IndexByte("\"\\$`", raw[i+1]) >= 0 {
					i++
					v.WriteByte(raw[i])
				} else {
					v.WriteByte(c)
				}
			case '"':
				if i+1 != len(raw) {
					return "", errors.New("text after the closing quote")
				}
				return v.String(), nil
			case '$', '`':
				return "", fmt.Errorf("an unescaped %q", c)
			default:
				v.WriteByte(c)
			}
		}
		return "", errors.New("a double quote not closed")
	}
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '\\':
			if i+1 == len(raw) {
				return "", errors.New("a backslash at the end")
			}
			i++
			v.WriteByte(raw[i])
		case ' ', '\t', '"', '\'', '$', '`':
			return "", fmt.Errorf("an unquoted value with %q: quote it", c)
		default:
			v.WriteByte(c)
		}
	}
	return v.String(), nil
}
