package azuretpm_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/azuretpm"
	"github.com/nodeproof/nodeproof/identity/azuretpm/azuretpmtest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// otherVMID is a second VM's ID.
const otherVMID = "0b7e1d2c-3a4f-4b5e-8c6d-7e8f9a0b1c2d"

// clone deep-copies evidence through its wire form.
func clone(t testing.TB, ev *azuretpm.Evidence) *azuretpm.Evidence {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var out azuretpm.Evidence
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// TestAttackAzureVTPM is the Azure vTPM evidence attacked: AK certificates
// that are not Azure's (by chain, validity, key, kind, subject), attested
// documents that are not IMDS's (by signer, chain, name, content), or not
// this session's or this VM's, quotes by other keys and for other
// sessions and kubelet keys, and boots that are not the quoted one.
func TestAttackAzureVTPM(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t, azuretpm.Options{})
	ctx := context.Background()
	// Another VM: its genuine AK certificate, quote and document.
	vm2 := w.newVM(t, otherVMID, azuretpmtest.VMOptions{})
	w.imds.Rewrite(func(c azuretpmtest.Content) azuretpmtest.Content { c.VMID = otherVMID; return c })
	_, ev2 := w.attestation(t, v, vm2)
	w.imds.Rewrite(nil)
	// An earlier attestation of this VM: its document of another session.
	_, old := w.attestation(t, v, w.vm)

	foreign, err := azuretpmtest.NewCA(w.now)
	if err != nil {
		t.Fatal(err)
	}
	foreignIMDS, err := azuretpmtest.NewIMDSCA(w.now, "metadata.azure.com")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *azuretpmtest.CA, pub any, c azuretpmtest.Cert) []byte {
		der, err := ca.IssueAK(pub, azuretpmtest.VMID, w.now, c)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	otherKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	selfSigned := func() []byte {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: azuretpmtest.VMID + ".TrustedVM.Azure.windows.net"},
			NotBefore: w.now.Add(-time.Hour), NotAfter: w.now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	// signed is a document for this session, changed by f, signed by sign
	// (nil: the lab IMDS signer).
	signed := func(s *attest.Session, f func(*azuretpmtest.Content), sign func([]byte) (string, error)) string {
		c := azuretpmtest.NewContent(azuretpm.IMDSNonce(s.Nonce, s.KubeletKeySHA256), w.now)
		if f != nil {
			f(&c)
		}
		if sign == nil {
			sign = w.imca.Sign
		}
		sig, err := sign(c.JSON())
		if err != nil {
			t.Fatal(err)
		}
		return sig
	}
	signer := func(name string, notBefore, notAfter time.Time) func([]byte) (string, error) {
		cert, key, err := w.imca.IssueSigner(name, notBefore, notAfter)
		if err != nil {
			t.Fatal(err)
		}
		return func(b []byte) (string, error) { return azuretpmtest.SignWith(b, cert, key) }
	}
	// tampered flips one character of the signed vmId inside the PKCS#7:
	// the content still parses, the signature no longer verifies.
	tampered := func(s *attest.Session) string {
		der, _ := base64.StdEncoding.DecodeString(signed(s, nil, nil))
		i := bytes.Index(der, []byte(azuretpmtest.VMID))
		if i < 0 {
			t.Fatal("no vmId in the PKCS#7")
		}
		der[i] ^= 0x01 // '5' → '4'
		return base64.StdEncoding.EncodeToString(der)
	}

	type mut func(sess *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence)
	cert := func(der []byte) mut {
		return func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.AKCertificate = der
			return s, ev
		}
	}
	doc := func(f func(s *attest.Session) string) mut {
		return func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.Document = f(s)
			return s, ev
		}
	}
	content := func(f func(*azuretpmtest.Content)) mut {
		return doc(func(s *attest.Session) string { return signed(s, f, nil) })
	}
	cases := []struct {
		name string
		want attest.Reason
		mut  mut
	}{
		// The AK certificate.
		{"no AK certificate", attest.ReasonAKCertMissing, cert(nil)},
		{"AK certificate from a CA with Azure's names and another key (a foreign chain)", attest.ReasonAKCertUntrusted, cert(issue(foreign, w.vm.AK, azuretpmtest.Cert{}))},
		{"self-signed AK certificate", attest.ReasonAKCertUntrusted, cert(selfSigned())},
		{"AK certificate expired", attest.ReasonAKCertExpired, cert(issue(w.ca, w.vm.AK, azuretpmtest.Cert{NotBefore: w.now.AddDate(-2, 0, 0), NotAfter: w.now.Add(-time.Minute)}))},
		{"AK certificate not yet valid", attest.ReasonAKCertExpired, cert(issue(w.ca, w.vm.AK, azuretpmtest.Cert{NotBefore: w.now.Add(time.Hour), NotAfter: w.now.AddDate(1, 0, 0)}))},
		{"AK certificate naming no VM (another subject)", attest.ReasonAKCertInvalid, cert(issue(w.ca, w.vm.AK, azuretpmtest.Cert{CommonName: "metadata.azure.com"}))},
		{"AK certificate naming a VM ID that is no UUID", attest.ReasonAKCertInvalid, cert(issue(w.ca, w.vm.AK, azuretpmtest.Cert{CommonName: "../x.TrustedVM.Azure.windows.net"}))},
		{"certificate of an encryption key (keyEncipherment) as the AK certificate", attest.ReasonAKCertInvalid, cert(issue(w.ca, w.vm.AK, azuretpmtest.Cert{KeyUsage: x509.KeyUsageKeyEncipherment}))},
		{"the CA's intermediate as the AK certificate", attest.ReasonAKCertInvalid, cert(w.ca.Intermediate.Raw)},
		{"AK certificate that is not DER", attest.ReasonAKCertInvalid, cert([]byte("-----BEGIN CERTIFICATE-----"))},
		{"five intermediates", attest.ReasonMalformed, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.Intermediates = make([][]byte, 5)
			return s, ev
		}},
		{"oversized AK certificate", attest.ReasonMalformed, cert(make([]byte, azuretpm.MaxCertificateSize+1))},
		{"a genuine AK certificate for another key naming this VM", attest.ReasonAKCertKeyMismatch, cert(issue(w.ca, otherKey.Public(), azuretpmtest.Cert{}))},
		{"another VM's genuine AK certificate beside this VM's AK and quote", attest.ReasonAKCertKeyMismatch, cert(ev2.AKCertificate)},
		{"another VM's AK and quote under this VM's certificate", attest.ReasonAKCertKeyMismatch, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.AKPublic, ev.Quote.Quotes = ev2.AKPublic, ev2.Quote.Quotes
			return s, ev
		}},
		{"AK public area that is not an AK (garbage)", attest.ReasonMalformed, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.AKPublic = []byte{0, 1, 2}
			return s, ev
		}},
		// The attested document.
		{"another VM's genuine document (two machines' evidence spliced)", attest.ReasonAzureDocVM, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.Document = signed(s, func(c *azuretpmtest.Content) { c.VMID = otherVMID }, nil)
			return s, ev
		}},
		{"another VM's AK certificate, AK and quote beside this VM's document", attest.ReasonAzureDocVM, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.AKCertificate, ev.AKPublic, ev.Quote = ev2.AKCertificate, ev2.AKPublic, ev2.Quote
			return s, ev
		}},
		{"a document of an earlier session of this VM (stale nonce)", attest.ReasonAzureDocNonce, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.Document = old.Document
			return s, ev
		}},
		{"a document asked for with the raw session nonce's prefix, not the binding", attest.ReasonAzureDocNonce, doc(func(s *attest.Session) string {
			return signed(s, func(c *azuretpmtest.Content) { c.Nonce = hex.EncodeToString(s.Nonce)[:32] }, nil)
		})},
		{"evidence replayed into a new session (its document and quote bind the old nonce)", attest.ReasonAzureDocNonce, func(_ *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			_, s, err := v.Challenge("workers", ev.Quote.KubeletKeySHA256, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s, ev
		}},
		{"session opened for another kubelet key (the document's nonce binds the node's)", attest.ReasonAzureDocNonce, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			s.KubeletKeySHA256 = testenv.KubeletKeySHA256(t)
			return s, ev
		}},
		{"document expired", attest.ReasonAzureDocExpired, content(func(c *azuretpmtest.Content) {
			c.Created, c.Expires = w.now.Add(-7*time.Hour), w.now.Add(-time.Hour)
		})},
		{"document created in the future", attest.ReasonAzureDocExpired, content(func(c *azuretpmtest.Content) {
			c.Created, c.Expires = w.now.Add(time.Hour), w.now.Add(7*time.Hour)
		})},
		{"document signed by a certificate for another name than metadata.azure.com (same chain)", attest.ReasonAzureDocUntrusted, doc(func(s *attest.Session) string {
			return signed(s, nil, signer("evil.example.com", w.now.Add(-time.Hour), w.now.Add(time.Hour)))
		})},
		{"document signed by metadata.azure.com under a foreign chain with Microsoft's names", attest.ReasonAzureDocUntrusted, doc(func(s *attest.Session) string {
			return signed(s, nil, foreignIMDS.Sign)
		})},
		{"document signed by an expired metadata.azure.com certificate", attest.ReasonAzureDocExpired, doc(func(s *attest.Session) string {
			return signed(s, nil, signer("metadata.azure.com", w.now.AddDate(-1, 0, 0), w.now.Add(-time.Hour)))
		})},
		{"document signed with the AK certificate's CA intermediate's name, by a self-made key", attest.ReasonAzureDocUntrusted, doc(func(s *attest.Session) string {
			k, _ := rsa.GenerateKey(rand.Reader, 2048)
			tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: "metadata.azure.com"}, DNSNames: []string{"metadata.azure.com"},
				NotBefore: w.now.Add(-time.Hour), NotAfter: w.now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
			der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
			c, _ := x509.ParseCertificate(der)
			return signed(s, nil, func(b []byte) (string, error) { return azuretpmtest.SignWith(b, c, k) })
		})},
		{"tampered PKCS#7 (a byte of the signed content changed)", attest.ReasonAzureDocSignature, doc(tampered)},
		{"document that is not base64", attest.ReasonAzureDocMalformed, doc(func(*attest.Session) string { return "not base64!" })},
		{"document that is not PKCS#7", attest.ReasonAzureDocMalformed, doc(func(*attest.Session) string {
			return base64.StdEncoding.EncodeToString([]byte{0x30, 0x03, 0x02, 0x01, 0x01})
		})},
		{"no document", attest.ReasonAzureDocMalformed, doc(func(*attest.Session) string { return "" })},
		{"oversized document", attest.ReasonAzureDocMalformed, doc(func(*attest.Session) string { return strings.Repeat("A", azuretpm.MaxDocumentSize+4) })},
		{"document whose vmId is no UUID", attest.ReasonAzureDocMalformed, content(func(c *azuretpmtest.Content) { c.VMID = "../../x" })},
		{"document without a subscription", attest.ReasonAzureDocMalformed, content(func(c *azuretpmtest.Content) { c.SubscriptionID = "" })},
		// The quote and the boot.
		{"a quote by another key than the certified AK", attest.ReasonQuoteSignature, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.Quote.Quotes = ev2.Quote.Quotes
			return s, ev
		}},
		{"kubelet key hash swapped in the evidence", attest.ReasonQuoteBinding, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.Quote.KubeletKeySHA256 = testenv.KubeletKeySHA256(t)
			return s, ev
		}},
		{"a PCR value changed after the quote", attest.ReasonQuotePCRDigest, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.Quote.PCRs[7].Digest[0] ^= 1
			return s, ev
		}},
		{"the event log of another boot (does not replay)", attest.ReasonEventLogReplay, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			ev.Quote.EventLog = firmwaretestdata.MustLog("coreos-36-shielded-vm-no-secure-boot-eventlog")
			return s, ev
		}},
		{"a GCE vTPM session", attest.ReasonSessionInvalid, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			s.Kind = attest.KindGCEVTPM
			return s, ev
		}},
		{"an expired session", attest.ReasonSessionExpired, func(s *attest.Session, ev *azuretpm.Evidence) (*attest.Session, *azuretpm.Evidence) {
			s.Expires = w.now
			return s, ev
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sess, ev := w.attestation(t, v, w.vm)
			sess, ev = c.mut(sess, clone(t, ev))
			_, err := v.Verify(ctx, sess, ev)
			attacktable.CheckRefusal(t, "Azure vTPM", c.name, c.want, err)
		})
	}

	// A genuine document of another subscription for this VM: the claims
	// carry the document's, never the node's word (the pool's
	// subscription allow-list is policy's, at the wiring step).
	t.Run("document of another subscription", func(t *testing.T) {
		const sub = "99999999-9999-4999-8999-999999999999"
		sess, ev := w.attestation(t, v, w.vm)
		ev.Document = signed(sess, func(c *azuretpmtest.Content) { c.SubscriptionID = sub }, nil)
		c, err := v.Verify(ctx, sess, ev)
		got := attacktable.Outcome(err)
		if err == nil {
			got = "claims " + c.Identity
		}
		attacktable.Check(t, "Azure vTPM", "a genuine document naming another subscription", fmt.Sprintf("claims azure:%s/%s", sub, azuretpmtest.VMID), got)
	})
}
