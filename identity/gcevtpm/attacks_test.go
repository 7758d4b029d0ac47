package gcevtpm_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/identity/gcevtpm/gcevtpmtest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// clone deep-copies evidence through its wire form.
func clone(t testing.TB, ev *gcevtpm.Evidence) *gcevtpm.Evidence {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var out gcevtpm.Evidence
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// instanceInfoNoProps is an instance extension without its security
// properties: isProduction absent.
func instanceInfoNoProps(t testing.TB, i gcevtpm.InstanceInfo) []byte {
	t.Helper()
	b, err := asn1.Marshal(struct {
		Zone          string `asn1:"utf8"`
		ProjectNumber int64
		ProjectID     string `asn1:"utf8"`
		InstanceID    int64
		InstanceName  string `asn1:"utf8"`
	}{i.Zone, int64(i.ProjectNumber), i.ProjectID, int64(i.InstanceID), i.InstanceName})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAttackGCEVTPM is the GCE vTPM evidence attacked: certificates that
// are not Google's (by chain, by validity, by key, by kind), instances
// Google does not vouch for, quotes by other keys, for other sessions and
// other kubelet keys, and boots that are not the quoted one.
func TestAttackGCEVTPM(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t, gcevtpm.Options{})
	ctx := context.Background()
	// Another VM of the same project, RSA AK only: its genuine quote and
	// certificate.
	other := gcevtpmtest.Instance("node-2")
	other.InstanceID++
	vm2 := w.newVM(t, other, gcevtpmtest.VMOptions{Algs: []gcevtpmtest.Alg{gcevtpmtest.RSA}})
	_, ev2 := attestation(t, v, vm2)
	foreign, err := gcevtpmtest.NewCA(w.now)
	if err != nil {
		t.Fatal(err)
	}
	akECC := w.vm.AKs[gcevtpmtest.ECC]
	issue := func(ca *gcevtpmtest.CA, inst gcevtpm.InstanceInfo, c gcevtpmtest.Cert) []byte {
		der, err := ca.IssueAK(akECC, inst, w.now, c)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	notProd := w.inst
	notProd.IsProduction = false
	selfSigned := func() []byte {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "218557372616137117"},
			NotBefore: w.now.Add(-time.Hour), NotAfter: w.now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}

	type mut func(sess *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence)
	cert := func(der []byte) mut {
		return func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			ev.AKCertificate = der
			return s, ev
		}
	}
	cases := []struct {
		name string
		want attest.Reason
		mut  mut
	}{
		{"no AK certificate", attest.ReasonAKCertMissing, cert(nil)},
		{"AK certificate from a CA with Google's names and another key (a foreign chain)", attest.ReasonAKCertUntrusted, cert(issue(foreign, w.inst, gcevtpmtest.Cert{}))},
		{"self-signed AK certificate", attest.ReasonAKCertUntrusted, cert(selfSigned())},
		{"AK certificate expired", attest.ReasonAKCertExpired, cert(issue(w.ca, w.inst, gcevtpmtest.Cert{NotBefore: w.now.AddDate(-2, 0, 0), NotAfter: w.now.Add(-time.Minute)}))},
		{"AK certificate not yet valid", attest.ReasonAKCertExpired, cert(issue(w.ca, w.inst, gcevtpmtest.Cert{NotBefore: w.now.Add(time.Hour), NotAfter: w.now.AddDate(1, 0, 0)}))},
		{"AK certificate without the instance extension", attest.ReasonInstanceInfoMissing, cert(issue(w.ca, w.inst, gcevtpmtest.Cert{NoExtension: true}))},
		{"instance extension says isProduction false", attest.ReasonNotProduction, cert(issue(w.ca, notProd, gcevtpmtest.Cert{}))},
		{"instance extension without security properties (isProduction absent)", attest.ReasonNotProduction, cert(issue(w.ca, w.inst, gcevtpmtest.Cert{Extension: instanceInfoNoProps(t, w.inst)}))},
		{"instance extension that does not parse", attest.ReasonInstanceInfoMalformed, cert(issue(w.ca, w.inst, gcevtpmtest.Cert{Extension: []byte{0x30, 0x03, 0x02, 0x01, 0x01}}))},
		{"instance extension naming a zone GCE would not", attest.ReasonInstanceInfoMalformed, cert(issue(w.ca, gcevtpm.InstanceInfo{Zone: "../etc", ProjectNumber: 1, ProjectID: "nodeproof-test", InstanceID: 1, InstanceName: "x", IsProduction: true}, gcevtpmtest.Cert{}))},
		{"certificate of an encryption key (keyEncipherment) as the AK certificate", attest.ReasonAKCertInvalid, cert(issue(w.ca, w.inst, gcevtpmtest.Cert{KeyUsage: x509.KeyUsageKeyEncipherment}))},
		{"the CA's intermediate as the AK certificate", attest.ReasonAKCertInvalid, cert(w.ca.Intermediate.Raw)},
		{"AK certificate that is not DER", attest.ReasonAKCertInvalid, cert([]byte("-----BEGIN CERTIFICATE-----"))},
		{"an intermediate that is not DER", attest.ReasonAKCertInvalid, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			ev.Intermediates = [][]byte{{0x30, 0x00}}
			return s, ev
		}},
		{"five intermediates", attest.ReasonMalformed, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			ev.Intermediates = make([][]byte, 5)
			return s, ev
		}},
		{"oversized AK certificate", attest.ReasonMalformed, cert(make([]byte, gcevtpm.MaxCertificateSize+1))},
		{"another VM's genuine AK certificate beside this VM's AK and quote", attest.ReasonAKCertKeyMismatch, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			ev.AKCertificate = ev2.AKCertificate
			return s, ev
		}},
		{"another VM's AK and quote under this VM's certificate", attest.ReasonAKCertKeyMismatch, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			ev.AKPublic, ev.Quote.Quotes = ev2.AKPublic, ev2.Quote.Quotes
			return s, ev
		}},
		{"a quote by another key than the certified AK", attest.ReasonQuoteSignature, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			ev.Quote.Quotes = ev2.Quote.Quotes
			return s, ev
		}},
		{"AK public area that is not an AK (garbage)", attest.ReasonMalformed, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			ev.AKPublic = []byte{0, 1, 2}
			return s, ev
		}},
		{"evidence replayed into a new session (its quote binds the old nonce)", attest.ReasonQuoteBinding, func(_ *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			_, s, err := v.Challenge("workers", ev.Quote.KubeletKeySHA256, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s, ev
		}},
		{"kubelet key hash swapped in the evidence", attest.ReasonQuoteBinding, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			ev.Quote.KubeletKeySHA256 = testenv.KubeletKeySHA256(t)
			return s, ev
		}},
		{"session opened for another kubelet key", attest.ReasonKubeletKey, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			s.KubeletKeySHA256 = testenv.KubeletKeySHA256(t)
			return s, ev
		}},
		{"a PCR value changed after the quote", attest.ReasonQuotePCRDigest, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			ev.Quote.PCRs[7].Digest[0] ^= 1
			return s, ev
		}},
		{"the event log of another boot", attest.ReasonEventLogReplay, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			ev.Quote.EventLog = firmwaretestdata.MustLog("coreos-36-shielded-vm-no-secure-boot-eventlog")
			return s, ev
		}},
		{"a bare-metal TPM session", attest.ReasonSessionInvalid, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			s.Kind = attest.KindTPM
			return s, ev
		}},
		{"an expired session", attest.ReasonSessionExpired, func(s *attest.Session, ev *gcevtpm.Evidence) (*attest.Session, *gcevtpm.Evidence) {
			s.Expires = w.now
			return s, ev
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sess, ev := attestation(t, v, w.vm)
			sess, ev = c.mut(sess, clone(t, ev))
			_, err := v.Verify(ctx, sess, ev)
			attacktable.CheckRefusal(t, "GCE vTPM", c.name, c.want, err)
		})
	}

	// A genuine certificate of another project and zone: the claims carry
	// the certificate's, never the node's word; the pool's project and
	// zone allow-lists refuse it (ProjectNotAllowed, ZoneNotAllowed: the
	// policy's, at the wiring step).
	t.Run("certificate of another project and zone", func(t *testing.T) {
		elsewhere := w.inst
		elsewhere.ProjectID, elsewhere.ProjectNumber, elsewhere.Zone = "attacker-project", 999999999999, "europe-west1-b"
		sess, ev := attestation(t, v, w.vm)
		ev.AKCertificate = issue(w.ca, elsewhere, gcevtpmtest.Cert{})
		c, err := v.Verify(ctx, sess, ev)
		got := attacktable.Outcome(err)
		if err == nil {
			got = fmt.Sprintf("claims %s %s %s", c.Instance.Account, c.Instance.Location, c.Identity)
		}
		attacktable.Check(t, "GCE vTPM", "a genuine AK certificate naming another project and zone", "claims attacker-project europe-west1-b gcp:999999999999/europe-west1-b/218557372616137117", got)
	})
}

// TestAttackGCEVTPMAIA: issuers fetched over AIA only from allowed hosts,
// only certificates that signed the child, within the size and time
// bounds, without redirects; with no AIA configured nothing is fetched.
func TestAttackGCEVTPMAIA(t *testing.T) {
	w := newWorld(t)
	rootOnly, err := gcevtpm.NewTrust([]*x509.Certificate{w.ca.Root}, nil, w.now)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := gcevtpmtest.NewCA(w.now)
	if err != nil {
		t.Fatal(err)
	}
	fetches := 0
	mux := http.NewServeMux()
	mux.HandleFunc("/ca.crt", func(rw http.ResponseWriter, _ *http.Request) { fetches++; rw.Write(w.ca.Intermediate.Raw) })
	mux.HandleFunc("/foreign.crt", func(rw http.ResponseWriter, _ *http.Request) { rw.Write(foreign.Intermediate.Raw) })
	mux.HandleFunc("/fill/", func(rw http.ResponseWriter, _ *http.Request) { rw.Write(w.ca.Intermediate.Raw) })
	mux.HandleFunc("/big.crt", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Write(append(bytes.Clone(w.ca.Intermediate.Raw), make([]byte, 70<<10)...))
	})
	mux.HandleFunc("/redirect.crt", func(rw http.ResponseWriter, r *http.Request) { http.Redirect(rw, r, "/ca.crt", http.StatusFound) })
	mux.HandleFunc("/slow.crt", func(rw http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
		}
		rw.Write(w.ca.Intermediate.Raw)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	allowed := []string{"127.0.0.1"}
	for _, c := range []struct {
		name string
		path string
		aia  *gcevtpm.AIA
		want string
	}{
		{"issuer fetched from an allowed host", "/ca.crt", &gcevtpm.AIA{AllowedHosts: allowed}, "accepted"},
		{"issuer not shipped, no AIA configured", "/ca.crt", nil, string(attest.ReasonAKCertUntrusted)},
		{"AIA URL on a host not allowed", "/ca.crt", &gcevtpm.AIA{AllowedHosts: []string{"pki.goog"}}, string(attest.ReasonAKCertUntrusted)},
		{"AIA serves a certificate that did not sign the AK certificate", "/foreign.crt", &gcevtpm.AIA{AllowedHosts: allowed}, string(attest.ReasonAKCertUntrusted)},
		{"AIA response over MaxBytes", "/big.crt", &gcevtpm.AIA{AllowedHosts: allowed}, string(attest.ReasonAKCertUntrusted)},
		{"AIA redirect (not followed)", "/redirect.crt", &gcevtpm.AIA{AllowedHosts: allowed}, string(attest.ReasonAKCertUntrusted)},
		{"AIA server slower than Timeout", "/slow.crt", &gcevtpm.AIA{AllowedHosts: allowed, Timeout: 300 * time.Millisecond}, string(attest.ReasonAKCertUntrusted)},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := w.verifier(t, gcevtpm.Options{Trust: rootOnly, AIA: c.aia})
			sess, ev := attestation(t, v, w.vm)
			der, err := w.ca.IssueAK(w.vm.AKs[gcevtpmtest.ECC], w.inst, w.now, gcevtpmtest.Cert{AIA: []string{srv.URL + c.path}})
			if err != nil {
				t.Fatal(err)
			}
			ev.AKCertificate = der
			_, err = v.Verify(context.Background(), sess, ev)
			attacktable.Check(t, "GCE vTPM AIA", c.name, c.want, attacktable.Outcome(err))
		})
	}
	// The fetched issuer is cached by URL: a second VM's certificate from
	// the same intermediate costs no fetch.
	a := &gcevtpm.AIA{AllowedHosts: allowed}
	v := w.verifier(t, gcevtpm.Options{Trust: rootOnly, AIA: a})
	// verifyVia verifies an attestation whose AK certificate names url
	// as its issuer's AIA.
	verifyVia := func(url string) {
		t.Helper()
		sess, ev := attestation(t, v, w.vm)
		der, err := w.ca.IssueAK(w.vm.AKs[gcevtpmtest.ECC], w.inst, w.now, gcevtpmtest.Cert{AIA: []string{url}})
		if err != nil {
			t.Fatal(err)
		}
		ev.AKCertificate = der
		if _, err := v.Verify(context.Background(), sess, ev); err != nil {
			t.Fatal(err)
		}
	}
	before := fetches
	for range 3 {
		verifyVia(srv.URL + "/ca.crt")
	}
	if fetches-before != 1 {
		t.Errorf("%d fetches for three verifications of the same issuer, want 1", fetches-before)
	}
	if _, err := gcevtpm.NewVerifier(gcevtpm.Options{Trust: rootOnly, Clock: time.Now, AIA: &gcevtpm.AIA{}}); err == nil {
		t.Error("an AIA without allowed hosts was accepted")
	}
	_, err = gcevtpm.NewVerifier(gcevtpm.Options{Trust: rootOnly, Clock: time.Now, AIA: &gcevtpm.AIA{AllowedHosts: []string{"pki.goog", "privateca-content-*.storage.googleapis.com"}}})
	got := "accepted"
	if err != nil && strings.Contains(err.Error(), "exact host name") {
		got = "refused: exact hosts only"
	}
	attacktable.Check(t, "GCE vTPM AIA", "AIA hosts given as a pattern into Cloud Storage's shared namespace (privateca-content-*)", "refused: exact hosts only", got)

	// Certificates naming ever new URLs cannot fill the cache for good:
	// it keeps the most recently used, and the issuer every machine names
	// stays cached.
	for i := range 80 {
		verifyVia(fmt.Sprintf("%s/fill/%d.crt", srv.URL, i))
	}
	// The common issuer was the least recently used: evicted, it is
	// fetched once more, then cached again.
	before = fetches
	verifyVia(srv.URL + "/ca.crt")
	verifyVia(srv.URL + "/ca.crt")
	got = fmt.Sprintf("cache of %d, the common issuer fetched %d times", a.CacheLen(), fetches-before)
	if a.CacheLen() == 64 && fetches-before == 1 {
		got = "bounded at 64, least recently used evicted"
	}
	attacktable.Check(t, "GCE vTPM AIA", "80 AK certificates naming 80 distinct AIA URLs (filling the cache)", "bounded at 64, least recently used evicted", got)
}
