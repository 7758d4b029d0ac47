package gcevtpm_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/identity/gcevtpm/gcevtpmtest"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// FuzzParseInstanceInfo: the instance extension parser never panics,
// refuses with GCEInstanceInfoMalformed only, and what it accepts has
// GCE's shapes and survives a round trip through Google's layout. Seeds:
// the extensions of Google's real AK certificates and a test one.
func FuzzParseInstanceInfo(f *testing.F) {
	for _, file := range []string{"pca_tpm_rsa_sign_cert.pem", "uca_tpm_ecc_sign_cert.pem"} {
		cert := tpmtest.ReadCert(f, filepath.Join("testdata", file))
		for _, e := range cert.Extensions {
			if e.Id.Equal(gcevtpm.OIDInstanceInfo) {
				f.Add(e.Value)
			}
		}
	}
	seed, err := gcevtpmtest.MarshalInstanceInfo(gcevtpmtest.Instance("node-1"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := gcevtpm.ParseInstanceInfo(b)
		if err != nil {
			if r, _ := attest.ReasonOf(err); r != attest.ReasonInstanceInfoMalformed {
				t.Fatalf("refused with %v", err)
			}
			return
		}
		if info.ProjectNumber == 0 || info.InstanceID == 0 || info.Zone == "" || info.InstanceName == "" || info.ProjectID == "" {
			t.Fatalf("accepted an empty field: %+v", info)
		}
		again, err := gcevtpmtest.MarshalInstanceInfo(*info)
		if err != nil {
			t.Fatal(err)
		}
		back, err := gcevtpm.ParseInstanceInfo(again)
		if err != nil || *back != *info {
			t.Fatalf("round trip: %+v, %v; want %+v", back, err, info)
		}
	})
}

// FuzzCertificate: any bytes as an AK certificate (and as an intermediate
// beside it) are refused with a typed reason or accepted only when they
// chain to the pinned roots: never a panic, never an untyped error.
func FuzzCertificate(f *testing.F) {
	for _, file := range []string{"pca_tpm_rsa_sign_cert.pem", "uca_tpm_ecc_sign_cert.pem", "pca_tpm_rsa_enc_cert.pem"} {
		f.Add(tpmtest.ReadCert(f, filepath.Join("testdata", file)).Raw, []byte(nil))
	}
	tr, err := gcevtpm.DefaultTrust(testNow)
	if err != nil {
		f.Fatal(err)
	}
	v, err := gcevtpm.NewVerifier(gcevtpm.Options{Trust: tr, Clock: func() time.Time { return testNow }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, cert, inter []byte) {
		var inters [][]byte
		if inter != nil {
			inters = [][]byte{inter}
		}
		_, info, err := v.Certificate(context.Background(), cert, inters)
		if err != nil {
			if _, ok := attest.ReasonOf(err); !ok {
				t.Fatalf("untyped refusal: %v", err)
			}
			return
		}
		if !info.IsProduction {
			t.Fatal("accepted a non-production instance")
		}
	})
}
