package pinned_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/nodeproof/nodeproof/identity/pinned"
)

var testNow = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

type node struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// issue makes a certificate named cn, a CA when ca, valid a year around
// testNow, signed by parent (self-signed when nil).
func issue(t *testing.T, cn string, ca bool, parent *node) *node {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: testNow.AddDate(0, -6, 0), NotAfter: testNow.AddDate(0, 6, 0),
		IsCA: ca, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if ca {
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &node{cert: cert, key: key}
}

func certs(n ...*node) []*x509.Certificate {
	out := make([]*x509.Certificate, len(n))
	for i, c := range n {
		out[i] = c.cert
	}
	return out
}

func pemOf(n ...*node) []byte {
	var b []byte
	for _, c := range n {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw})...)
	}
	return b
}

// TestNew: what New accepts and refuses, each refusal's message beginning
// with the label (as gcevtpm's and azuretpm's errors always have).
func TestNew(t *testing.T) {
	root := issue(t, "root", true, nil)
	inter := issue(t, "intermediate", true, root)
	under := issue(t, "under the intermediate", true, inter)
	leaf := issue(t, "leaf", false, inter)
	other := issue(t, "other root", true, nil)
	stray := issue(t, "intermediate of the other root", true, other)
	for _, c := range []struct {
		name          string
		label         pinned.Label
		roots, inters []*x509.Certificate
		now           time.Time
		err           string // "" when accepted
	}{
		{"a root and intermediates", pinned.Label{Pkg: "p"}, certs(root), certs(under, inter), testNow, ""},
		{"a root alone", pinned.Label{Pkg: "p"}, certs(root), nil, testNow, ""},
		{"no roots", pinned.Label{Pkg: "gcevtpm"}, nil, nil, testNow, "gcevtpm: no roots: an empty root set would trust nothing"},
		{"no roots of a named set", pinned.Label{Pkg: "azuretpm", Kind: "AK"}, nil, nil, testNow, "azuretpm: no AK roots: an empty root set would trust nothing"},
		{"an intermediate as a root", pinned.Label{Pkg: "p", Kind: "document"}, certs(inter), nil, testNow, `p: document root "CN=intermediate" is not a self-signed CA certificate`},
		{"a leaf as an intermediate", pinned.Label{Pkg: "p"}, certs(root), certs(leaf), testNow, `p: intermediate "CN=leaf" is not a CA certificate`},
		{"an intermediate of another root", pinned.Label{Pkg: "p"}, certs(root), certs(stray), testNow, `p: intermediate "CN=intermediate of the other root" does not chain to a pinned root`},
		{"an intermediate past its validity", pinned.Label{Pkg: "p"}, certs(root), certs(inter), testNow.AddDate(1, 0, 0), `p: intermediate "CN=intermediate" does not chain to a pinned root`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := pinned.New(c.label, c.roots, c.inters, c.now)
			if c.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				if len(s.Roots()) != len(c.roots) || len(s.Intermediates()) != len(c.inters) {
					t.Errorf("%d roots and %d intermediates", len(s.Roots()), len(s.Intermediates()))
				}
				if _, err := leaf.cert.Verify(x509.VerifyOptions{Roots: s.RootPool(), Intermediates: pool(s.Intermediates()), CurrentTime: testNow}); c.inters != nil && err != nil {
					t.Errorf("the leaf does not chain through the set: %v", err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), c.err) {
				t.Errorf("error %v, want %q", err, c.err)
			}
		})
	}
}

func pool(cs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range cs {
		p.AddCert(c)
	}
	return p
}

// TestWith: an operator's intermediate extends the set, checked as New
// checks, and never the roots; the set it came from is unchanged.
func TestWith(t *testing.T) {
	root := issue(t, "root", true, nil)
	inter := issue(t, "intermediate", true, root)
	stray := issue(t, "stray", true, issue(t, "other root", true, nil))
	s, err := pinned.New(pinned.Label{Pkg: "p"}, certs(root), nil, testNow)
	if err != nil {
		t.Fatal(err)
	}
	more, err := s.With(certs(inter), testNow)
	if err != nil {
		t.Fatal(err)
	}
	if len(more.Roots()) != 1 || len(more.Intermediates()) != 1 || len(s.Intermediates()) != 0 {
		t.Errorf("with: %d roots, %d intermediates; before: %d intermediates", len(more.Roots()), len(more.Intermediates()), len(s.Intermediates()))
	}
	if _, err := more.With(certs(stray), testNow); err == nil {
		t.Error("an intermediate of another root was added")
	}
	if _, err := s.With(certs(issue(t, "a root of its own", true, nil)), testNow); err == nil {
		t.Error("a self-signed certificate was taken as an intermediate: the roots were extended")
	}
}

// TestReadDir: .pem files in name order, other files and directories
// skipped, bundles of several certificates, and refusals that name the
// package and the file.
func TestReadDir(t *testing.T) {
	root := issue(t, "root", true, nil)
	a := issue(t, "a", true, root)
	b := issue(t, "b", true, root)
	for _, c := range []struct {
		name  string
		files fstest.MapFS
		want  []string // common names, in order
		err   string
	}{
		{"name order, a bundle, others skipped", fstest.MapFS{
			"d/2.pem":       {Data: pemOf(a, b)},
			"d/1.pem":       {Data: pemOf(root)},
			"d/README.md":   {Data: []byte("not a certificate")},
			"d/sub/3.pem":   {Data: pemOf(a)},
			"d/4.pem.bak":   {Data: []byte("junk")},
			"elsewhere.pem": {Data: pemOf(b)},
		}, []string{"root", "a", "b"}, ""},
		{"an empty directory", fstest.MapFS{"d/x.txt": {}}, nil, ""},
		{"no such directory", fstest.MapFS{}, nil, "p: "},
		{"a .pem that is not PEM", fstest.MapFS{"d/bad.pem": {Data: []byte("garbage")}}, nil, "p: bad.pem: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := pinned.ReadDir("p", c.files, "d")
			if c.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), c.err) {
					t.Errorf("error %v, want one beginning %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, g := range got {
				names = append(names, g.Subject.CommonName)
			}
			if strings.Join(names, ",") != strings.Join(c.want, ",") {
				t.Errorf("read %q, want %q", names, c.want)
			}
		})
	}
	t.Run("an operator's directory on disk", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "ca.pem"), pemOf(a), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := pinned.ReadOSDir("p", dir)
		if err != nil || len(got) != 1 || got[0].Subject.CommonName != "a" {
			t.Errorf("ReadOSDir: %d certificates, %v", len(got), err)
		}
		if _, err := pinned.ReadOSDir("p", filepath.Join(dir, "absent")); err == nil {
			t.Error("an absent directory was read")
		}
	})
}
