package tpm_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
)

// TestEKCertificateQuirks: real vendor EK certificates come with the TCG NV
// header, trailing padding from a fixed-size NV index, and a critical SAN
// Go does not understand. All must be accepted; a certificate with any
// other unhandled critical extension must not.
func TestEKCertificateQuirks(t *testing.T) {
	ca := newCA(t, "Vendor")
	m := newMachine(t, ca, nil)
	v := newVerifier(t, ca, nil)
	req, err := m.collector.Request()
	if err != nil {
		t.Fatal(err)
	}
	der := m.ekCert.Raw
	nvHeader := append([]byte{0x10, 0x01, 0x00}, binary.BigEndian.AppendUint16(nil, uint16(len(der)))...)
	cases := []struct {
		name string
		cert []byte
	}{
		{"plain DER with critical TCG SAN", der},
		{"TCG NV header", append(nvHeader, der...)},
		{"trailing NV padding", append(append([]byte(nil), der...), make([]byte, 64)...)},
		{"header and padding", append(append(nvHeader, der...), 0xff, 0xff, 0xff)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := *req
			r.EKCertificate = tc.cert
			if _, _, err := v.Challenge("worker", m.keySHA, &r); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
	}
	t.Run("another unhandled critical extension", func(t *testing.T) {
		odd, err := ca.IssueEK(m.ekCert.PublicKey, testNow, pkix.Extension{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1}, Critical: true, Value: []byte{5, 0}})
		if err != nil {
			t.Fatal(err)
		}
		r := *req
		r.EKCertificate = odd
		_, _, err = v.Challenge("worker", m.keySHA, &r)
		wantReason(t, err, attest.ReasonEKCertInvalid)
	})
	t.Run("truncated certificate", func(t *testing.T) {
		r := *req
		r.EKCertificate = der[:len(der)/2]
		_, _, err := v.Challenge("worker", m.keySHA, &r)
		wantReason(t, err, attest.ReasonEKCertInvalid)
	})
}

func TestLoadInventory(t *testing.T) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(der)
	h := hex.EncodeToString(sum[:])
	cases := []struct {
		name, doc, wantErr string
	}{
		{"valid", "entries:\n- ekSHA256: " + strings.ToUpper(h) + "\n  nodeName: n1\n  addresses: [10.0.0.1]\n", ""},
		{"unknown field", "entries:\n- ekSHA256: " + h + "\n  node: n1\n", "node"},
		{"short hash", "entries:\n- ekSHA256: abcd\n", "64 hex"},
		{"listed twice", "entries:\n- ekSHA256: " + h + "\n- ekSHA256: " + h + "\n", "twice"},
		// A name no Node can have would enrol a machine whose kubelet's
		// CSR the approver then refuses: refused here, where it is written.
		{"a node name Kubernetes refuses", "entries:\n- ekSHA256: " + h + "\n  nodeName: Rack1_Node7\n", "nodeName"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "inv.yaml")
			if err := os.WriteFile(path, []byte(tc.doc), 0o600); err != nil {
				t.Fatal(err)
			}
			inv, err := tpm.LoadInventory(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			e, ok := inv.Lookup(sum)
			if !ok || e.NodeName != "n1" || e.EKSHA256 != h {
				t.Fatalf("lookup = %+v, %v", e, ok)
			}
		})
	}
}

// TestVendorCACertificateIsNotAnEK: a TPM vendor's own root or
// intermediate (here Google's real EK CAs) chains to the vendor's root, but
// it is a CA certificate, not an EK certificate; presented as one (with its
// key as the EK) it is refused. Found by FuzzEKCertificate.
func TestVendorCACertificateIsNotAnEK(t *testing.T) {
	names, err := filepath.Glob("testdata/ekcerts/google/*")
	if err != nil || len(names) != 5 {
		t.Fatalf("Google EK CA certificates: %d, %v", len(names), err)
	}
	set := tpm.RootSet{Name: "google"}
	var ders [][]byte
	for _, n := range names {
		der, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		if c.CheckSignatureFrom(c) == nil {
			set.Roots = append(set.Roots, c)
		} else {
			set.Intermediates = append(set.Intermediates, c)
		}
		ders = append(ders, der)
	}
	v, err := tpm.NewVerifier(tpm.Options{Roots: []tpm.RootSet{set}, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	m := newMachine(t, nil, nil)
	req, err := m.collector.Request()
	if err != nil {
		t.Fatal(err)
	}
	for i, der := range ders {
		t.Run(filepath.Base(names[i]), func(t *testing.T) {
			c, _ := x509.ParseCertificate(der)
			pub, err := x509.MarshalPKIXPublicKey(c.PublicKey)
			if err != nil {
				t.Fatal(err)
			}
			r := *req
			r.EKPublic, r.EKCertificate = pub, der
			_, _, err = v.Challenge("worker", m.keySHA, &r)
			wantReason(t, err, attest.ReasonEKCertInvalid)
		})
	}
}
