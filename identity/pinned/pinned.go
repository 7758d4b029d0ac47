// Package pinned is a set of pinned root certificates and the intermediates
// known to lead to them, read from PEM files a release embeds and from an
// operator's directory: what a cloud kind's AK certificate (or signed
// document) may chain to (identity/gcevtpm, identity/azuretpm).
package pinned

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/pemcert"
)

// Label says how a Set's errors name it: Pkg begins them ("gcevtpm"),
// Kind names the set when a package has several ("AK", "document"; ""
// when it has one).
type Label struct {
	Pkg, Kind string
}

// kind is Kind followed by a space, or "".
func (l Label) kind() string {
	if l.Kind == "" {
		return ""
	}
	return l.Kind + " "
}

// Set is pinned roots and the intermediates known to lead to them. It is
// immutable once made and safe for concurrent use.
type Set struct {
	label                Label
	roots, intermediates []*x509.Certificate
}

// New returns a Set of roots and intermediates. Each root must be a
// self-signed CA certificate; each intermediate a CA certificate that
// chains to one of the roots (through the others) at now, for any extended
// key usage: an intermediate that leads nowhere is a mistake better
// reported at start than met as a refusal. There must be a root.
func New(l Label, roots, intermediates []*x509.Certificate, now time.Time) (*Set, error) {
	if len(roots) == 0 {
		return nil, fmt.Errorf("%s: no %sroots: an empty root set would trust nothing", l.Pkg, l.kind())
	}
	rp, ip := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		if !r.IsCA || !bytes.Equal(r.RawSubject, r.RawIssuer) || r.CheckSignatureFrom(r) != nil {
			return nil, fmt.Errorf("%s: %sroot %q is not a self-signed CA certificate", l.Pkg, l.kind(), r.Subject)
		}
		rp.AddCert(r)
	}
	for _, c := range intermediates {
		ip.AddCert(c)
	}
	for _, c := range intermediates {
		if !c.IsCA {
			return nil, fmt.Errorf("%s: %sintermediate %q is not a CA certificate", l.Pkg, l.kind(), c.Subject)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: rp, Intermediates: ip, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return nil, fmt.Errorf("%s: %sintermediate %q does not chain to a pinned root: %w", l.Pkg, l.kind(), c.Subject, err)
		}
	}
	return &Set{
		label:         l,
		roots:         append([]*x509.Certificate(nil), roots...),
		intermediates: append([]*x509.Certificate(nil), intermediates...),
	}, nil
}

// With returns a Set of s's roots and both s's intermediates and more,
// checked as New checks them at now. The roots are never extended.
func (s *Set) With(more []*x509.Certificate, now time.Time) (*Set, error) {
	return New(s.label, s.roots, append(append([]*x509.Certificate(nil), s.intermediates...), more...), now)
}

// Roots are the pinned roots; Intermediates the known intermediates. The
// caller must not modify them. Their NotAfter dates are what an expiry
// metric reports.
func (s *Set) Roots() []*x509.Certificate         { return s.roots }
func (s *Set) Intermediates() []*x509.Certificate { return s.intermediates }

// RootPool returns a new pool of the roots.
func (s *Set) RootPool() *x509.CertPool {
	p := x509.NewCertPool()
	for _, r := range s.roots {
		p.AddCert(r)
	}
	return p
}

// ReadDir parses every .pem file in dir of fsys (each a strict PEM bundle,
// pemcert.Parse), in name order, without checking them against each other
// or a time; errors begin with pkg. Other files and directories are
// skipped.
func ReadDir(pkg string, fsys fs.FS, dir string) ([]*x509.Certificate, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pkg, err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	var out []*x509.Certificate
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".pem") {
			continue
		}
		b, err := fs.ReadFile(fsys, filepath.ToSlash(filepath.Join(dir, e.Name())))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pkg, err)
		}
		certs, err := pemcert.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", pkg, e.Name(), err)
		}
		out = append(out, certs...)
	}
	return out, nil
}

// ReadOSDir is ReadDir of an operator's directory on disk, as an
// --…-intermediates-dir flag names it.
func ReadOSDir(pkg, dir string) ([]*x509.Certificate, error) {
	return ReadDir(pkg, os.DirFS(dir), ".")
}
