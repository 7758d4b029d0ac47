package aws_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
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

	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
)

// TestDefaultRegionCerts: the shipped certificates load, are RSA-2048
// self-signed AWS certificates valid now, and cover the main Regions.
func TestDefaultRegionCerts(t *testing.T) {
	rc, err := aws.DefaultRegionCerts()
	if err != nil {
		t.Fatal(err)
	}
	regions := rc.Regions()
	if len(regions) < 30 {
		t.Fatalf("%d regions shipped: %v", len(regions), regions)
	}
	for _, want := range []string{"us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-southeast-2", "ap-northeast-1", "ca-central-1", "sa-east-1", "us-gov-west-1", "cn-north-1"} {
		if len(rc.Certificates(want)) == 0 {
			t.Errorf("no certificate for %s", want)
		}
	}
	for _, r := range regions {
		for _, c := range rc.Certificates(r) {
			pub, ok := c.PublicKey.(*rsa.PublicKey)
			if !ok || pub.N.BitLen() != 2048 {
				t.Errorf("%s: key %T is not RSA-2048", r, c.PublicKey)
			}
			if c.Subject.String() != "O=Amazon Web Services LLC,L=Seattle,ST=Washington State,C=US" {
				t.Errorf("%s: subject %s", r, c.Subject)
			}
			if err := c.CheckSignature(c.SignatureAlgorithm, c.RawTBSCertificate, c.Signature); err != nil {
				t.Errorf("%s: not self-signed: %v", r, err)
			}
			if time.Now().After(c.NotAfter) {
				t.Errorf("%s: expired %s", r, c.NotAfter)
			}
		}
	}
	if _, err := aws.NewVerifier(aws.Options{Certs: rc, Clock: time.Now}); err != nil {
		t.Fatalf("NewVerifier with the shipped certificates: %v", err)
	}
}

// TestLoadRegionCerts: a directory of <region>.pem files loads; what would
// be a misconfiguration is refused.
func TestLoadRegionCerts(t *testing.T) {
	f := newFixture(t)
	write := func(dir, name string, certs ...[]byte) {
		t.Helper()
		var b []byte
		for _, c := range certs {
			b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c})...)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	write(dir, "us-east-1.pem", f.useast1.Cert.Raw, f.attacker.Cert.Raw) // two: a rotation
	write(dir, "eu-west-1.pem", f.euwest1.Cert.Raw)
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("ignored"), 0o644); err != nil {
		t.Fatal(err)
	}
	rc, err := aws.LoadRegionCerts(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.Regions(); len(got) != 2 || got[0] != "eu-west-1" || got[1] != "us-east-1" {
		t.Fatalf("regions %v", got)
	}
	if n := len(rc.Certificates("us-east-1")); n != 2 {
		t.Fatalf("us-east-1 has %d certificates", n)
	}
	// Both certificates of a rotation verify documents.
	v, err := aws.NewVerifier(aws.Options{Certs: rc, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		name string
		ev   *aws.Evidence
	}{{"current", f.evidence(f.useast1, doc(), awstest.SignOptions{})}, {"next", f.evidence(f.attacker, doc(), awstest.SignOptions{})}} {
		if _, err := v.Verify(ctx, f.session(v), r.ev); err != nil {
			t.Errorf("%s certificate: %v", r.name, err)
		}
	}

	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ec"}, NotBefore: now, NotAfter: now.Add(time.Hour)}
	ecDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ecKey.PublicKey, ecKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, setup := range map[string]func(dir string){
		"empty directory": func(string) {},
		"not PEM":         func(d string) { os.WriteFile(filepath.Join(d, "us-east-1.pem"), []byte("hello"), 0o644) },
		"bad file name":   func(d string) { write(d, "US East.pem", f.useast1.Cert.Raw) },
		"ECDSA key":       func(d string) { write(d, "us-east-1.pem", ecDER) },
		"private key block": func(d string) {
			os.WriteFile(filepath.Join(d, "us-east-1.pem"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: []byte{1}}), 0o644)
		},
	} {
		d := t.TempDir()
		setup(d)
		if _, err := aws.LoadRegionCerts(d); err == nil {
			t.Errorf("%s: LoadRegionCerts succeeded", name)
		}
	}
	if _, err := aws.LoadRegionCerts(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing directory: LoadRegionCerts succeeded")
	}
}
