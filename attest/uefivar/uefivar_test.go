package uefivar

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"math/big"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	"github.com/smallstep/pkcs7"

	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// owner is the entries' SignatureOwner (Microsoft's, as in its dbx).
var owner = MustGUID("77fa9abd-0359-4d32-bd60-28f4e78f784b")

// list builds one EFI_SIGNATURE_LIST of typ whose entries are data (each
// after the owner GUID).
func list(typ GUID, data ...[]byte) []byte {
	size := ownerSize
	if len(data) > 0 {
		size += len(data[0])
	}
	b := make([]byte, listHeaderSize, listHeaderSize+len(data)*size)
	copy(b, typ[:])
	binary.LittleEndian.PutUint32(b[16:], uint32(listHeaderSize+len(data)*size))
	binary.LittleEndian.PutUint32(b[24:], uint32(size))
	for _, d := range data {
		b = append(append(b, owner[:]...), d...)
	}
	return b
}

func hash(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }

// labKEK is a KEK of the lab's: a certificate and its key.
type labKEK struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newLabKEK(t testing.TB, cn string) labKEK {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: cn, Organization: []string{"nodeproof lab"}},
		NotBefore: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2034, 1, 1, 0, 0, 0, 0, time.UTC),
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return labKEK{cert, key}
}

// imageSecurityDatabase is the vendor GUID of db and dbx.
var imageSecurityDatabase = MustGUID("d719b2cb-3d3a-4596-a3bc-dad00e67656f")

// authenticated builds dbx's update as published: an
// EFI_VARIABLE_AUTHENTICATION_2 whose PKCS#7 (detached, SHA-256) k signs
// over what UEFI signs (the name, the vendor GUID, the attributes, the
// time, the data), then data.
func (k labKEK) authenticated(t testing.TB, at time.Time, data []byte) []byte {
	t.Helper()
	ts := make([]byte, efiTimeSize)
	binary.LittleEndian.PutUint16(ts[0:], uint16(at.Year()))
	ts[2], ts[3], ts[4], ts[5], ts[6] = byte(at.Month()), byte(at.Day()), byte(at.Hour()), byte(at.Minute()), byte(at.Second())
	var signed bytes.Buffer
	for _, c := range utf16.Encode([]rune("dbx")) {
		_ = binary.Write(&signed, binary.LittleEndian, c)
	}
	signed.Write(imageSecurityDatabase[:])
	_ = binary.Write(&signed, binary.LittleEndian, uint32(0x67)) // NV, BS, RT, time-based authenticated, append
	signed.Write(ts)
	signed.Write(data)
	sd, err := pkcs7.NewSignedData(signed.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	sd.SetDigestAlgorithm(pkcs7.OIDDigestAlgorithmSHA256)
	if err := sd.AddSigner(k.cert, k.key, pkcs7.SignerInfoConfig{}); err != nil {
		t.Fatal(err)
	}
	sd.Detach()
	sig, err := sd.Finish()
	if err != nil {
		t.Fatal(err)
	}
	wc := make([]byte, winCertGUIDSize)
	binary.LittleEndian.PutUint32(wc[0:], uint32(winCertGUIDSize+len(sig)))
	binary.LittleEndian.PutUint16(wc[4:], winCertRevision)
	binary.LittleEndian.PutUint16(wc[6:], winCertTypeGUID)
	copy(wc[8:], CertTypePKCS7[:])
	return slicesConcat(ts, wc, sig, data)
}

func slicesConcat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// patch returns a copy of b with v written at off.
func patch(b []byte, off int, v ...byte) []byte {
	out := bytes.Clone(b)
	copy(out[off:], v)
	return out
}

func guidBytes(s string) []byte { g := MustGUID(s); return g[:] }

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

// realDBX is the dbx a real machine measured (firmware-testdata's
// rhel8-uefi, a GCE VM in 2021): 183 image hashes and 3 certificates.
func realDBX(t testing.TB) []byte {
	t.Helper()
	el, err := tcg.ParseEventLog(firmwaretestdata.MustLog("rhel8-uefi"), tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range el.Events(register.HashSHA256) {
		if e.Index != 7 || e.Type != tcg.EFIVariableDriverConfig {
			continue
		}
		v, err := tcg.ParseUEFIVariableData(bytes.NewReader(e.Data))
		if err == nil && string(utf16.Decode(v.UnicodeName)) == "dbx" {
			return v.VariableData
		}
	}
	t.Fatal("rhel8-uefi measured no dbx")
	return nil
}

func TestParseUpdate(t *testing.T) {
	kek := newLabKEK(t, "nodeproof lab KEK")
	revokedCA := newLabKEK(t, "a revoked signer")
	at := time.Date(2025, 2, 18, 9, 30, 0, 0, time.UTC)
	hashes := list(CertSHA256, hash("revoked grub"), hash("revoked shim"))
	certs := list(CertX509, revokedCA.cert.Raw)
	lists := slicesConcat(hashes, certs)
	good := kek.authenticated(t, at, lists)
	sigEnd := len(good) - len(lists) // where the lists start
	for _, tc := range []struct {
		name          string
		in            []byte
		err           error // nil: read
		authenticated bool
		sha256, certs int
		other         map[string]int
		signer        string
	}{
		{name: "an authenticated update: hashes and a certificate, signed by the lab's KEK", in: good, authenticated: true, sha256: 2, certs: 1, signer: "nodeproof lab KEK"},
		{name: "bare signature lists", in: lists, sha256: 2, certs: 1},
		{name: "a real machine's dbx, bare", in: realDBX(t), sha256: 183, certs: 3},
		{name: "an authenticated real dbx", in: kek.authenticated(t, at, realDBX(t)), authenticated: true, sha256: 183, certs: 3, signer: "nodeproof lab KEK"},
		{name: "a type this package does not name is counted, not read", in: kek.authenticated(t, at, slicesConcat(hashes, list(MustGUID("11111111-2222-3333-4444-555555555555"), []byte("x")))), authenticated: true, sha256: 2, other: map[string]int{"11111111-2222-3333-4444-555555555555": 1}, signer: "nodeproof lab KEK"},
		{name: "X.509 TBS hashes are counted by type", in: list(CertX509SHA256, make([]byte, 48)), other: map[string]int{"EFI_CERT_X509_SHA256": 1}},
		{name: "a signature that is not PKCS#7 is read, its signer unknown", in: patch(good, authHeaderSize, 0x04), authenticated: true, sha256: 2, certs: 1},
		{name: "empty", in: nil, err: ErrTruncated},
		{name: "a truncated header", in: good[:authHeaderSize-1], err: ErrTruncated},
		{name: "a header cut inside its signature", in: good[:authHeaderSize+10], err: ErrTruncated},
		{name: "wRevision 0x0100", in: patch(good, efiTimeSize+4, 0x00, 0x01), err: ErrAuthHeader},
		{name: "wCertificateType WIN_CERT_TYPE_PKCS_SIGNED_DATA", in: patch(good, efiTimeSize+6, 0x02, 0x00), err: ErrAuthHeader},
		{name: "CertType EFI_CERT_TYPE_RSA2048_SHA256", in: patch(good, efiTimeSize+8, guidBytes("a7717414-c616-4977-9420-844712a735bf")...), err: ErrAuthHeader},
		{name: "a TimeStamp with nanoseconds", in: patch(good, 8, 1), err: ErrAuthHeader},
		{name: "a TimeStamp in month 13", in: patch(good, 2, 13), err: ErrAuthHeader},
		{name: "dwLength no more than its header", in: patch(good, efiTimeSize, le32(winCertGUIDSize)...), err: ErrAuthHeader},
		{name: "dwLength past the end", in: patch(good, efiTimeSize, le32(uint32(len(good)))...), err: ErrTruncated},
		{name: "an authentication header and no lists", in: good[:sigEnd], err: ErrEmpty},
		{name: "a list longer than what is left", in: patch(good, sigEnd+16, le32(uint32(len(lists)+1))...), err: ErrTruncated},
		{name: "a list's size shorter than its header", in: patch(lists, 16, le32(20)...), err: ErrListSize},
		{name: "a hash list with trailing bytes", in: slicesConcat(patch(hashes, 16, le32(uint32(len(hashes)+5))...), make([]byte, 5), certs), err: ErrListSize},
		{name: "trailing bytes after the last list", in: slicesConcat(good, []byte{0, 0, 0}), err: ErrTruncated},
		{name: "a list of no entries", in: kek.authenticated(t, at, slicesConcat(patch(list(CertSHA256), 24, le32(48)...), hashes)), err: ErrEmpty},
		{name: "SHA-256 entries of 16+20 bytes", in: list(CertSHA256, make([]byte, 20)), err: ErrSignatureSize},
		{name: "entries of no data", in: patch(list(CertSHA256, hash("a")), 24, le32(16)...), err: ErrSignatureSize},
		{name: "a SHA-256 list with a header", in: patch(patch(slicesConcat(hashes[:listHeaderSize], make([]byte, 96)), 16, le32(listHeaderSize+96)...), 20, le32(48)...), err: ErrSignatureSize},
		{name: "a certificate entry that is not one", in: list(CertX509, []byte("not a certificate")), err: ErrEntry},
		{name: "larger than the bound", in: make([]byte, MaxSize+1), err: ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := ParseUpdate(tc.in)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v; want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if u.Authenticated != tc.authenticated || len(u.SHA256) != tc.sha256 || len(u.Certificates) != tc.certs || len(u.Other) != len(tc.other) {
				t.Fatalf("authenticated %v, %d hashes, %d certificates, other %v; want %v, %d, %d, %v", u.Authenticated, len(u.SHA256), len(u.Certificates), u.Other, tc.authenticated, tc.sha256, tc.certs, tc.other)
			}
			for k, n := range tc.other {
				if u.Other[k] != n {
					t.Fatalf("other %v; want %v", u.Other, tc.other)
				}
			}
			if got := u.Entries; got != tc.sha256+tc.certs+len(tc.other) {
				t.Fatalf("%d entries", got)
			}
			switch {
			case tc.signer == "" && u.Signer != nil:
				t.Fatalf("signer %s; want none", u.Signer.Subject)
			case tc.signer != "" && (u.Signer == nil || u.Signer.Subject.CommonName != tc.signer):
				t.Fatalf("signer %v (%v); want %s", u.Signer, u.SignatureErr, tc.signer)
			case tc.authenticated && !u.Time.Equal(at):
				t.Fatalf("time %v; want %v", u.Time, at)
			}
		})
	}
	// The hashes are the update's, in order; the certificate is the one
	// the lists carry.
	u, err := ParseUpdate(good)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(u.SHA256[0][:], hash("revoked grub")) || !bytes.Equal(u.SHA256[1][:], hash("revoked shim")) || Fingerprint(u.Certificates[0]) != Fingerprint(revokedCA.cert) {
		t.Fatal("the entries read are not the update's")
	}
}

// TestGUID: a GUID written is stored with its first three fields
// little-endian, and written back the same.
func TestGUID(t *testing.T) {
	g := MustGUID("c1c41626-504c-4092-aca9-41f936934328")
	if want := []byte{0x26, 0x16, 0xc4, 0xc1, 0x4c, 0x50, 0x92, 0x40, 0xac, 0xa9, 0x41, 0xf9, 0x36, 0x93, 0x43, 0x28}; !bytes.Equal(g[:], want) {
		t.Fatalf("%x; want %x", g, want)
	}
	if g.String() != "c1c41626-504c-4092-aca9-41f936934328" || TypeName(g) != "EFI_CERT_SHA256" {
		t.Fatalf("%s %s", g, TypeName(g))
	}
}

// FuzzParseUpdate: any bytes are read or refused with one of the
// package's refusals; what is read is consistent (every entry counted
// once, by kind) and, for bare lists, every hash read is in the input.
func FuzzParseUpdate(f *testing.F) {
	kek := newLabKEK(f, "nodeproof lab KEK")
	lists := slicesConcat(list(CertSHA256, hash("a"), hash("b")), list(CertX509, kek.cert.Raw))
	f.Add(lists)
	f.Add(kek.authenticated(f, time.Date(2025, 2, 18, 0, 0, 0, 0, time.UTC), lists))
	f.Add(list(CertX509SHA256, make([]byte, 48)))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := ParseUpdate(b)
		if err != nil {
			n := 0
			for _, e := range []error{ErrTooLarge, ErrTruncated, ErrAuthHeader, ErrListSize, ErrSignatureSize, ErrEmpty, ErrEntry} {
				if errors.Is(err, e) {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%v wraps %d of the refusals", err, n)
			}
			return
		}
		other := 0
		for _, n := range u.Other {
			other += n
		}
		if u.Entries == 0 || u.Entries != len(u.SHA256)+len(u.Certificates)+other {
			t.Fatalf("%d entries: %d hashes, %d certificates, %d other", u.Entries, len(u.SHA256), len(u.Certificates), other)
		}
		for _, h := range u.SHA256 {
			if !bytes.Contains(b, h[:]) {
				t.Fatalf("hash %x is not in the input", h)
			}
		}
		if u.Authenticated && len(u.Signature) == 0 {
			t.Fatal("an authenticated update without its signature")
		}
	})
}
