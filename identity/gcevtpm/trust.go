package gcevtpm

import (
	"crypto/x509"
	"embed"
	"time"

	"github.com/nodeproof/nodeproof/identity/pinned"
)

// shipped are Google's vTPM certificate authorities: the two pinned roots
// and the intermediates known when this was built (certs/README.md names
// each one's source and how to refresh them).
//
//go:embed certs/roots/*.pem certs/intermediates/*.pem
var shipped embed.FS

// Trust is what an AK certificate may chain to: pinned roots and the
// intermediates known to lead to them (a pinned.Set). It is immutable once
// made and safe for concurrent use.
type Trust struct {
	set *pinned.Set
}

// pkg begins the trust's errors.
const pkg = "gcevtpm"

// NewTrust returns a Trust of roots and intermediates, checked as
// pinned.New checks them: each root must be a self-signed CA certificate;
// each intermediate a CA certificate that chains to one of the roots
// (through the others) at now: an intermediate that leads nowhere is a
// mistake better reported at start than met as a refusal.
func NewTrust(roots, intermediates []*x509.Certificate, now time.Time) (*Trust, error) {
	set, err := pinned.New(pinned.Label{Pkg: pkg}, roots, intermediates, now)
	if err != nil {
		return nil, err
	}
	return &Trust{set: set}, nil
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
	if roots, err = pinned.ReadDir(pkg, shipped, "certs/roots"); err != nil {
		return nil, nil, err
	}
	if intermediates, err = pinned.ReadDir(pkg, shipped, "certs/intermediates"); err != nil {
		return nil, nil, err
	}
	return roots, intermediates, nil
}

// WithIntermediates returns a Trust with the shipped roots and both t's
// intermediates and those of every .pem file in dir (each a strict PEM
// bundle): how an operator adds an intermediate Google started using
// before a release ships it (docs/cloud-tpm.md).
func (t *Trust) WithIntermediates(dir string, now time.Time) (*Trust, error) {
	more, err := pinned.ReadOSDir(pkg, dir)
	if err != nil {
		return nil, err
	}
	set, err := t.set.With(more, now)
	if err != nil {
		return nil, err
	}
	return &Trust{set: set}, nil
}

// ReadIntermediates parses every .pem file in dir, in name order, as
// --gce-vtpm-intermediates-dir holds them, without checking them against a
// time (WithIntermediates does): what an expiry metric reads, so an expired
// certificate is still reported.
func ReadIntermediates(dir string) ([]*x509.Certificate, error) {
	return pinned.ReadOSDir(pkg, dir)
}

// Roots are the pinned roots; Intermediates the known intermediates. The
// caller must not modify them. Their NotAfter dates are what an expiry
// metric reports.
func (t *Trust) Roots() []*x509.Certificate         { return t.set.Roots() }
func (t *Trust) Intermediates() []*x509.Certificate { return t.set.Intermediates() }
