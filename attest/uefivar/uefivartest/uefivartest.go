// Package uefivartest builds the UEFI formats attest/uefivar reads, for
// tests: EFI_SIGNATURE_LISTs, and a dbx update as published (an
// EFI_VARIABLE_AUTHENTICATION_2 whose PKCS#7 a lab KEK signs).
package uefivartest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"math/big"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/smallstep/pkcs7"

	"github.com/nodeproof/nodeproof/attest/uefivar"
)

// Owner is the entries' SignatureOwner (Microsoft's, as in its dbx).
var Owner = uefivar.MustGUID("77fa9abd-0359-4d32-bd60-28f4e78f784b")

// ImageSecurityDatabase is the vendor GUID of db and dbx.
var ImageSecurityDatabase = uefivar.MustGUID("d719b2cb-3d3a-4596-a3bc-dad00e67656f")

// List is one EFI_SIGNATURE_LIST of typ whose entries are data, each
// after Owner; its signature size is the first entry's (16 with none).
func List(typ uefivar.GUID, data ...[]byte) []byte {
	size := 16
	if len(data) > 0 {
		size += len(data[0])
	}
	b := make([]byte, 28, 28+len(data)*size)
	copy(b, typ[:])
	binary.LittleEndian.PutUint32(b[16:], uint32(28+len(data)*size))
	binary.LittleEndian.PutUint32(b[24:], uint32(size))
	for _, d := range data {
		b = append(append(b, Owner[:]...), d...)
	}
	return b
}

// KEK is a key-exchange key of the lab's: a self-signed certificate and
// its key.
type KEK struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewKEK makes a KEK whose certificate's common name is cn.
func NewKEK(t testing.TB, cn string) KEK {
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
	return KEK{cert, key}
}

// Authenticated is dbx's update as published: an
// EFI_VARIABLE_AUTHENTICATION_2 (the time at, then a
// WIN_CERTIFICATE_UEFI_GUID whose PKCS#7, detached and SHA-256, k signs
// over what UEFI signs: the name, the vendor GUID, the attributes, the
// time, the data), then data.
func (k KEK) Authenticated(t testing.TB, at time.Time, data []byte) []byte {
	t.Helper()
	ts := make([]byte, 16)
	binary.LittleEndian.PutUint16(ts[0:], uint16(at.Year()))
	ts[2], ts[3], ts[4], ts[5], ts[6] = byte(at.Month()), byte(at.Day()), byte(at.Hour()), byte(at.Minute()), byte(at.Second())
	var signed bytes.Buffer
	for _, c := range utf16.Encode([]rune("dbx")) {
		_ = binary.Write(&signed, binary.LittleEndian, c)
	}
	signed.Write(ImageSecurityDatabase[:])
	_ = binary.Write(&signed, binary.LittleEndian, uint32(0x67)) // NV, BS, RT, time-based authenticated, append
	signed.Write(ts)
	signed.Write(data)
	sd, err := pkcs7.NewSignedData(signed.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	sd.SetDigestAlgorithm(pkcs7.OIDDigestAlgorithmSHA256)
	if err := sd.AddSigner(k.Cert, k.Key, pkcs7.SignerInfoConfig{}); err != nil {
		t.Fatal(err)
	}
	sd.Detach()
	sig, err := sd.Finish()
	if err != nil {
		t.Fatal(err)
	}
	wc := make([]byte, 24)
	binary.LittleEndian.PutUint32(wc[0:], uint32(len(wc)+len(sig)))
	binary.LittleEndian.PutUint16(wc[4:], 0x0200)
	binary.LittleEndian.PutUint16(wc[6:], 0x0EF1)
	copy(wc[8:], uefivar.CertTypePKCS7[:])
	return bytes.Join([][]byte{ts, wc, sig, data}, nil)
}
