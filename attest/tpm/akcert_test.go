package tpm_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
)

type akNode struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// akIssue makes a certificate from tmpl's subject, CA flag, key usages,
// extensions and validity (a year around now when unset), signed by
// parent (self-signed when nil).
func akIssue(t testing.TB, now time.Time, tmpl x509.Certificate, parent *akNode) *akNode {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.BasicConstraintsValid = true
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = now.AddDate(0, -6, 0), now.AddDate(0, 6, 0)
	}
	signer, signerKey := &tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &akNode{cert: cert, key: key}
}

// TestVerifyAKCert: each check of VerifyAKCert, with its reason, under
// the options GCE and Azure use.
func TestVerifyAKCert(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	ca := x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	root := akIssue(t, now, x509.Certificate{Subject: pkix.Name{CommonName: "root"}, IsCA: true, KeyUsage: ca}, nil)
	inter := akIssue(t, now, x509.Certificate{Subject: pkix.Name{CommonName: "intermediate"}, IsCA: true, KeyUsage: ca}, root)
	old := akIssue(t, now, x509.Certificate{Subject: pkix.Name{CommonName: "expired intermediate"}, IsCA: true, KeyUsage: ca,
		NotBefore: now.AddDate(-2, 0, 0), NotAfter: now.AddDate(-1, 0, 0)}, root)
	leaf := func(ku x509.KeyUsage, mod func(*x509.Certificate)) []byte {
		tmpl := x509.Certificate{Subject: pkix.Name{CommonName: "ak"}, KeyUsage: ku}
		if mod != nil {
			mod(&tmpl)
		}
		return akIssue(t, now, tmpl, inter).cert.Raw
	}
	signing := leaf(x509.KeyUsageDigitalSignature, nil)
	roots := x509.NewCertPool()
	roots.AddCert(root.cert)
	gce := func(o *tpm.AKCertOptions) { o.RequireDigitalSignature = true }
	known := func(o *tpm.AKCertOptions) { o.Intermediates = []*x509.Certificate{inter.cert} }
	fetches := func(got []*x509.Certificate, err error) func(*tpm.AKCertOptions) {
		return func(o *tpm.AKCertOptions) {
			o.Fetch = func(*x509.Certificate, []*x509.Certificate) ([]*x509.Certificate, error) { return got, err }
		}
	}
	for _, c := range []struct {
		name   string
		cert   []byte
		inters [][]byte
		opts   []func(*tpm.AKCertOptions)
		reason attest.Reason // "" when accepted
		msg    string        // in the refusal
	}{
		{"through the node's intermediate", signing, [][]byte{inter.cert.Raw}, nil, "", ""},
		{"through the trust's intermediate", signing, nil, []func(*tpm.AKCertOptions){known}, "", ""},
		{"through a fetched issuer", signing, nil, []func(*tpm.AKCertOptions){fetches([]*x509.Certificate{inter.cert}, nil)}, "", ""},
		{"no certificate", nil, nil, nil, attest.ReasonAKCertMissing, "no AK certificate: NV 0x01"},
		{"too large", make([]byte, 8<<10+1), nil, nil, attest.ReasonMalformed, "exceeds"},
		{"too many intermediates", signing, [][]byte{{1}, {2}, {3}, {4}, {5}}, nil, attest.ReasonMalformed, "at most 4"},
		{"a too large intermediate", signing, [][]byte{make([]byte, 8<<10+1)}, nil, attest.ReasonMalformed, "an intermediate of"},
		{"not DER", []byte("garbage"), nil, nil, attest.ReasonAKCertInvalid, "does not parse"},
		{"an intermediate not DER", signing, [][]byte{[]byte("garbage")}, nil, attest.ReasonAKCertInvalid, "an intermediate does not parse"},
		{"a CA certificate", inter.cert.Raw, nil, nil, attest.ReasonAKCertInvalid, "is a CA certificate"},
		{"a certificate-signing key usage", leaf(x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature, nil), nil, nil, attest.ReasonAKCertInvalid, "is a CA certificate"},
		{"an encryption key", leaf(x509.KeyUsageKeyEncipherment, nil), [][]byte{inter.cert.Raw}, nil, attest.ReasonAKCertInvalid, "no digitalSignature key usage)"},
		{"an encryption key, GCE", leaf(x509.KeyUsageKeyEncipherment, nil), [][]byte{inter.cert.Raw}, []func(*tpm.AKCertOptions){gce}, attest.ReasonAKCertInvalid, "an EK or encryption key certificate is no AK certificate"},
		{"no key usage stated", leaf(0, nil), [][]byte{inter.cert.Raw}, nil, "", ""},
		{"no key usage stated, GCE", leaf(0, nil), [][]byte{inter.cert.Raw}, []func(*tpm.AKCertOptions){gce}, attest.ReasonAKCertInvalid, "no digitalSignature"},
		{"an unhandled critical extension", leaf(x509.KeyUsageDigitalSignature, func(c *x509.Certificate) {
			c.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 2, 3, 4}, Critical: true, Value: []byte{5, 0}}}
		}), [][]byte{inter.cert.Raw}, nil, attest.ReasonAKCertInvalid, "unhandled critical extension 1.2.3.4"},
		{"outside its validity", leaf(x509.KeyUsageDigitalSignature, func(c *x509.Certificate) {
			c.NotBefore, c.NotAfter = now.AddDate(0, 0, 1), now.AddDate(0, 0, 2)
		}), [][]byte{inter.cert.Raw}, nil, attest.ReasonAKCertExpired, "the AK certificate is valid from"},
		{"an expired intermediate", akIssue(t, now, x509.Certificate{Subject: pkix.Name{CommonName: "ak"}, KeyUsage: x509.KeyUsageDigitalSignature}, old).cert.Raw,
			[][]byte{old.cert.Raw}, nil, attest.ReasonAKCertExpired, "outside its validity"},
		{"no issuer", signing, nil, nil, attest.ReasonAKCertUntrusted, "does not chain to a pinned Lab root"},
		{"no issuer, fetching fails", signing, nil, []func(*tpm.AKCertOptions){fetches(nil, errors.New("offline"))}, attest.ReasonAKCertUntrusted, "fetching it failed: offline"},
		{"no issuer, nothing fetched", signing, nil, []func(*tpm.AKCertOptions){fetches(nil, nil)}, attest.ReasonAKCertUntrusted, "does not chain to a pinned Lab root"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := tpm.AKCertOptions{Missing: "NV 0x01", MaxCertificateSize: 8 << 10, MaxIntermediates: 4, Roots: roots, RootName: "Lab"}
			for _, f := range c.opts {
				f(&o)
			}
			got, err := tpm.VerifyAKCert(c.cert, c.inters, now, o)
			if c.reason == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got.Subject.CommonName != "ak" {
					t.Errorf("returned %q", got.Subject)
				}
				return
			}
			if r, _ := attest.ReasonOf(err); r != c.reason || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("%v, want %s with %q", err, c.reason, c.msg)
			}
		})
	}
}

// FuzzVerifyAKCert: any bytes as an AK certificate and an intermediate
// beside it are refused with a typed reason, or accepted only as an
// end-entity certificate valid at now; never a panic, never an untyped
// error. Seeds: a lab chain's leaf and intermediate.
func FuzzVerifyAKCert(f *testing.F) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	ca := x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	root := akIssue(f, now, x509.Certificate{Subject: pkix.Name{CommonName: "root"}, IsCA: true, KeyUsage: ca}, nil)
	inter := akIssue(f, now, x509.Certificate{Subject: pkix.Name{CommonName: "intermediate"}, IsCA: true, KeyUsage: ca}, root)
	leaf := akIssue(f, now, x509.Certificate{Subject: pkix.Name{CommonName: "ak"}, KeyUsage: x509.KeyUsageDigitalSignature}, inter)
	f.Add(leaf.cert.Raw, inter.cert.Raw)
	f.Add(leaf.cert.Raw, []byte(nil))
	f.Add(inter.cert.Raw, root.cert.Raw)
	roots := x509.NewCertPool()
	roots.AddCert(root.cert)
	f.Fuzz(func(t *testing.T, cert, in []byte) {
		var inters [][]byte
		if in != nil {
			inters = [][]byte{in}
		}
		for _, required := range []bool{false, true} {
			got, err := tpm.VerifyAKCert(cert, inters, now, tpm.AKCertOptions{
				Missing: "none", MaxCertificateSize: 8 << 10, MaxIntermediates: 4, Roots: roots, RootName: "Lab",
				RequireDigitalSignature: required,
			})
			if err != nil {
				if _, ok := attest.ReasonOf(err); !ok {
					t.Fatalf("untyped refusal: %v", err)
				}
				continue
			}
			if got.IsCA || now.Before(got.NotBefore) || now.After(got.NotAfter) {
				t.Fatalf("accepted %q: CA %v, valid %s to %s", got.Subject, got.IsCA, got.NotBefore, got.NotAfter)
			}
		}
	})
}
