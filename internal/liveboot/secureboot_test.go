package liveboot

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"path/filepath"
	"testing"
	"unicode/utf16"

	"github.com/nodeproof/nodeproof/attest/bootimage"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// TestDmpstoreEntry: an entry decodes back, as the UEFI shell's dmpstore
// reads it, with its CRC32.
func TestDmpstoreEntry(t *testing.T) {
	data := []byte("data")
	b := dmpstoreEntry("db", imageDBGUID, attrAuth, data)
	ns, ds := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
	if ns != 6 || ds != 4 || len(b) != 8+6+16+4+4+4 {
		t.Fatalf("sizes %d %d, %d bytes", ns, ds, len(b))
	}
	name := make([]uint16, 3)
	for i := range name {
		name[i] = binary.LittleEndian.Uint16(b[8+2*i:])
	}
	if string(utf16.Decode(name)) != "db\x00" || !bytes.Equal(b[14:30], guidBytes(imageDBGUID)) ||
		binary.LittleEndian.Uint32(b[30:]) != attrAuth || !bytes.Equal(b[34:38], data) ||
		binary.LittleEndian.Uint32(b[38:]) != crc32.ChecksumIEEE(b[:38]) {
		t.Fatalf("entry %x", b)
	}
	// The shim's GUID as stored: the claims' owner of its list entries.
	if !bytes.Equal(guidBytes(shimLockGUID), []byte{0x50, 0xab, 0x5d, 0x60, 0x46, 0xe0, 0x00, 0x43, 0xab, 0xb6, 0x3d, 0xd8, 0x10, 0xdd, 0x8b, 0x23}) {
		t.Fatal("GUID bytes")
	}
}

// TestStoreVariable reads OVMF's Microsoft-keyed store: its db is what
// the live boot measured into PCR 7 (go-eventlog); the keyless store has
// no PK.
func TestStoreVariable(t *testing.T) {
	db, err := StoreVariable(OVMFVarsMS, "db", imageDBGUID)
	if err != nil {
		t.Fatal(err)
	}
	measured, err := MeasuredVariable(firmwaretestdata.MustLog("debian-12-ovmf-secure-boot"), "db")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(db, measured) {
		t.Fatalf("OVMF's db (%d bytes) is not the one the live boot measured (%d bytes)", len(db), len(measured))
	}
	if _, err := StoreVariable(OVMFVarsNoKeys, "PK", efiGlobalGUID); err == nil {
		t.Fatal("a PK in the keyless store")
	}
	if n, err := listEntries(db); err != nil || n != 2 {
		t.Fatalf("Microsoft's db: %d entries, %v", n, err)
	}
	dbx, err := RealDBX()
	if err != nil {
		t.Fatal(err)
	}
	if n, err := listEntries(dbx); err != nil || n != 186 {
		t.Fatalf("the real dbx: %d entries, %v", n, err)
	}
}

// TestSignerLabFiles: the signer tests' files say what the chains claim:
// the previous kernel is another image Debian signed with the same key as
// the current one (both signers issued by the shim's vendor
// certificate), and a kernel re-signed by a test key keeps its
// Authenticode digest under a signer that key's CA issued.
func TestSignerLabFiles(t *testing.T) {
	ctx := context.Background()
	cur, err := LoadParts(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	prev, err := LoadPreviousKernel(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	keys, err := EnsureSecureBootKeys(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	read := func(path string) *bootimage.Image {
		img, err := bootimage.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	shim, a, b := read(cur.Path(cur.Shim)), read(cur.Path(cur.Kernel)), read(prev.Path(prev.Kernel))
	if prev.ABI == cur.ABI || bytes.Equal(a.AuthenticodeSHA256, b.AuthenticodeSHA256) {
		t.Fatalf("the previous kernel (%s) is the current one (%s)", prev.ABI, cur.ABI)
	}
	for _, k := range []*bootimage.Image{a, b} {
		if len(k.Signatures) != 1 || k.Signatures[0].Signer.CheckSignatureFrom(shim.VendorCerts[0]) != nil {
			t.Fatalf("a Debian kernel not signed under the shim's vendor certificate")
		}
	}
	for _, c := range []struct {
		signer, ca KeyPair
	}{{keys.DBSigner, keys.DBCA}, {keys.MOKSigner, keys.MOKCA}} {
		out := filepath.Join(t.TempDir(), "vmlinuz")
		if err := c.signer.Sign(ctx, cur.Path(cur.Kernel), out); err != nil {
			t.Fatal(err)
		}
		k := read(out)
		if !bytes.Equal(k.AuthenticodeSHA256, a.AuthenticodeSHA256) || len(k.Signatures) != 1 || k.Signatures[0].Signer.CheckSignatureFrom(c.ca.Cert) != nil {
			t.Fatalf("re-signed by %s: digest %x (kernel A's %x), %d signatures", c.signer.Cert.Subject, k.AuthenticodeSHA256, a.AuthenticodeSHA256, len(k.Signatures))
		}
	}
}
