package azuretpm

import (
	"crypto/x509"
	"embed"
	"time"

	"github.com/nodeproof/nodeproof/identity/pinned"
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
	ak, doc *pinned.Set
}

// pkg begins the trust's errors.
const pkg = "azuretpm"

// TrustSet is what NewTrust is made of.
type TrustSet struct {
	// AKRoots and AKIntermediates: what an AK certificate chains to.
	AKRoots, AKIntermediates []*x509.Certificate
	// DocumentRoots and DocumentIntermediates: what the attested
	// document's signer chains to.
	DocumentRoots, DocumentIntermediates []*x509.Certificate
}

// NewTrust returns a Trust of s, each set checked as pinned.New checks
// it. Each root must be a self-signed CA certificate; each intermediate a
// CA certificate that chains to one of its set's roots (through the
// others) at now: an intermediate that leads nowhere is a mistake better
// reported at start than met as a refusal. Neither set may be empty of
// roots.
func NewTrust(s TrustSet, now time.Time) (*Trust, error) {
	ak, err := pinned.New(pinned.Label{Pkg: pkg, Kind: "AK"}, s.AKRoots, s.AKIntermediates, now)
	if err != nil {
		return nil, err
	}
	doc, err := pinned.New(pinned.Label{Pkg: pkg, Kind: "document"}, s.DocumentRoots, s.DocumentIntermediates, now)
	if err != nil {
		return nil, err
	}
	return &Trust{ak: ak, doc: doc}, nil
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
		certs, err := pinned.ReadDir(pkg, shipped, d.dir)
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
	var more [2][]*x509.Certificate
	for i, dir := range []string{akDir, documentDir} {
		if dir == "" {
			continue
		}
		certs, err := pinned.ReadOSDir(pkg, dir)
		if err != nil {
			return nil, err
		}
		more[i] = certs
	}
	ak, err := t.ak.With(more[0], now)
	if err != nil {
		return nil, err
	}
	doc, err := t.doc.With(more[1], now)
	if err != nil {
		return nil, err
	}
	return &Trust{ak: ak, doc: doc}, nil
}

// ReadIntermediates parses every .pem file in dir, in name order, as
// --azure-vtpm-intermediates-dir and --azure-imds-intermediates-dir hold
// them, without checking them against a time (WithIntermediates does):
// what an expiry metric reads, so an expired certificate is still
// reported.
func ReadIntermediates(dir string) ([]*x509.Certificate, error) {
	return pinned.ReadOSDir(pkg, dir)
}

// AKRoots, AKIntermediates, DocumentRoots and DocumentIntermediates are
// the trust's certificates; the caller must not modify them. Their
// NotAfter dates are what an expiry metric reports.
func (t *Trust) AKRoots() []*x509.Certificate               { return t.ak.Roots() }
func (t *Trust) AKIntermediates() []*x509.Certificate       { return t.ak.Intermediates() }
func (t *Trust) DocumentRoots() []*x509.Certificate         { return t.doc.Roots() }
func (t *Trust) DocumentIntermediates() []*x509.Certificate { return t.doc.Intermediates() }
