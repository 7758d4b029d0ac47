package tpmtest_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// TestLabCA: the lab hierarchy chains (root self-signed, intermediate by
// the root, a leaf by the intermediate), VerifyRSASignatures tells a
// signature by the issuer from one by anyone else, and ReadCert reads one
// back from PEM.
func TestLabCA(t *testing.T) {
	now := time.Now()
	ca, err := tpmtest.NewLabCA(&x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "lab root"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "lab intermediate"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.Issue(&x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "leaf"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}, key.Public())
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots, inters := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(ca.Root)
	inters.AddCert(ca.Intermediate)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, CurrentTime: now}); err != nil {
		t.Errorf("the leaf does not chain: %v", err)
	}
	for _, c := range []struct {
		name  string
		pairs [][2]*x509.Certificate
		ok    bool
	}{
		{"the chain", [][2]*x509.Certificate{{leaf, ca.Intermediate}, {ca.Intermediate, ca.Root}, {ca.Root, ca.Root}}, true},
		{"the leaf by the root", [][2]*x509.Certificate{{leaf, ca.Root}}, false},
		{"the root by the intermediate", [][2]*x509.Certificate{{ca.Intermediate, ca.Root}, {ca.Root, ca.Intermediate}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := tpmtest.VerifyRSASignatures(c.pairs); (err == nil) != c.ok {
				t.Errorf("%v, want ok %v", err, c.ok)
			}
		})
	}
	path := filepath.Join(t.TempDir(), "leaf.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := tpmtest.ReadCert(t, path); !got.Equal(leaf) {
		t.Errorf("read %q", got.Subject)
	}
}
