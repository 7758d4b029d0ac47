package tpm

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"unicode/utf16"

	"github.com/nodeproof/nodeproof/attest/uefivar"
)

// These two parsers read UEFI structures measured into PCR 7. go-eventlog
// has parsers for both (tcg.ParseUEFIVariableData and the signature-list
// parser behind UEFIVariableData.SignatureData), but they decode field by
// field with reflection and parse every X.509 certificate in a list; on a
// real log that was a fifth of the whole verification (see
// BenchmarkTPMAttestation). nodeproof needs only the variable's name and
// data, and of dbx only its entry count and hash entries, so these read
// exactly that, with every length checked against what is left (the
// signature lists with attest/uefivar's walker, which parses no
// certificate).

// uefiVariable is a UEFI_VARIABLE_DATA: GUID, name length and data length
// (UINT64 each), the UTF-16 name, the data.
type uefiVariable struct {
	guid [16]byte
	name []uint16
	data []byte
}

const (
	maxVarName = 1024
	maxVarData = 1 << 20
)

func parseUEFIVariable(b []byte) (uefiVariable, error) {
	var v uefiVariable
	if len(b) < 32 {
		return v, errors.New("UEFI variable shorter than its header")
	}
	nameLen := binary.LittleEndian.Uint64(b[16:24])
	dataLen := binary.LittleEndian.Uint64(b[24:32])
	if nameLen > maxVarName || dataLen > maxVarData {
		return v, fmt.Errorf("UEFI variable name %d or data %d too long", nameLen, dataLen)
	}
	rest := b[32:]
	if uint64(len(rest)) < 2*nameLen+dataLen {
		return v, errors.New("UEFI variable shorter than its lengths")
	}
	copy(v.guid[:], b[:16])
	v.name = make([]uint16, nameLen)
	for i := range v.name {
		v.name[i] = binary.LittleEndian.Uint16(rest[2*i:])
	}
	v.data = rest[2*nameLen : 2*nameLen+dataLen]
	return v, nil
}

func (v uefiVariable) is(name string) bool {
	u := utf16.Encode([]rune(name))
	if len(u) != len(v.name) {
		return false
	}
	for i := range u {
		if u[i] != v.name[i] {
			return false
		}
	}
	return true
}

// The vendor GUIDs of the variables PCR 7 measures, as stored (the first
// three fields little-endian).
var (
	// efiGlobalVariableGUID, 8BE4DF61-93CA-11D2-AA0D-00E098032B8C: SecureBoot,
	// PK, KEK.
	efiGlobalVariableGUID = [16]byte{0x61, 0xdf, 0xe4, 0x8b, 0xca, 0x93, 0xd2, 0x11, 0xaa, 0x0d, 0x00, 0xe0, 0x98, 0x03, 0x2b, 0x8c}
	// efiImageSecurityDatabaseGUID, D719B2CB-3D3A-4596-A3BC-DAD00E67656F: db,
	// dbx.
	efiImageSecurityDatabaseGUID = [16]byte{0xcb, 0xb2, 0x19, 0xd7, 0x3a, 0x3d, 0x96, 0x45, 0xa3, 0xbc, 0xda, 0xd0, 0x0e, 0x67, 0x65, 0x6f}
)

// name returns the variable's name (as UTF-8; invalid UTF-16 replaced).
func (v uefiVariable) String() string { return string(utf16.Decode(v.name)) }

// imageFileName returns the file name of an EV_EFI_BOOT_SERVICES_APPLICATION
// event's UEFI_IMAGE_LOAD_EVENT (image address, length and link address,
// device path length, then the device path): the path of its last
// media file-path node (type 4, subtype 4, a NUL-terminated UTF-16 path),
// or "" when it has none or the structure does not hold. Firmware does not
// measure this data (the event's digest is the image's), so it may only
// name an image, never vouch for one.
func imageFileName(b []byte) string {
	if len(b) < 32 {
		return ""
	}
	n := binary.LittleEndian.Uint64(b[24:32])
	dp := b[32:]
	if n > uint64(len(dp)) {
		return ""
	}
	dp = dp[:n]
	name := ""
	for len(dp) >= 4 {
		typ, sub, l := dp[0], dp[1], int(binary.LittleEndian.Uint16(dp[2:4]))
		if l < 4 || l > len(dp) || typ == 0x7f {
			break
		}
		if typ == 0x04 && sub == 0x04 {
			var u []uint16
			for i := 4; i+1 < l; i += 2 {
				c := binary.LittleEndian.Uint16(dp[i:])
				if c == 0 {
					break
				}
				u = append(u, c)
			}
			name = string(utf16.Decode(u))
		}
		dp = dp[l:]
	}
	return name
}

// efiCertSHA256GUID is EFI_CERT_SHA256_GUID as stored (mixed endian).
var efiCertSHA256GUID = uefivar.CertSHA256[:]

// signatureLists walks EFI_SIGNATURE_LISTs with attest/uefivar (every
// size checked before it is read, each entry its type's size, nothing
// after the last list) and returns the number of entries and the SHA-256
// hash entries, concatenated.
func signatureLists(b []byte) (entries int, sha256s []byte, err error) {
	// Hash entries are at most two thirds of the bytes (32 of each 48):
	// one allocation instead of a doubling slice.
	sha256s = make([]byte, 0, len(b)*2/3)
	entries, err = uefivar.Walk(b, func(e uefivar.Entry) error {
		if e.Type == uefivar.CertSHA256 {
			sha256s = append(sha256s, e.Data...)
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return entries, sha256s, nil
}

// certificateEntries returns the SHA-256 fingerprints (hex, of the DER)
// of the X.509 entries of b, a variable's signature lists (KEK, db), in
// order; ok is false when b does not read as signature lists (uefivar.Walk's
// checks; an empty variable holds none and reads). The certificates are not parsed: a fingerprint
// names one exactly (the CAs' are data, attest/uefivar/microsoft).
func certificateEntries(b []byte) (fps []string, ok bool) {
	_, err := uefivar.Walk(b, func(e uefivar.Entry) error {
		if e.Type == uefivar.CertX509 {
			sum := sha256.Sum256(e.Data)
			fps = append(fps, hex.EncodeToString(sum[:]))
		}
		return nil
	})
	return fps, err == nil
}
