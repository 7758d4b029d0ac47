package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/pemcert"
)

// TestRefresh serves Google's real intermediates over HTTP (as their AIA
// URLs do) and refreshes a certs directory from sources.txt: each is
// written as PEM; a certificate that leads to no pinned root (a root
// served as an intermediate's URL, here the other hierarchy's) is refused
// and nothing is written.
func TestRefresh(t *testing.T) {
	now := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	shipped := "../../identity/gcevtpm/certs"
	der := func(rel string) []byte {
		b, err := os.ReadFile(filepath.Join(shipped, rel))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		return blk.Bytes
	}
	mux := http.NewServeMux()
	for _, n := range []string{"tpm_ek_intermediate_3", "gcp_ek_ak_ca_intermediate_v3"} {
		body := der("intermediates/" + n + ".pem")
		mux.HandleFunc("/"+n+".crt", func(w http.ResponseWriter, _ *http.Request) { w.Write(body) })
	}
	self := selfSigned(t)
	mux.HandleFunc("/rogue.crt", func(w http.ResponseWriter, _ *http.Request) { w.Write(self) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	a := &gcevtpm.AIA{AllowedHosts: []string{"127.0.0.1"}}

	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "intermediates"), 0o755)
	sources := "# test\ntpm_ek_intermediate_3.pem " + srv.URL + "/tpm_ek_intermediate_3.crt\ngcp_ek_ak_ca_intermediate_v3.pem " + srv.URL + "/gcp_ek_ak_ca_intermediate_v3.crt\n"
	os.WriteFile(filepath.Join(dir, "sources.txt"), []byte(sources), 0o644)
	if err := refresh(context.Background(), a, dir, now); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"tpm_ek_intermediate_3", "gcp_ek_ak_ca_intermediate_v3"} {
		b, err := os.ReadFile(filepath.Join(dir, "intermediates", n+".pem"))
		if err != nil {
			t.Fatal(err)
		}
		certs, err := pemcert.Parse(b)
		if err != nil || len(certs) != 1 || string(certs[0].Raw) != string(der("intermediates/"+n+".pem")) {
			t.Errorf("%s: %v", n, err)
		}
	}

	bad := t.TempDir()
	os.MkdirAll(filepath.Join(bad, "intermediates"), 0o755)
	os.WriteFile(filepath.Join(bad, "sources.txt"), []byte("rogue.pem "+srv.URL+"/rogue.crt\n"), 0o644)
	if err := refresh(context.Background(), a, bad, now); err == nil {
		t.Error("a certificate of no pinned root was written")
	}
	if entries, _ := os.ReadDir(filepath.Join(bad, "intermediates")); len(entries) != 0 {
		t.Errorf("%d files written", len(entries))
	}
	// A host not allowed is never fetched.
	os.WriteFile(filepath.Join(bad, "sources.txt"), []byte("x.pem https://example.com/x.crt\n"), 0o644)
	if err := refresh(context.Background(), a, bad, now); err == nil {
		t.Error("a host not allowed was fetched")
	}
}

func selfSigned(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "EK/AK CA Intermediate"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(1, 0, 0), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
	if err != nil {
		t.Fatal(err)
	}
	return der
}
