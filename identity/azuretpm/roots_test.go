package azuretpm_test

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/identity/azuretpm"
	"github.com/nodeproof/nodeproof/identity/azuretpm/azuretpmtest"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// testNow is a time within every shipped certificate's validity.
var testNow = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

// TestShippedCertificates reads every shipped certificate as data and
// checks it against certs/README.md: subject, validity, SHA-256
// fingerprint (openssl x509 -fingerprint -sha256), a self-signed CA for a
// root, and DefaultTrust chains every intermediate to a root of its set.
func TestShippedCertificates(t *testing.T) {
	for _, c := range []struct {
		file, cn, fingerprint string
		notBefore, notAfter   string
	}{
		{"roots/azure_virtual_tpm_root_2023.pem", "Azure Virtual TPM Root Certificate Authority 2023", "e6c596b17f8ffefba5c300f714cfb1260c6028704ecf7becc4ab5018efb00e95", "2023-06-01T18:08:53Z", "2048-06-01T18:15:41Z"},
		{"intermediates/global_virtual_tpm_ca_03.pem", "Global Virtual TPM CA - 03", "fd7c92dabce4dcec9feaa30f8b087ada0598413189182152b881f5564064a29c", "2025-04-24T18:01:17Z", "2027-04-24T18:01:17Z"},
		{"imds-roots/digicert_global_root_g2.pem", "DigiCert Global Root G2", "cb3ccbb76031e5e0138f8dd39a23f9de47ffc35e43c1144cea27d46a5ab1cb5f", "2013-08-01T12:00:00Z", "2038-01-15T12:00:00Z"},
		{"imds-roots/microsoft_rsa_root_certificate_authority_2017.pem", "Microsoft RSA Root Certificate Authority 2017", "c741f70f4b2a8d88bf2e71c14122ef53ef10eba0cfa5e64cfa20f418853073e0", "2019-12-18T22:51:22Z", "2042-07-18T23:00:23Z"},
		{"imds-roots/microsoft_tls_rsa_root_g2.pem", "Microsoft TLS RSA Root G2", "6a170583db584151e1c454eeca2a64cc5d8e484a5bd1156e720b4458654ee9e5", "2025-04-10T18:36:30Z", "2040-04-10T18:43:51Z"},
		{"imds-intermediates/microsoft_azure_rsa_tls_issuing_ca_03.pem", "Microsoft Azure RSA TLS Issuing CA 03", "3d3f4b440f933ffd269565eda9e20e8df863c9cbe3651d3b476c5b4f4af5ce28", "2023-05-25T23:49:25Z", "2028-05-25T23:49:25Z"},
		{"imds-intermediates/microsoft_azure_rsa_tls_issuing_ca_04.pem", "Microsoft Azure RSA TLS Issuing CA 04", "fd39ffc48f148354262162a2f55dd46dc2564cfc1499309ad53f09c10981dcca", "2023-05-25T23:49:33Z", "2028-05-25T23:49:33Z"},
		{"imds-intermediates/microsoft_azure_rsa_tls_issuing_ca_07.pem", "Microsoft Azure RSA TLS Issuing CA 07", "fbb7926a451badf516be518614a77e6e325e29819908796d807f59320f918ee2", "2023-05-25T23:49:30Z", "2028-05-25T23:49:30Z"},
		{"imds-intermediates/microsoft_azure_rsa_tls_issuing_ca_08.pem", "Microsoft Azure RSA TLS Issuing CA 08", "cfdd061fcd4cff3bb9e133264ca7fde45ca49b70cfaa977ae0dc422b4330a8c1", "2023-05-25T23:49:28Z", "2028-05-25T23:49:28Z"},
		{"imds-intermediates/microsoft_tls_g2_rsa_ca_ocsp_02.pem", "Microsoft TLS G2 RSA CA OCSP 02", "ea7a25255d111fc3ce4cb8fabe3adf9c27bbe6db203f955066bab4c5a71f3d08", "2025-08-01T20:03:00Z", "2029-06-03T20:03:00Z"},
		{"imds-intermediates/microsoft_tls_g2_rsa_ca_ocsp_04.pem", "Microsoft TLS G2 RSA CA OCSP 04", "ac8ea9f2874fd368a3e778b1a0b165ee898db9b9687c17edcdc76908ab58c82c", "2025-08-01T20:02:59Z", "2029-06-03T20:02:59Z"},
	} {
		t.Run(c.file, func(t *testing.T) {
			cert := tpmtest.ReadCert(t, filepath.Join("certs", c.file))
			if cert.Subject.CommonName != c.cn {
				t.Errorf("subject %q", cert.Subject)
			}
			if sum := sha256.Sum256(cert.Raw); hex.EncodeToString(sum[:]) != c.fingerprint {
				t.Errorf("SHA-256 %x", sum)
			}
			if got := cert.NotBefore.UTC().Format(time.RFC3339) + " " + cert.NotAfter.UTC().Format(time.RFC3339); got != c.notBefore+" "+c.notAfter {
				t.Errorf("validity %s", got)
			}
			root := filepath.Base(filepath.Dir(c.file)) == "roots" || filepath.Base(filepath.Dir(c.file)) == "imds-roots"
			if root && (!cert.IsCA || !bytes.Equal(cert.RawSubject, cert.RawIssuer) || cert.CheckSignatureFrom(cert) != nil) {
				t.Error("not a self-signed CA certificate")
			}
		})
	}
	tr, err := azuretpm.DefaultTrust(testNow)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.AKRoots()) != 1 || len(tr.AKIntermediates()) != 1 || len(tr.DocumentRoots()) != 3 || len(tr.DocumentIntermediates()) != 6 {
		t.Errorf("DefaultTrust: %d+%d AK, %d+%d document certificates", len(tr.AKRoots()), len(tr.AKIntermediates()), len(tr.DocumentRoots()), len(tr.DocumentIntermediates()))
	}
}

// TestTrust: what NewTrust and WithIntermediates refuse, and that an
// operator's intermediate extends the chains without touching the roots.
func TestTrust(t *testing.T) {
	now := time.Now()
	ca, err := azuretpmtest.NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	imds, err := azuretpmtest.NewIMDSCA(now, "metadata.azure.com")
	if err != nil {
		t.Fatal(err)
	}
	other, err := azuretpmtest.NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	roots := func(s azuretpm.TrustSet) azuretpm.TrustSet {
		if s.AKRoots == nil {
			s.AKRoots = []*x509.Certificate{ca.Root}
		}
		if s.DocumentRoots == nil {
			s.DocumentRoots = []*x509.Certificate{imds.Root}
		}
		return s
	}
	for _, c := range []struct {
		name string
		set  azuretpm.TrustSet
		ok   bool
	}{
		{"lab roots and intermediates", roots(azuretpm.TrustSet{AKIntermediates: []*x509.Certificate{ca.Intermediate}, DocumentIntermediates: []*x509.Certificate{imds.Intermediate}}), true},
		{"no AK roots", azuretpm.TrustSet{AKRoots: []*x509.Certificate{}, DocumentRoots: []*x509.Certificate{imds.Root}}, false},
		{"no document roots", azuretpm.TrustSet{AKRoots: []*x509.Certificate{ca.Root}, DocumentRoots: []*x509.Certificate{}}, false},
		{"an intermediate as a root", roots(azuretpm.TrustSet{AKRoots: []*x509.Certificate{ca.Intermediate}}), false},
		{"an intermediate of another hierarchy", roots(azuretpm.TrustSet{AKIntermediates: []*x509.Certificate{other.Intermediate}}), false},
		{"the AK intermediate among the document's", roots(azuretpm.TrustSet{DocumentIntermediates: []*x509.Certificate{ca.Intermediate}}), false},
		{"a signer certificate as an intermediate", roots(azuretpm.TrustSet{DocumentIntermediates: []*x509.Certificate{imds.Intermediate, imds.Signer}}), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := azuretpm.NewTrust(c.set, now)
			if (err == nil) != c.ok {
				t.Errorf("NewTrust: %v, want ok %v", err, c.ok)
			}
		})
	}
	t.Run("WithIntermediates adds an operator's intermediate", func(t *testing.T) {
		tr, err := azuretpm.NewTrust(roots(azuretpm.TrustSet{}), now)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Intermediate.Raw}), 0o600); err != nil {
			t.Fatal(err)
		}
		more, err := tr.WithIntermediates(dir, "", now)
		if err != nil {
			t.Fatal(err)
		}
		if len(more.AKIntermediates()) != 1 || len(more.AKRoots()) != 1 || len(more.DocumentIntermediates()) != 0 {
			t.Errorf("%d AK intermediates, %d roots, %d document intermediates", len(more.AKIntermediates()), len(more.AKRoots()), len(more.DocumentIntermediates()))
		}
		if _, err := tr.WithIntermediates("", dir, now); err == nil {
			t.Error("the vTPM intermediate was accepted among the document's")
		}
	})
}
