package certs

// PEM encoding of certificates and keys.

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
)

func encodeCerts(certs ...*x509.Certificate) []byte {
	var b []byte
	for _, c := range certs {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return b
}

// parseKey parses a PEM private key (PKCS#8, SEC 1 or PKCS#1) and checks
// that it belongs to cert.
func parseKey(b []byte, cert *x509.Certificate) (crypto.Signer, error) {
	block, rest := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM private key")
	}
	if len(strings.TrimSpace(string(rest))) != 0 {
		return nil, errors.New("trailing data after the private key")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		err = fmt.Errorf("unexpected PEM block %q", block.Type)
	}
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported key type %T", key)
	}
	if !samePublicKey(signer.Public(), cert.PublicKey) {
		return nil, errors.New("private key does not match the certificate")
	}
	return signer, nil
}

func samePublicKey(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}
