package gcevtpm_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// testNow is a time within every shipped and real certificate's validity.
var testNow = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

// TestShippedRoots reads the two pinned roots and the shipped
// intermediates as data and checks each against what Google publishes:
// subject, validity, SHA-256 fingerprint (openssl x509 -fingerprint
// -sha256 of go-tpm-tools v0.4.10's server/ca-certs), a self-signed CA for
// a root, and that every intermediate chains to a root.
func TestShippedRoots(t *testing.T) {
	for _, c := range []struct {
		file, cn, fingerprint string
		notBefore, notAfter   string
		root                  bool
	}{
		{"roots/tpm_ek_root_1.pem", "tpm_ek_v1_cloud_host_root-signer-0-2018-04-06T10:58:26-07:00 K:1, 1:Pw003HsFYO4:0:18",
			"9bd5285f8fb18502a7947e621ffd470266f49fcd3b73e19a190f690ad32a7caf", "2018-04-06T17:58:26Z", "2118-04-06T18:58:26Z", true},
		{"roots/gcp_ek_ak_ca_root.pem", "EK/AK CA Root",
			"59475959 4b9b6152 4f6c8ef6 68f7177f 7b9066bc 0674f2f4 9fe9e052 be78beb2", "2022-07-08T00:40:34Z", "2122-07-08T05:57:23Z", true},
		{"intermediates/tpm_ek_intermediate_2.pem", "tpm_ek_v1_cloud_host-signer-0-2020-10-22T14:02:08-07:00 K:1, 2:HBNpA3TPAbM:0:18",
			"5d8dbcf8c8053dd8ffad711b6219355032b7122c34cac0f90ccb49def69ec504", "2020-10-22T21:02:08Z", "2120-10-22T21:02:08Z", false},
		{"intermediates/tpm_ek_intermediate_3.pem", "tpm_ek_v1_cloud_host-signer-0-2021-10-12T04:22:11-07:00 K:1, 3:nbvaGZFLcuc:0:18",
			"7132b6ea71101f6c51bb58f98c3798c19b65be510eca0344318900510b593178", "2021-10-12T11:22:11Z", "2121-10-12T11:22:11Z", false},
		{"intermediates/gcp_ek_ak_ca_intermediate_v3.pem", "EK/AK CA Intermediate",
			"c84de8116dfaf5a908f21e810487791f5437e206d00ad8025050cca6bd2ff627", "2022-08-23T22:26:29Z", "2122-07-08T05:57:23Z", false},
	} {
		t.Run(c.file, func(t *testing.T) {
			cert := tpmtest.ReadCert(t, filepath.Join("certs", c.file))
			if cert.Subject.CommonName != c.cn || cert.Subject.Organization[0] != "Google LLC" {
				t.Errorf("subject %q", cert.Subject)
			}
			sum := sha256.Sum256(cert.Raw)
			want := ""
			for _, r := range c.fingerprint {
				if r != ' ' {
					want += string(r)
				}
			}
			if hex.EncodeToString(sum[:]) != want {
				t.Errorf("SHA-256 fingerprint %x, want %s", sum, want)
			}
			if got := cert.NotBefore.UTC().Format(time.RFC3339); got != c.notBefore {
				t.Errorf("notBefore %s, want %s", got, c.notBefore)
			}
			if got := cert.NotAfter.UTC().Format(time.RFC3339); got != c.notAfter {
				t.Errorf("notAfter %s, want %s", got, c.notAfter)
			}
			if !cert.IsCA {
				t.Error("not a CA certificate")
			}
			if c.root {
				if err := cert.CheckSignatureFrom(cert); err != nil {
					t.Errorf("root is not self-signed: %v", err)
				}
			}
		})
	}
	tr, err := gcevtpm.DefaultTrust(testNow)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Roots()) != 2 || len(tr.Intermediates()) != 3 {
		t.Errorf("%d roots and %d intermediates shipped, want 2 and 3", len(tr.Roots()), len(tr.Intermediates()))
	}
}

// TestNewTrustRefuses: a root that is not self-signed, an intermediate
// that leads to no root, and an empty root set are refused when the trust
// is made, not met later as refusals.
func TestNewTrustRefuses(t *testing.T) {
	tr, err := gcevtpm.DefaultTrust(testNow)
	if err != nil {
		t.Fatal(err)
	}
	inter := tr.Intermediates()[0]
	for name, f := range map[string]func() error{
		"no roots":                    func() error { _, err := gcevtpm.NewTrust(nil, nil, testNow); return err },
		"an intermediate as a root":   func() error { _, err := gcevtpm.NewTrust([]*x509.Certificate{inter}, nil, testNow); return err },
		"an intermediate of no root":  func() error { _, err := gcevtpm.NewTrust(tr.Roots()[1:], tr.Intermediates()[:1], testNow); return err },
		"intermediates after expiry":  func() error { _, err := gcevtpm.DefaultTrust(testNow.AddDate(200, 0, 0)); return err },
		"a directory of non-PEM data": func() error { _, err := tr.WithIntermediates("testdata/../doc.go", testNow); return err },
	} {
		if f() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestGoogleAKCertificates verifies AK certificates Google issued to a
// real GCE VM (go-tpm-tools' internal/test/certificates, copied as data):
// one from each hierarchy, RSA and ECC, each chaining to a pinned root
// through a shipped intermediate, naming its instance; the VM's
// encryption-key certificate from the same CA is not an AK certificate;
// past their validity they are refused.
func TestGoogleAKCertificates(t *testing.T) {
	tr, err := gcevtpm.DefaultTrust(testNow)
	if err != nil {
		t.Fatal(err)
	}
	verifier := func(now time.Time) *gcevtpm.Verifier {
		v, err := gcevtpm.NewVerifier(gcevtpm.Options{Trust: tr, Clock: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		file, name, issuer string
		id                 uint64
	}{
		{"pca_tpm_rsa_sign_cert.pem", "cs-debug-pca", "EK/AK CA Intermediate", 218557372616137117},
		{"pca_tpm_ecc_sign_cert.pem", "cs-debug-pca", "EK/AK CA Intermediate", 218557372616137117},
		{"uca_tpm_rsa_sign_cert.pem", "cs-debug", "tpm_ek_v1_cloud_host-signer-0-2021-10-12T04:22:11-07:00 K:1, 3:nbvaGZFLcuc:0:18", 5780156274199835632},
		{"uca_tpm_ecc_sign_cert.pem", "cs-debug", "tpm_ek_v1_cloud_host-signer-0-2021-10-12T04:22:11-07:00 K:1, 3:nbvaGZFLcuc:0:18", 5780156274199835632},
	} {
		t.Run(c.file, func(t *testing.T) {
			cert := tpmtest.ReadCert(t, filepath.Join("testdata", c.file))
			got, info, err := verifier(testNow).Certificate(context.Background(), cert.Raw, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Issuer.CommonName != c.issuer {
				t.Errorf("issuer %q", got.Issuer.CommonName)
			}
			want := gcevtpm.InstanceInfo{Zone: "us-central1-a", ProjectNumber: 117478743145, ProjectID: "google.com:wuale-gcp-testing",
				InstanceID: c.id, InstanceName: c.name, IsProduction: true}
			if *info != want {
				t.Errorf("instance %+v, want %+v", *info, want)
			}
			if info.Identity() != "gcp:117478743145/us-central1-a/"+strconv.FormatUint(c.id, 10) {
				t.Errorf("identity %q", info.Identity())
			}
			_, _, err = verifier(cert.NotAfter.Add(time.Second)).Certificate(context.Background(), cert.Raw, nil)
			if r, _ := attest.ReasonOf(err); r != attest.ReasonAKCertExpired {
				t.Errorf("after its validity: %v, want %s", err, attest.ReasonAKCertExpired)
			}
		})
	}
	enc := tpmtest.ReadCert(t, "testdata/pca_tpm_rsa_enc_cert.pem")
	_, _, err = verifier(testNow).Certificate(context.Background(), enc.Raw, nil)
	if r, _ := attest.ReasonOf(err); r != attest.ReasonAKCertInvalid {
		t.Errorf("encryption-key certificate: %v, want %s", err, attest.ReasonAKCertInvalid)
	}
}
