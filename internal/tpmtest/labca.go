package tpmtest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
)

// LabCA is a root and an intermediate under it, RSA-2048, made from
// templates: a stand-in for a cloud's certificate hierarchy (Google's
// EK/AK CA in identity/gcevtpm/gcevtpmtest, Azure's vTPM and IMDS TLS
// hierarchies in identity/azuretpm/azuretpmtest).
type LabCA struct {
	Root, Intermediate       *x509.Certificate
	rootKey, intermediateKey *rsa.PrivateKey
}

// NewLabCA makes root, self-signed, and inter, signed by it, each with a
// fresh RSA-2048 key. The templates say everything else: names, validity,
// key usages, extensions.
func NewLabCA(root, inter *x509.Certificate) (*LabCA, error) {
	ca := &LabCA{}
	var err error
	if ca.rootKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		return nil, err
	}
	if ca.intermediateKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, root, root, ca.rootKey.Public(), ca.rootKey)
	if err != nil {
		return nil, err
	}
	if ca.Root, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	if der, err = x509.CreateCertificate(rand.Reader, inter, ca.Root, ca.intermediateKey.Public(), ca.rootKey); err != nil {
		return nil, err
	}
	if ca.Intermediate, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	return ca, nil
}

// Issue signs tmpl for pub with the intermediate and returns the
// certificate's DER.
func (ca *LabCA) Issue(tmpl *x509.Certificate, pub crypto.PublicKey) ([]byte, error) {
	return x509.CreateCertificate(rand.Reader, tmpl, ca.Intermediate, pub, ca.intermediateKey)
}
