package azuretpm_test

import (
	"crypto/rand"
	"crypto/rsa"
	"regexp"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/azuretpm"
	"github.com/nodeproof/nodeproof/identity/azuretpm/azuretpmtest"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

var (
	fuzzUUID  = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	fuzzNonce = regexp.MustCompile(`^[A-Za-z0-9]{1,32}$`)
)

// FuzzParseDocument: the attested document parser (base64, PKCS#7, JSON)
// never panics, refuses with AzureDocumentMalformed only, and what it
// accepts has IMDS's shapes. Seeds: documents the lab IMDS signed, one
// with line breaks as IMDS sends them.
func FuzzParseDocument(f *testing.F) {
	ca, err := azuretpmtest.NewIMDSCA(testNow, "metadata.azure.com")
	if err != nil {
		f.Fatal(err)
	}
	c := azuretpmtest.NewContent("0123456789abcdef0123456789abcdef", testNow)
	for _, content := range [][]byte{c.JSON(), []byte(`{"nonce":"a","vmId":"x"}`), []byte(`[]`)} {
		sig, err := ca.Sign(content)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(sig)
	}
	sig, _ := ca.Sign(c.JSON())
	f.Add(sig[:64] + "\r\n" + sig[64:])
	f.Fuzz(func(t *testing.T, sig string) {
		d, err := azuretpm.ParseDocument(sig)
		if err != nil {
			if r, _ := attest.ReasonOf(err); r != attest.ReasonAzureDocMalformed {
				t.Fatalf("refused with %v", err)
			}
			return
		}
		if !fuzzNonce.MatchString(d.Nonce) || !fuzzUUID.MatchString(d.VMID) || !fuzzUUID.MatchString(d.SubscriptionID) || !d.Created.Before(d.Expires) || len(d.SKU) > 256 {
			t.Fatalf("accepted %+v", d)
		}
	})
}

// FuzzCertificate: any bytes as an AK certificate (and as an intermediate
// beside it) are refused with a typed reason or accepted only when they
// chain to the pinned Azure root and name a VM: never a panic, never an
// untyped error.
func FuzzCertificate(f *testing.F) {
	ca, err := azuretpmtest.NewCA(testNow)
	if err != nil {
		f.Fatal(err)
	}
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		f.Fatal(err)
	}
	leaf, err := ca.IssueAK(k.Public(), azuretpmtest.VMID, testNow, azuretpmtest.Cert{})
	if err != nil {
		f.Fatal(err)
	}
	shipped := tpmtest.ReadCert(f, "certs/intermediates/global_virtual_tpm_ca_03.pem")
	f.Add(leaf, ca.Intermediate.Raw)
	f.Add(shipped.Raw, []byte(nil))
	tr, err := azuretpm.DefaultTrust(testNow)
	if err != nil {
		f.Fatal(err)
	}
	v, err := azuretpm.NewVerifier(azuretpm.Options{Trust: tr, Clock: func() time.Time { return testNow }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, cert, inter []byte) {
		var inters [][]byte
		if inter != nil {
			inters = [][]byte{inter}
		}
		_, vmID, err := v.Certificate(cert, inters)
		if err != nil {
			if _, ok := attest.ReasonOf(err); !ok {
				t.Fatalf("untyped refusal: %v", err)
			}
			return
		}
		if !fuzzUUID.MatchString(vmID) {
			t.Fatalf("accepted a VM ID %q", vmID)
		}
	})
}
