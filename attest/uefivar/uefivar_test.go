package uefivar_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	"github.com/nodeproof/nodeproof/attest/uefivar"
	"github.com/nodeproof/nodeproof/attest/uefivar/uefivartest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// The sizes of the header's parts, where the cases cut and patch.
const (
	efiTimeSize     = 16
	winCertGUIDSize = 24
	authHeaderSize  = efiTimeSize + winCertGUIDSize
	listHeaderSize  = 28
)

var (
	list      = uefivartest.List
	newLabKEK = uefivartest.NewKEK
)

func hash(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }

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

func guidBytes(s string) []byte { g := uefivar.MustGUID(s); return g[:] }

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
	hashes := list(uefivar.CertSHA256, hash("revoked grub"), hash("revoked shim"))
	certs := list(uefivar.CertX509, revokedCA.Cert.Raw)
	lists := slicesConcat(hashes, certs)
	good := kek.Authenticated(t, at, lists)
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
		{name: "an authenticated real dbx", in: kek.Authenticated(t, at, realDBX(t)), authenticated: true, sha256: 183, certs: 3, signer: "nodeproof lab KEK"},
		{name: "a type this package does not name is counted, not read", in: kek.Authenticated(t, at, slicesConcat(hashes, list(uefivar.MustGUID("11111111-2222-3333-4444-555555555555"), []byte("x")))), authenticated: true, sha256: 2, other: map[string]int{"11111111-2222-3333-4444-555555555555": 1}, signer: "nodeproof lab KEK"},
		{name: "X.509 TBS hashes are counted by type", in: list(uefivar.CertX509SHA256, make([]byte, 48)), other: map[string]int{"EFI_CERT_X509_SHA256": 1}},
		{name: "a signature that is not PKCS#7 is read, its signer unknown", in: patch(good, authHeaderSize, 0x04), authenticated: true, sha256: 2, certs: 1},
		{name: "empty", in: nil, err: uefivar.ErrTruncated},
		{name: "a truncated header", in: good[:authHeaderSize-1], err: uefivar.ErrTruncated},
		{name: "a header cut inside its signature", in: good[:authHeaderSize+10], err: uefivar.ErrTruncated},
		{name: "wRevision 0x0100", in: patch(good, efiTimeSize+4, 0x00, 0x01), err: uefivar.ErrAuthHeader},
		{name: "wCertificateType WIN_CERT_TYPE_PKCS_SIGNED_DATA", in: patch(good, efiTimeSize+6, 0x02, 0x00), err: uefivar.ErrAuthHeader},
		{name: "CertType EFI_CERT_TYPE_RSA2048_SHA256", in: patch(good, efiTimeSize+8, guidBytes("a7717414-c616-4977-9420-844712a735bf")...), err: uefivar.ErrAuthHeader},
		{name: "a TimeStamp with nanoseconds", in: patch(good, 8, 1), err: uefivar.ErrAuthHeader},
		{name: "a TimeStamp in month 13", in: patch(good, 2, 13), err: uefivar.ErrAuthHeader},
		{name: "dwLength no more than its header", in: patch(good, efiTimeSize, le32(winCertGUIDSize)...), err: uefivar.ErrAuthHeader},
		{name: "dwLength past the end", in: patch(good, efiTimeSize, le32(uint32(len(good)))...), err: uefivar.ErrTruncated},
		{name: "an authentication header and no lists", in: good[:sigEnd], err: uefivar.ErrEmpty},
		{name: "a list longer than what is left", in: patch(good, sigEnd+16, le32(uint32(len(lists)+1))...), err: uefivar.ErrTruncated},
		{name: "a list's size shorter than its header", in: patch(lists, 16, le32(20)...), err: uefivar.ErrListSize},
		{name: "a hash list with trailing bytes", in: slicesConcat(patch(hashes, 16, le32(uint32(len(hashes)+5))...), make([]byte, 5), certs), err: uefivar.ErrListSize},
		{name: "trailing bytes after the last list", in: slicesConcat(good, []byte{0, 0, 0}), err: uefivar.ErrTruncated},
		{name: "a list of no entries", in: kek.Authenticated(t, at, slicesConcat(patch(list(uefivar.CertSHA256), 24, le32(48)...), hashes)), err: uefivar.ErrEmpty},
		{name: "SHA-256 entries of 16+20 bytes", in: list(uefivar.CertSHA256, make([]byte, 20)), err: uefivar.ErrSignatureSize},
		{name: "entries of no data", in: patch(list(uefivar.CertSHA256, hash("a")), 24, le32(16)...), err: uefivar.ErrSignatureSize},
		{name: "a SHA-256 list with a header", in: patch(patch(slicesConcat(hashes[:listHeaderSize], make([]byte, 96)), 16, le32(listHeaderSize+96)...), 20, le32(48)...), err: uefivar.ErrSignatureSize},
		{name: "a certificate entry that is not one", in: list(uefivar.CertX509, []byte("not a certificate")), err: uefivar.ErrEntry},
		{name: "larger than the bound", in: make([]byte, uefivar.MaxSize+1), err: uefivar.ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := uefivar.ParseUpdate(tc.in)
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
	u, err := uefivar.ParseUpdate(good)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(u.SHA256[0][:], hash("revoked grub")) || !bytes.Equal(u.SHA256[1][:], hash("revoked shim")) || uefivar.Fingerprint(u.Certificates[0]) != uefivar.Fingerprint(revokedCA.Cert) {
		t.Fatal("the entries read are not the update's")
	}
}

// TestRealDatabases: every signature database (PK, KEK, db, dbx) the
// real firmware logs measured into PCR 7 reads, and each dbx holds the
// entries firmware-testdata counted by hand.
func TestRealDatabases(t *testing.T) {
	logs, err := firmwaretestdata.Logs()
	if err != nil {
		t.Fatal(err)
	}
	read, dbxs := 0, 0
	for _, l := range logs {
		el, err := tcg.ParseEventLog(l.Raw, tcg.ParseOpts{AllowPadding: true})
		if err != nil {
			continue // a log go-eventlog does not read: its databases are not known here
		}
		for _, h := range []register.HashAlg{register.HashSHA256, register.HashSHA1} {
			for _, ev := range el.Events(h) {
				if ev.Index != 7 || ev.Type != tcg.EFIVariableDriverConfig {
					continue
				}
				v, err := tcg.ParseUEFIVariableData(bytes.NewReader(ev.Data))
				name := ""
				if err == nil {
					name = string(utf16.Decode(v.UnicodeName))
				}
				if (name != "PK" && name != "KEK" && name != "db" && name != "dbx") || len(v.VariableData) == 0 {
					continue
				}
				n, err := uefivar.Walk(v.VariableData, func(uefivar.Entry) error { return nil })
				if err != nil {
					t.Errorf("%s: %s: %v", l.Name, name, err)
					continue
				}
				read++
				if name == "dbx" && h == register.HashSHA256 {
					dbxs++
					if n != l.Expected.DBXEntries {
						t.Errorf("%s: dbx of %d entries; counted by hand %d", l.Name, n, l.Expected.DBXEntries)
					}
				}
			}
		}
	}
	if read < 100 || dbxs < 15 {
		t.Fatalf("only %d databases (%d SHA-256 dbx) read from %d logs", read, dbxs, len(logs))
	}
	t.Logf("%d databases read, %d dbx counts as counted by hand", read, dbxs)
}

// TestGUID: a GUID written is stored with its first three fields
// little-endian, and written back the same.
func TestGUID(t *testing.T) {
	g := uefivar.MustGUID("c1c41626-504c-4092-aca9-41f936934328")
	if want := []byte{0x26, 0x16, 0xc4, 0xc1, 0x4c, 0x50, 0x92, 0x40, 0xac, 0xa9, 0x41, 0xf9, 0x36, 0x93, 0x43, 0x28}; !bytes.Equal(g[:], want) {
		t.Fatalf("%x; want %x", g, want)
	}
	if g.String() != "c1c41626-504c-4092-aca9-41f936934328" || uefivar.TypeName(g) != "EFI_CERT_SHA256" {
		t.Fatalf("%s %s", g, uefivar.TypeName(g))
	}
}

// FuzzParseUpdate: any bytes are read or refused with one of the
// package's refusals; what is read is consistent (every entry counted
// once, by kind) and, for bare lists, every hash read is in the input.
func FuzzParseUpdate(f *testing.F) {
	kek := newLabKEK(f, "nodeproof lab KEK")
	lists := slicesConcat(list(uefivar.CertSHA256, hash("a"), hash("b")), list(uefivar.CertX509, kek.Cert.Raw))
	f.Add(lists)
	f.Add(kek.Authenticated(f, time.Date(2025, 2, 18, 0, 0, 0, 0, time.UTC), lists))
	f.Add(list(uefivar.CertX509SHA256, make([]byte, 48)))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := uefivar.ParseUpdate(b)
		if err != nil {
			n := 0
			for _, e := range []error{uefivar.ErrTooLarge, uefivar.ErrTruncated, uefivar.ErrAuthHeader, uefivar.ErrListSize, uefivar.ErrSignatureSize, uefivar.ErrEmpty, uefivar.ErrEntry} {
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
