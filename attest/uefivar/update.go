package uefivar

import (
	"crypto/x509"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/smallstep/pkcs7"
)

// The WIN_CERTIFICATE an EFI_VARIABLE_AUTHENTICATION_2 carries.
const (
	efiTimeSize      = 16
	winCertHdrSize   = 8                             // dwLength, wRevision, wCertificateType
	winCertGUIDSize  = winCertHdrSize + 16           // then CertType
	authHeaderSize   = efiTimeSize + winCertGUIDSize // before CertData
	winCertRevision  = 0x0200
	winCertTypeGUID  = 0x0EF1 // WIN_CERT_TYPE_EFI_GUID
	maxSignatureSize = 64 << 10
)

// CertTypePKCS7 is EFI_CERT_TYPE_PKCS7_GUID, the CertType of an
// authenticated variable's signature.
var CertTypePKCS7 = MustGUID("4aafd29d-68df-49ee-8aa9-347d375665a7")

// Update is a dbx update (or any signature database update) as read.
type Update struct {
	// Authenticated: the input was an authenticated variable
	// (EFI_VARIABLE_AUTHENTICATION_2, then the lists), as updates are
	// published; else bare signature lists.
	Authenticated bool
	// Time is the authentication header's TimeStamp (zero when the
	// header's is, or for bare lists).
	Time time.Time
	// Signature is the header's CertData, a PKCS#7 SignedData (DER).
	Signature []byte
	// Signer is the certificate of the signature's one signer, when the
	// PKCS#7 parses and carries it (on Microsoft's files, its KEK signer:
	// Microsoft Corporation KEK CA 2011's, or KEK 2K CA 2023's, key);
	// SignatureErr says why not. It is read, not
	// verified: which signer to trust is the operator's choice.
	Signer       *x509.Certificate
	SignatureErr error
	// Lists are the update's signature lists.
	Lists
}

// ParseUpdate reads a dbx update: an authenticated variable
// (ParseAuthenticated) or, when b begins with a signature type this
// package knows (no header's time does), bare signature lists
// (ParseLists). Update.Authenticated says which was read.
func ParseUpdate(b []byte) (*Update, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("an update of %d bytes (at most %d): %w", len(b), MaxSize, ErrTooLarge)
	}
	if len(b) >= 16 {
		if _, known := signatureTypes[GUID(b[:16])]; known {
			l, err := ParseLists(b)
			if err != nil {
				return nil, fmt.Errorf("bare signature lists: %w", err)
			}
			return &Update{Lists: *l}, nil
		}
	}
	return ParseAuthenticated(b)
}

// ParseAuthenticated reads an authenticated variable's data as published:
// an EFI_VARIABLE_AUTHENTICATION_2 — a TimeStamp (EFI_TIME), then a
// WIN_CERTIFICATE_UEFI_GUID (dwLength, wRevision, wCertificateType,
// CertType, CertData) — followed by signature lists. It checks, in order:
// the input within MaxSize (ErrTooLarge); the whole fixed header present
// (ErrTruncated); the time's Pad1, Nanosecond, TimeZone, Daylight and
// Pad2 zero, as the specification requires, and its fields in range;
// wRevision 0x0200, wCertificateType WIN_CERT_TYPE_EFI_GUID, CertType
// EFI_CERT_TYPE_PKCS7_GUID, dwLength over its own header and within a
// bound (ErrAuthHeader); CertData within the input (ErrTruncated); then
// the rest as ParseLists does. The PKCS#7 is parsed for its signer
// (Update.Signer) but not verified, and its failing to parse is not a
// refusal (Update.SignatureErr).
func ParseAuthenticated(b []byte) (*Update, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("an authenticated variable of %d bytes (at most %d): %w", len(b), MaxSize, ErrTooLarge)
	}
	if len(b) < authHeaderSize {
		return nil, fmt.Errorf("%d bytes, an EFI_VARIABLE_AUTHENTICATION_2 header is at least %d: %w", len(b), authHeaderSize, ErrTruncated)
	}
	u := &Update{Authenticated: true}
	var err error
	if u.Time, err = efiTime(b[:efiTimeSize]); err != nil {
		return nil, err
	}
	wc := b[efiTimeSize:]
	length := uint64(binary.LittleEndian.Uint32(wc[0:4]))
	rev, typ := binary.LittleEndian.Uint16(wc[4:6]), binary.LittleEndian.Uint16(wc[6:8])
	switch {
	case rev != winCertRevision:
		return nil, fmt.Errorf("WIN_CERTIFICATE revision %#04x, want %#04x: %w", rev, winCertRevision, ErrAuthHeader)
	case typ != winCertTypeGUID:
		return nil, fmt.Errorf("WIN_CERTIFICATE type %#04x, want WIN_CERT_TYPE_EFI_GUID (%#04x): %w", typ, winCertTypeGUID, ErrAuthHeader)
	case GUID(wc[8:24]) != CertTypePKCS7:
		return nil, fmt.Errorf("certificate type %s, want EFI_CERT_TYPE_PKCS7_GUID: %w", GUID(wc[8:24]), ErrAuthHeader)
	case length <= winCertGUIDSize || length > winCertGUIDSize+maxSignatureSize:
		return nil, fmt.Errorf("WIN_CERTIFICATE of %d bytes (its header is %d, a signature at most %d): %w", length, winCertGUIDSize, maxSignatureSize, ErrAuthHeader)
	case length > uint64(len(wc)):
		return nil, fmt.Errorf("WIN_CERTIFICATE of %d bytes, %d left: %w", length, len(wc), ErrTruncated)
	}
	u.Signature = wc[winCertGUIDSize:length]
	u.Signer, u.SignatureErr = signer(u.Signature)
	l, err := ParseLists(wc[length:])
	if err != nil {
		return nil, fmt.Errorf("after the authentication header: %w", err)
	}
	u.Lists = *l
	return u, nil
}

// efiTime reads an authentication header's EFI_TIME.
func efiTime(b []byte) (time.Time, error) {
	year := int(binary.LittleEndian.Uint16(b[0:2]))
	month, day, hour, minute, second := int(b[2]), int(b[3]), int(b[4]), int(b[5]), int(b[6])
	pad1, nano := b[7], binary.LittleEndian.Uint32(b[8:12])
	zone, daylight, pad2 := binary.LittleEndian.Uint16(b[12:14]), b[14], b[15]
	if pad1 != 0 || nano != 0 || zone != 0 || daylight != 0 || pad2 != 0 {
		return time.Time{}, fmt.Errorf("TimeStamp's Pad1, Nanosecond, TimeZone, Daylight and Pad2 must be 0: %w", ErrAuthHeader)
	}
	if month > 12 || day > 31 || hour > 23 || minute > 59 || second > 59 {
		return time.Time{}, fmt.Errorf("TimeStamp %04d-%02d-%02d %02d:%02d:%02d is not a time: %w", year, month, day, hour, minute, second, ErrAuthHeader)
	}
	if year == 0 && month == 0 && day == 0 {
		return time.Time{}, nil
	}
	return time.Date(year, time.Month(month), day, hour, minute, second, 0, time.UTC), nil
}

// oidSignedData is PKCS#7's signedData content type.
var oidSignedData = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 7, 2}

// signer reads a PKCS#7's one signer's certificate. The specification's
// CertData is a SignedData; some tools write it inside a ContentInfo,
// others bare: both are read.
func signer(der []byte) (*x509.Certificate, error) {
	p7, err := pkcs7.Parse(der)
	if err != nil {
		wrapped, werr := asn1.Marshal(struct {
			ContentType asn1.ObjectIdentifier
			Content     asn1.RawValue `asn1:"explicit,tag:0"`
		}{oidSignedData, asn1.RawValue{FullBytes: der}})
		if werr != nil {
			return nil, fmt.Errorf("the signature is not a PKCS#7 SignedData: %w", err)
		}
		if p7, err = pkcs7.Parse(wrapped); err != nil {
			return nil, fmt.Errorf("the signature is not a PKCS#7 SignedData: %w", err)
		}
	}
	switch {
	case len(p7.Signers) != 1:
		return nil, fmt.Errorf("the signature has %d signers, not one", len(p7.Signers))
	case p7.GetOnlySigner() == nil:
		return nil, errors.New("the signature does not carry its signer's certificate")
	}
	return p7.GetOnlySigner(), nil
}
