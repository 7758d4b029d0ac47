package certs

// Minting: keys, the CA (new and cross-signed) and the serving certificate.

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

func newKey() (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: marshal key: %w", err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certs: serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

func caTemplate(now time.Time, notAfter time.Time) (*x509.Certificate, error) {
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	return &x509.Certificate{
		SerialNumber:          sn,
		NotBefore:             now.Add(-Backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}, nil
}

// newCA makes a self-signed CA. Its path length allows one intermediate:
// the next CA cross-signed by this one.
func newCA(now time.Time) (*x509.Certificate, crypto.Signer, []byte, error) {
	key, keyPEM, err := newKey()
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl, err := caTemplate(now, now.AddDate(CAValidityYears, 0, 0))
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl.Subject = pkix.Name{CommonName: CACommonNamePrefix + "@" + strconv.FormatInt(now.Unix(), 10)}
	tmpl.MaxPathLen = 1
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certs: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	return cert, key, keyPEM, nil
}

// crossSign makes a certificate for ca's subject and key, issued by
// oldCA, valid until the earlier of the two expires. It may sign only
// end-entity certificates.
func crossSign(ca, oldCA *x509.Certificate, oldKey crypto.Signer, now time.Time) (*x509.Certificate, error) {
	notAfter := ca.NotAfter
	if oldCA.NotAfter.Before(notAfter) {
		notAfter = oldCA.NotAfter
	}
	tmpl, err := caTemplate(now, notAfter)
	if err != nil {
		return nil, err
	}
	tmpl.RawSubject = ca.RawSubject
	tmpl.SubjectKeyId = ca.SubjectKeyId
	tmpl.MaxPathLenZero = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, oldCA, ca.PublicKey, oldKey)
	if err != nil {
		return nil, fmt.Errorf("certs: cross-sign CA: %w", err)
	}
	return x509.ParseCertificate(der)
}

func newServing(ca *x509.Certificate, caKey crypto.Signer, hosts []string, now time.Time) (*x509.Certificate, crypto.Signer, []byte, error) {
	key, keyPEM, err := newKey()
	if err != nil {
		return nil, nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, nil, err
	}
	notAfter := now.AddDate(ServingValidityYears, 0, 0)
	if ca.NotAfter.Before(notAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: hosts[0]},
		NotBefore:             now.Add(-Backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certs: create serving certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	return cert, key, keyPEM, nil
}

// normalizeHosts lower-cases DNS names, canonicalises IPs, and sorts and
// de-duplicates them, DNS names first (the order of a certificate's SANs).
func normalizeHosts(in []string) ([]string, error) {
	var dns, ips []string
	for _, h := range in {
		h = strings.TrimSpace(h)
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip.String())
			continue
		}
		h = strings.TrimSuffix(strings.ToLower(h), ".")
		if err := checkDNSName(h); err != nil {
			return nil, err
		}
		dns = append(dns, h)
	}
	slices.Sort(dns)
	slices.Sort(ips)
	out := append(slices.Compact(dns), slices.Compact(ips)...)
	if len(out) == 0 {
		return nil, errors.New("certs: Options.Hosts is empty: the serving certificate needs at least one DNS name or IP address")
	}
	return out, nil
}

func checkDNSName(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("certs: host %q is not a DNS name or IP address", h)
	}
	for _, label := range strings.Split(h, ".") {
		ok := len(label) > 0 && len(label) <= 63 && label[0] != '-' && label[len(label)-1] != '-'
		for _, r := range label {
			ok = ok && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
		}
		if !ok {
			return fmt.Errorf("certs: host %q is not a DNS name or IP address", h)
		}
	}
	return nil
}

// certHosts lists a certificate's SANs in normalizeHosts order.
func certHosts(c *x509.Certificate) []string {
	var in []string
	in = append(in, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		in = append(in, ip.String())
	}
	out, _ := normalizeHosts(in)
	return out
}
