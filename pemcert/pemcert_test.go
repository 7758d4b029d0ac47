package pemcert_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/pemcert"
)

func selfSigned(t *testing.T, cn string) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestParse(t *testing.T) {
	a, b := selfSigned(t, "a"), selfSigned(t, "b")
	key := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})
	bad := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}})
	tests := []struct {
		name    string
		in      []byte
		wantCNs []string
		wantErr string
	}{
		{name: "one", in: a, wantCNs: []string{"a"}},
		{name: "two in order, blank lines around", in: append(append([]byte("\n\n"), a...), append(b, "\n\n"...)...), wantCNs: []string{"a", "b"}},
		{name: "empty", in: nil, wantErr: "no PEM certificate"},
		{name: "not PEM", in: []byte("hello"), wantErr: "not a PEM certificate"},
		{name: "truncated after a certificate", in: append(append([]byte{}, a...), b[:len(b)/2]...), wantErr: "not a PEM certificate"},
		{name: "an indented certificate is refused, not skipped", in: append(append([]byte("\n "), a...), b...), wantErr: "indented"},
		{name: "text before a certificate", in: append([]byte("issuer: x\n"), a...), wantErr: "not a PEM certificate"},
		{name: "a key among certificates", in: append(append([]byte{}, a...), key...), wantErr: `"PRIVATE KEY"`},
		{name: "a block that is not a certificate", in: append(append([]byte{}, a...), bad...), wantErr: "certificate 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pemcert.Parse(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.wantCNs) {
				t.Fatalf("%d certificates, want %d", len(got), len(tc.wantCNs))
			}
			for i, c := range got {
				if c.Subject.CommonName != tc.wantCNs[i] {
					t.Errorf("certificate %d is %q, want %q", i, c.Subject.CommonName, tc.wantCNs[i])
				}
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		certs, err := pemcert.Parse(b)
		if err == nil && len(certs) == 0 {
			t.Fatal("no error and no certificate")
		}
	})
}
