package azuretpm

import (
	"bytes"
	"crypto/x509"
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/pemcert"
)

// shipped are the certificate authorities this build knows
// (certs/README.md names each one's source): Azure's vTPM root, pinned,
// and its intermediates known at build time; the roots the IMDS signer
// chains to, pinned, and the intermediates between.
//
//go:embed certs/roots/*.pem certs/intermediates/*.pem certs/imds-roots/*.pem certs/imds-intermediates/*.pem
var shipped embed.FS

// Trust is what the two signatures may chain to: the AK certificate to
// Azure's vTPM roots, the attested document's signer to the IMDS roots,
// each through intermediates known to lead there. It is immutable once
// made and safe for concurrent use.
type Trust struct {
	ak, doc pki
}

// pki is one set of pinned roots and the intermediates under them.
type pki struct {
	roots, intermediates []*x509.Certificate
}

// TrustSet is what NewTrust is made of.
type TrustSet struct {
	// AKRoots and AKIntermediates: what an AK certificate chains to.
	AKRoots, AKIntermediates []*x509.Certificate
	// DocumentRoots and DocumentIntermediates: what the attested
	// document's signer chains to.
	DocumentRoots, DocumentIntermediates []*x509.Certificate
}

// NewTrust returns a Trust of s. Each root must be a self-signed CA
// certificate; each intermediate a CA certificate that chains to one of its
// set's roots (through the others) at now: an intermediate that leads
// nowhere is a mistake better reported at start than met as a refusal.
// Neither set may be empty of roots.
func NewTrust(s TrustSet, now time.Time) (*Trust, error) {
	ak, err := newPKI("AK", s.AKRoots, s.AKIntermediates, now)
	if err != nil {
		return nil, err
	}
	doc, err := newPKI("document", s.DocumentRoots, s.DocumentIntermediates, now)
	if err != nil {
		return nil, err
	}
	return &Trust{ak: ak, doc: doc}, nil
}

func newPKI(what string, roots, intermediates []*x509.Certificate, now time.Time) (pki, error) {
	if len(roots) == 0 {
		return pki{}, fmt.Errorf("azuretpm: no %s roots: an empty root set would trust nothing", what)
	}
	rp, ip := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		if !r.IsCA || !bytes.Equal(r.RawSubject, r.RawIssuer) || r.CheckSignatureFrom(r) != nil {
			return pki{}, fmt.Errorf("azuretpm: %s root %q is not a self-signed CA certificate", what, r.Subject)
		}
		rp.AddCert(r)
	}
	for _, c := range intermediates {
		ip.AddCert(c)
	}
	for _, c := range intermediates {
		if !c.IsCA {
			return pki{}, fmt.Errorf("azuretpm: %s intermediate %q is not a CA certificate", what, c.Subject)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: rp, Intermediates: ip, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return pki{}, fmt.Errorf("azuretpm: %s intermediate %q does not chain to a pinned root: %w", what, c.Subject, err)
		}
	}
	return pki{roots: append([]*x509.Certificate(nil), roots...), intermediates: append([]*x509.Certificate(nil), intermediates...)}, nil
}

// DefaultTrust returns the shipped trust, checked at now: "Azure Virtual
// TPM Root Certificate Authority 2023" pinned for AK certificates, with
// the shipped vTPM intermediates; DigiCert Global Root G2, Microsoft RSA
// Root Certificate Authority 2017 and Microsoft TLS RSA Root G2 pinned for
// the document's signer, with the shipped Azure TLS issuing CAs. Each call
// parses them afresh; there is no package state.
func DefaultTrust(now time.Time) (*Trust, error) {
	s, err := Shipped()
	if err != nil {
		return nil, err
	}
	return NewTrust(s, now)
}

// Shipped returns the shipped certificates as they are, parsed but not
// checked against each other or a time: what an expiry metric reports.
func Shipped() (TrustSet, error) {
	var s TrustSet
	for _, d := range []struct {
		dir string
		out *[]*x509.Certificate
	}{
		{"certs/roots", &s.AKRoots}, {"certs/intermediates", &s.AKIntermediates},
		{"certs/imds-roots", &s.DocumentRoots}, {"certs/imds-intermediates", &s.DocumentIntermediates},
	} {
		certs, err := readDir(shipped, d.dir)
		if err != nil {
			return TrustSet{}, err
		}
		*d.out = certs
	}
	return s, nil
}

// WithIntermediates returns a Trust with t's roots and intermediates and,
// added to the AK intermediates, those of every .pem file in akDir, and to
// the document's, those of every .pem file in documentDir (either ""
// for none): how an operator adds an intermediate Azure started using
// ("Azure Cloud Virtual TPM CA - 11", a new TLS issuing CA) before a
// release ships it (docs/cloud-tpm.md). The roots are never extended.
func (t *Trust) WithIntermediates(akDir, documentDir string, now time.Time) (*Trust, error) {
	s := TrustSet{
		AKRoots: t.ak.roots, AKIntermediates: append([]*x509.Certificate(nil), t.ak.intermediates...),
		DocumentRoots: t.doc.roots, DocumentIntermediates: append([]*x509.Certificate(nil), t.doc.intermediates...),
	}
	for _, d := range []struct {
		dir string
		out *[]*x509.Certificate
	}{{akDir, &s.AKIntermediates}, {documentDir, &s.DocumentIntermediates}} {
		if d.dir == "" {
			continue
		}
		more, err := readDir(os.DirFS(d.dir), ".")
		if err != nil {
			return nil, err
		}
		*d.out = append(*d.out, more...)
	}
	return NewTrust(s, now)
}

// ReadIntermediates parses every .pem file in dir, in name order, as
// --azure-vtpm-intermediates-dir and --azure-imds-intermediates-dir hold
// them, without checking them against a time (WithIntermediates does):
// what an expiry metric reads, so an expired certificate is still
// reported.
func ReadIntermediates(dir string) ([]*x509.Certificate, error) {
	return readDir(os.DirFS(dir), ".")
}

// AKRoots, AKIntermediates, DocumentRoots and DocumentIntermediates are
// the trust's certificates; the caller must not modify them. Their
// NotAfter dates are what an expiry metric reports.
func (t *Trust) AKRoots() []*x509.Certificate               { return t.ak.roots }
func (t *Trust) AKIntermediates() []*x509.Certificate       { return t.ak.intermediates }
func (t *Trust) DocumentRoots() []*x509.Certificate         { return t.doc.roots }
func (t *Trust) DocumentIntermediates() []*x509.Certificate { return t.doc.intermediates }

// readDir parses every .pem file in dir of fsys, in name order.
func readDir(fsys fs.FS, dir string) ([]*x509.Certificate, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("azuretpm: %w", err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	var out []*x509.Certificate
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".pem") {
			continue
		}
		b, err := fs.ReadFile(fsys, filepath.ToSlash(filepath.Join(dir, e.Name())))
		if err != nil {
			return nil, fmt.Errorf("azuretpm: %w", err)
		}
		certs, err := pemcert.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("azuretpm: %s: %w", e.Name(), err)
		}
		out = append(out, certs...)
	}
	return out, nil
}
