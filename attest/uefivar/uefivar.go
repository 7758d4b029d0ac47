// Package uefivar reads the UEFI signature-database formats revocations
// are published in: EFI_SIGNATURE_LISTs (db, dbx, a shim's vendor db)
// and a dbx update as published, an authenticated variable
// (EFI_VARIABLE_AUTHENTICATION_2, then the lists: the UEFI revocation
// list files, microsoft/secureboot_objects' DBXUpdate.bin).
//
// Each parser is a bounded state machine over the bytes: every size is
// checked against what is left before it is read, a list's header, entry
// and total sizes must agree, an entry's size must be its type's, and
// nothing may follow the last list. A refusal wraps one of the Err…
// values (errors.Is).
//
// The update's PKCS#7 signature is read, not verified: its signer is
// reported (Update.Signer), and which updates to trust is the operator's
// choice (docs/policy.md).
package uefivar

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// The refusals. Each error a parser returns wraps exactly one.
var (
	// ErrTooLarge: the input is larger than MaxSize.
	ErrTooLarge = errors.New("larger than the bound")
	// ErrTruncated: a header or an entry runs past the end of the input.
	ErrTruncated = errors.New("truncated")
	// ErrAuthHeader: the EFI_VARIABLE_AUTHENTICATION_2 header is not one:
	// its time's reserved fields, its WIN_CERTIFICATE's length, revision,
	// type or certificate type GUID.
	ErrAuthHeader = errors.New("not an EFI_VARIABLE_AUTHENTICATION_2 header")
	// ErrListSize: a signature list's sizes do not agree (list, header,
	// signature size and the whole number of entries they imply).
	ErrListSize = errors.New("signature list sizes disagree")
	// ErrSignatureSize: an entry size that is not its type's.
	ErrSignatureSize = errors.New("signature size not the type's")
	// ErrEmpty: a signature list of no entries, or an input of none.
	ErrEmpty = errors.New("no entries")
	// ErrEntry: an entry whose data is not of its type (a certificate
	// that does not parse).
	ErrEntry = errors.New("entry malformed")
)

// MaxSize bounds every input: a whole dbx with its certificates is tens
// of kilobytes (a UEFI variable store is a few hundred).
const MaxSize = 1 << 20

// maxCertSize bounds a certificate entry's data.
const maxCertSize = 64 << 10

// listHeaderSize is EFI_SIGNATURE_LIST's fixed part: SignatureType (a
// GUID), SignatureListSize, SignatureHeaderSize, SignatureSize (UINT32
// each).
const listHeaderSize = 28

// ownerSize is EFI_SIGNATURE_DATA's SignatureOwner GUID, before its data.
const ownerSize = 16

// GUID is a GUID as UEFI stores it (the first three fields little-endian).
type GUID [16]byte

// MustGUID is the stored form of a GUID written
// xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx; it panics on anything else (for
// constants).
func MustGUID(s string) GUID {
	var g GUID
	b, err := hex.DecodeString(string(bytes.ReplaceAll([]byte(s), []byte("-"), nil)))
	if err != nil || len(b) != 16 || len(s) != 36 {
		panic("uefivar: not a GUID: " + s)
	}
	binary.LittleEndian.PutUint32(g[0:], binary.BigEndian.Uint32(b[0:]))
	binary.LittleEndian.PutUint16(g[4:], binary.BigEndian.Uint16(b[4:]))
	binary.LittleEndian.PutUint16(g[6:], binary.BigEndian.Uint16(b[6:]))
	copy(g[8:], b[8:])
	return g
}

// String writes g the way GUIDs are written.
func (g GUID) String() string {
	return fmt.Sprintf("%08x-%04x-%04x-%x-%x", binary.LittleEndian.Uint32(g[0:4]), binary.LittleEndian.Uint16(g[4:6]),
		binary.LittleEndian.Uint16(g[6:8]), g[8:10], g[10:16])
}

// The signature types (UEFI 2.10, 32.4.1).
var (
	CertSHA256     = MustGUID("c1c41626-504c-4092-aca9-41f936934328")
	CertX509       = MustGUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072")
	CertSHA1       = MustGUID("826ca512-cf10-4ac9-b187-be01496631bd")
	CertSHA224     = MustGUID("0b6e5233-a65c-44c9-9407-d9ab83bfc8bd")
	CertSHA384     = MustGUID("ff3e5307-9fd0-48c9-85f1-8ad56c701e01")
	CertSHA512     = MustGUID("093e0fae-a6c4-4f50-9f1b-d41e2b89c19a")
	CertRSA2048    = MustGUID("3c5766e8-269c-4e34-aa14-ed776e85b3b6")
	CertX509SHA256 = MustGUID("3bd2a492-96c0-4079-b420-fcf98ef103ed")
	CertX509SHA384 = MustGUID("7076876e-80c2-4ee6-aad2-28b349a6865b")
	CertX509SHA512 = MustGUID("446dbf63-2502-4cda-bcfa-2465d2b0fe9d")
)

// signatureTypes are the types this package knows: their names and the
// size of an entry's data (0: a certificate, of any size up to
// maxCertSize). A known type has no list header (SignatureHeaderSize 0).
var signatureTypes = map[GUID]struct {
	name string
	size int
}{
	CertSHA256:     {"EFI_CERT_SHA256", 32},
	CertX509:       {"EFI_CERT_X509", 0},
	CertSHA1:       {"EFI_CERT_SHA1", 20},
	CertSHA224:     {"EFI_CERT_SHA224", 28},
	CertSHA384:     {"EFI_CERT_SHA384", 48},
	CertSHA512:     {"EFI_CERT_SHA512", 64},
	CertRSA2048:    {"EFI_CERT_RSA2048", 256},
	CertX509SHA256: {"EFI_CERT_X509_SHA256", 32 + 16}, // the TBS hash, then a revocation EFI_TIME
	CertX509SHA384: {"EFI_CERT_X509_SHA384", 48 + 16},
	CertX509SHA512: {"EFI_CERT_X509_SHA512", 64 + 16},
}

// TypeName names a signature type ("EFI_CERT_SHA256"), or writes its GUID
// when it is not one this package knows.
func TypeName(g GUID) string {
	if t, ok := signatureTypes[g]; ok {
		return t.name
	}
	return g.String()
}

// Entry is one EFI_SIGNATURE_DATA: its list's type, its owner, its data
// (a slice of the input).
type Entry struct {
	Type  GUID
	Owner GUID
	Data  []byte
}

// Walk reads b as EFI_SIGNATURE_LISTs to its end and calls fn with each
// entry in order (fn's error stops the walk and is returned). It checks,
// before reading each part: the input within MaxSize; a whole list header
// left (ErrTruncated); the list's size within what is left (ErrTruncated)
// and at least its header; its signature size over the owner GUID and,
// for a known type, its type's (a certificate's within a bound) with no
// list header (ErrSignatureSize); its entries a whole, non-zero number
// (ErrListSize, ErrEmpty). It returns the number of entries. An empty
// input is no lists (0, nil): whether that is acceptable is the caller's.
func Walk(b []byte, fn func(Entry) error) (int, error) {
	if len(b) > MaxSize {
		return 0, fmt.Errorf("signature lists of %d bytes (at most %d): %w", len(b), MaxSize, ErrTooLarge)
	}
	entries := 0
	for off := 0; off < len(b); {
		rest := b[off:]
		if len(rest) < listHeaderSize {
			return 0, fmt.Errorf("at byte %d: %d bytes left, a signature list header is %d: %w", off, len(rest), listHeaderSize, ErrTruncated)
		}
		var typ GUID
		copy(typ[:], rest[:16])
		listSize := uint64(binary.LittleEndian.Uint32(rest[16:20]))
		headerSize := uint64(binary.LittleEndian.Uint32(rest[20:24]))
		sigSize := uint64(binary.LittleEndian.Uint32(rest[24:28]))
		if listSize > uint64(len(rest)) {
			return 0, fmt.Errorf("at byte %d: a %s list of %d bytes, %d left: %w", off, TypeName(typ), listSize, len(rest), ErrTruncated)
		}
		if listSize < listHeaderSize+headerSize {
			return 0, fmt.Errorf("at byte %d: a list of %d bytes cannot hold its %d-byte header: %w", off, listSize, listHeaderSize+headerSize, ErrListSize)
		}
		if sigSize <= ownerSize {
			return 0, fmt.Errorf("at byte %d: signature size %d holds no data after its owner GUID: %w", off, sigSize, ErrSignatureSize)
		}
		if t, known := signatureTypes[typ]; known {
			switch {
			case headerSize != 0:
				return 0, fmt.Errorf("at byte %d: a %s list with a %d-byte header (its type has none): %w", off, t.name, headerSize, ErrSignatureSize)
			case t.size != 0 && sigSize != ownerSize+uint64(t.size):
				return 0, fmt.Errorf("at byte %d: %s entries of %d bytes (its type's are %d): %w", off, t.name, sigSize, ownerSize+t.size, ErrSignatureSize)
			case t.size == 0 && sigSize > ownerSize+maxCertSize:
				return 0, fmt.Errorf("at byte %d: %s entries of %d bytes (at most %d): %w", off, t.name, sigSize, ownerSize+maxCertSize, ErrSignatureSize)
			}
		}
		body := listSize - listHeaderSize - headerSize
		if body%sigSize != 0 {
			return 0, fmt.Errorf("at byte %d: a %s list's %d bytes of entries are not a whole number of %d-byte entries: %w", off, TypeName(typ), body, sigSize, ErrListSize)
		}
		if body == 0 {
			return 0, fmt.Errorf("at byte %d: a %s list of no entries: %w", off, TypeName(typ), ErrEmpty)
		}
		sigs := rest[listHeaderSize+headerSize : listSize]
		for p := uint64(0); p < body; p += sigSize {
			e := Entry{Type: typ, Data: sigs[p+ownerSize : p+sigSize]}
			copy(e.Owner[:], sigs[p:p+ownerSize])
			entries++
			if err := fn(e); err != nil {
				return 0, err
			}
		}
		off += int(listSize)
	}
	return entries, nil
}

// Lists is what signature lists hold, by kind.
type Lists struct {
	// SHA256 are the EFI_CERT_SHA256 entries: image hashes (Authenticode
	// digests).
	SHA256 [][32]byte
	// Certificates are the EFI_CERT_X509 entries, parsed.
	Certificates []*x509.Certificate
	// Other counts the entries of any other type, by type name
	// (TypeName).
	Other map[string]int
	// Entries is the number of entries of every type.
	Entries int
}

// ParseLists reads b as EFI_SIGNATURE_LISTs (Walk's checks) holding at
// least one entry (ErrEmpty); each certificate entry must parse as X.509
// (ErrEntry).
func ParseLists(b []byte) (*Lists, error) {
	l := &Lists{}
	n, err := Walk(b, func(e Entry) error {
		switch e.Type {
		case CertSHA256:
			l.SHA256 = append(l.SHA256, [32]byte(e.Data))
		case CertX509:
			c, err := x509.ParseCertificate(e.Data)
			if err != nil {
				return fmt.Errorf("certificate entry %d: %v: %w", l.Entries, err, ErrEntry)
			}
			l.Certificates = append(l.Certificates, c)
		default:
			if l.Other == nil {
				l.Other = map[string]int{}
			}
			l.Other[TypeName(e.Type)]++
		}
		l.Entries++
		return nil
	})
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("no signature lists: %w", ErrEmpty)
	}
	return l, nil
}

// Fingerprint is a certificate's SHA-256 fingerprint (of its DER), hex:
// how policies and PCR 7's authorities name certificates.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}
