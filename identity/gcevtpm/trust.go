package gcevtpm

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

// shipped are Google's vTPM certificate authorities: the two pinned roots
// and the intermediates known when this was built (certs/README.md names
// each one's source and how to refresh them).
//
//go:embed certs/roots/*.pem certs/intermediates/*.pem
var shipped embed.FS

// Trust is what an AK certificate may chain to: pinned roots and the
// intermediates known to lead to them. It is immutable once made and safe
// for concurrent use.
type Trust struct {
	roots         []*x509.Certificate
	intermediates []*x509.Certificate
}

// NewTrust returns a Trust of roots and intermediates. Each root must be a
// self-signed CA certificate; each intermediate a CA certificate that
// chains to one of the roots (through the others) at now: an intermediate
// that leads nowhere is a mistake better reported at start than met as a
// refusal.
func NewTrust(roots, intermediates []*x509.Certificate, now time.Time) (*Trust, error) {
	if len(roots) == 0 {
		return nil, fmt.Errorf("gcevtpm: no roots: an empty root set would trust nothing")
	}
	rp, ip := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		if !r.IsCA || !bytes.Equal(r.RawSubject, r.RawIssuer) || r.CheckSignatureFrom(r) != nil {
			return nil, fmt.Errorf("gcevtpm: root %q is not a self-signed CA certificate", r.Subject)
		}
		rp.AddCert(r)
	}
	for _, c := range intermediates {
		ip.AddCert(c)
	}
	for _, c := range intermediates {
		if !c.IsCA {
			return nil, fmt.Errorf("gcevtpm: intermediate %q is not a CA certificate", c.Subject)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: rp, Intermediates: ip, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return nil, fmt.Errorf("gcevtpm: intermediate %q does not chain to a pinned root: %w", c.Subject, err)
		}
	}
	return &Trust{roots: append([]*x509.Certificate(nil), roots...), intermediates: append([]*x509.Certificate(nil), intermediates...)}, nil
}

// DefaultTrust returns the shipped trust: Google's two vTPM roots,
// "tpm_ek_v1_cloud_host_root" (2018-2118) and the Certificate Authority
// Service "EK/AK CA Root" (2022-2122), pinned both, and the shipped
// intermediates, checked at now. Each call parses them afresh; there is no
// package state.
func DefaultTrust(now time.Time) (*Trust, error) {
	roots, inter, err := Shipped()
	if err != nil {
		return nil, err
	}
	return NewTrust(roots, inter, now)
}

// Shipped returns the shipped roots and intermediates as they are, parsed
// but not checked against each other or a time: what the expiry metric
// reports, which must still report an intermediate that has expired
// (DefaultTrust refuses it).
func Shipped() (roots, intermediates []*x509.Certificate, err error) {
	if roots, err = readDir(shipped, "certs/roots"); err != nil {
		return nil, nil, err
	}
	if intermediates, err = readDir(shipped, "certs/intermediates"); err != nil {
		return nil, nil, err
	}
	return roots, intermediates, nil
}

// WithIntermediates returns a Trust with the shipped roots and both t's
// intermediates and those of every .pem file in dir (each a strict PEM
// bundle): how an operator adds an intermediate Google started using
// before a release ships it (docs/cloud-tpm.md).
func (t *Trust) WithIntermediates(dir string, now time.Time) (*Trust, error) {
	more, err := readDir(os.DirFS(dir), ".")
	if err != nil {
		return nil, err
	}
	return NewTrust(t.roots, append(append([]*x509.Certificate(nil), t.intermediates...), more...), now)
}

// ReadIntermediates parses every .pem file in dir, in name order, as
// --gce-vtpm-intermediates-dir holds them, without checking them against a
// time (WithIntermediates does): what an expiry metric reads, so an expired
// certificate is still reported.
func ReadIntermediates(dir string) ([]*x509.Certificate, error) {
	return readDir(os.DirFS(dir), ".")
}

// Roots are the pinned roots; Intermediates the known intermediates. The
// caller must not modify them. Their NotAfter dates are what an expiry
// metric reports.
func (t *Trust) Roots() []*x509.Certificate         { return t.roots }
func (t *Trust) Intermediates() []*x509.Certificate { return t.intermediates }

// readDir parses every .pem file in dir of fsys, in name order.
func readDir(fsys fs.FS, dir string) ([]*x509.Certificate, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("gcevtpm: %w", err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	var out []*x509.Certificate
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".pem") {
			continue
		}
		b, err := fs.ReadFile(fsys, filepath.ToSlash(filepath.Join(dir, e.Name())))
		if err != nil {
			return nil, fmt.Errorf("gcevtpm: %w", err)
		}
		certs, err := pemcert.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("gcevtpm: %s: %w", e.Name(), err)
		}
		out = append(out, certs...)
	}
	return out, nil
}
