// Package tpmtest helps tests and the demo stand up TPMs the way a vendor
// ships them: a manufacturer CA (root and intermediate) that issues EK
// certificates with the TCG's critical subject-alternative-name, EK
// certificates provisioned into NV, and real firmware event logs extended
// into the PCRs so that a quote and the log agree.
package tpmtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/nodeproof/nodeproof/attest/tpm/swtpm"
)

// EKCertNVIndex is where TPMs keep the RSA EK certificate, and
// ECCEKCertNVIndex the ECC P-256 one (TCG EK Credential Profile).
const (
	EKCertNVIndex    = tpmutil.Handle(0x01C00002)
	ECCEKCertNVIndex = tpmutil.Handle(0x01C0000A)
)

// VendorCA is a TPM manufacturer's CA: a root and an intermediate that
// signs EK certificates.
type VendorCA struct {
	Root, Intermediate       *x509.Certificate
	rootKey, intermediateKey crypto.Signer
}

// NewVendorCA makes a root and an intermediate, valid around now.
func NewVendorCA(name string, now time.Time) (*VendorCA, error) {
	rootKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	interKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca := &VendorCA{rootKey: rootKey, intermediateKey: interKey}
	rootTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{Organization: []string{name}, CommonName: name + " EK Root CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(20, 0, 0),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	if err != nil {
		return nil, err
	}
	if ca.Root, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	interTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{Organization: []string{name}, CommonName: name + " EK Issuing CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(15, 0, 0),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	}
	der, err = x509.CreateCertificate(rand.Reader, interTmpl, ca.Root, interKey.Public(), rootKey)
	if err != nil {
		return nil, err
	}
	if ca.Intermediate, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	return ca, nil
}

// tcgAttribute OIDs for the TPM manufacturer fields of an EK certificate's
// directoryName SAN.
var (
	oidTPMManufacturer = asn1.ObjectIdentifier{2, 23, 133, 2, 1}
	oidTPMModel        = asn1.ObjectIdentifier{2, 23, 133, 2, 2}
	oidTPMVersion      = asn1.ObjectIdentifier{2, 23, 133, 2, 3}
	oidSAN             = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidTCGKpEKCert     = asn1.ObjectIdentifier{2, 23, 133, 8, 1}
)

// IssueEK issues an EK certificate for ekPub as vendors do: empty subject,
// a critical SAN of TPM manufacturer fields, the TCG EK-certificate EKU,
// and any extra extensions.
func (ca *VendorCA) IssueEK(ekPub crypto.PublicKey, now time.Time, extra ...pkix.Extension) ([]byte, error) {
	name, err := asn1.Marshal(pkix.RDNSequence{
		{{Type: oidTPMManufacturer, Value: "id:4E505246"}},
		{{Type: oidTPMModel, Value: "nodeproof-test"}},
		{{Type: oidTPMVersion, Value: "id:00010002"}},
	})
	if err != nil {
		return nil, err
	}
	san, err := asn1.Marshal([]asn1.RawValue{{Class: asn1.ClassContextSpecific, Tag: 4, IsCompound: true, Bytes: name}})
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		KeyUsage:           x509.KeyUsageKeyEncipherment,
		UnknownExtKeyUsage: []asn1.ObjectIdentifier{oidTCGKpEKCert},
		ExtraExtensions:    append([]pkix.Extension{{Id: oidSAN, Critical: true, Value: san}}, extra...),
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca.Intermediate, ekPub, ca.intermediateKey)
}

// WriteRoots writes the root and intermediate as PEM files into dir, the
// layout attest/tpm.LoadRootSet reads.
func (ca *VendorCA) WriteRoots(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, c := range map[string]*x509.Certificate{"root.pem": ca.Root, "intermediate.pem": ca.Intermediate} {
		b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ProvisionEKCert writes certDER into the TPM's RSA EK certificate NV
// index (replacing what is there), in chunks small enough for any TPM.
func ProvisionEKCert(rw io.ReadWriter, certDER []byte) error {
	return ProvisionEKCertAt(rw, EKCertNVIndex, certDER)
}

// ProvisionEKCertAt is ProvisionEKCert at the NV index of another EK's
// certificate (ECCEKCertNVIndex).
func ProvisionEKCertAt(rw io.ReadWriter, index tpmutil.Handle, certDER []byte) error {
	_ = tpm2.NVUndefineSpace(rw, "", tpm2.HandleOwner, index)
	attrs := tpm2.AttrOwnerWrite | tpm2.AttrAuthRead | tpm2.AttrPPWrite
	if err := tpm2.NVDefineSpace(rw, tpm2.HandleOwner, index, "", "", nil, attrs, uint16(len(certDER))); err != nil {
		return fmt.Errorf("define EK certificate NV index %#x: %w", index, err)
	}
	for off := 0; off < len(certDER); off += 512 {
		end := min(off+512, len(certDER))
		if err := tpm2.NVWrite(rw, tpm2.HandleOwner, index, "", certDER[off:end], uint16(off)); err != nil {
			return fmt.Errorf("write EK certificate: %w", err)
		}
	}
	return nil
}

// WriteNV defines idx (owner-written, readable with the owner's empty
// auth, as the clouds' vTPMs keep their AK templates and certificates),
// replacing what is there, and writes data in chunks small enough for any
// TPM.
func WriteNV(rw io.ReadWriter, idx uint32, data []byte) error {
	h := tpmutil.Handle(idx)
	_ = tpm2.NVUndefineSpace(rw, "", tpm2.HandleOwner, h)
	attrs := tpm2.AttrOwnerWrite | tpm2.AttrOwnerRead | tpm2.AttrAuthRead | tpm2.AttrNoDA
	if err := tpm2.NVDefineSpace(rw, tpm2.HandleOwner, h, "", "", nil, attrs, uint16(len(data))); err != nil {
		return err
	}
	for off := 0; off < len(data); off += 512 {
		end := min(off+512, len(data))
		if err := tpm2.NVWrite(rw, tpm2.HandleOwner, h, "", data[off:end], uint16(off)); err != nil {
			return err
		}
	}
	return nil
}

// LocalCA is the swtpm manufacturer in dir (attest/tpm/swtpm's
// swtpm_localca: its root, its issuing certificate and key) as a
// VendorCA, to issue more EK certificates as that vendor.
func LocalCA(dir string) (*VendorCA, error) {
	read := func(name string) (*pem.Block, error) {
		b, err := os.ReadFile(filepath.Join(dir, "ca", name))
		if err != nil {
			return nil, err
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			return nil, fmt.Errorf("%s: no PEM block", name)
		}
		return blk, nil
	}
	ca := &VendorCA{}
	for name, dst := range map[string]**x509.Certificate{"swtpm-localca-rootca-cert.pem": &ca.Root, "issuercert.pem": &ca.Intermediate} {
		blk, err := read(name)
		if err != nil {
			return nil, err
		}
		if *dst, err = x509.ParseCertificate(blk.Bytes); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	blk, err := read("signkey.pem")
	if err != nil {
		return nil, err
	}
	key, err := x509.ParsePKCS1PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("signkey.pem: %w", err)
	}
	ca.intermediateKey = key
	return ca, nil
}

// ExtendLog is attest/tpm/swtpm.ExtendLog: a TCG event log extended into
// a fresh TPM's SHA-1, SHA-256 and SHA-384 PCRs.
func ExtendLog(rw io.ReadWriter, log []byte) (int, error) { return swtpm.ExtendLog(rw, log) }
