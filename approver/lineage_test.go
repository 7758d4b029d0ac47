package approver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/store"
)

// testSigner plays the kubelet client signer (kube-controller-manager's
// csrsigning) for unit tests: it issues a certificate for a CSR's key and
// subject, as status.certificate.
type testSigner struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	n    int64
}

func newTestSigner(t testing.TB) *testSigner {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test kubelet client signer"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testSigner{cert: c, key: key, n: 1}
}

// issue returns csr with a certificate issued for it, and the
// certificate's credential ID sum.
func (s *testSigner) issue(t testing.TB, csr *certv1.CertificateSigningRequest) (*certv1.CertificateSigningRequest, []byte) {
	t.Helper()
	block, _ := pem.Decode(csr.Spec.Request)
	cr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	s.n++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(s.n), Subject: cr.Subject, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(12 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.cert, cr.PublicKey, s.key)
	if err != nil {
		t.Fatal(err)
	}
	out := csr.DeepCopy()
	out.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	sum := sha256.Sum256(der)
	return out, sum[:]
}

// credential is the spec.extra of a request made with the certificate
// whose DER has SHA-256 sum, as the API server writes it.
func credential(sum []byte) map[string]certv1.ExtraValue {
	return map[string]certv1.ExtraValue{CredentialIDKey: {"X509SHA256=" + hex.EncodeToString(sum)}}
}

// TestRequesterCertificate: only one X509SHA256=<64 lower-case hex> value
// names a client certificate.
func TestRequesterCertificate(t *testing.T) {
	sum := sha256.Sum256([]byte("cert"))
	h := hex.EncodeToString(sum[:])
	for _, tc := range []struct {
		name  string
		extra map[string]certv1.ExtraValue
		want  bool
	}{
		{"an X.509 credential", map[string]certv1.ExtraValue{CredentialIDKey: {"X509SHA256=" + h}}, true},
		{"none", nil, false},
		{"a service account token's", map[string]certv1.ExtraValue{CredentialIDKey: {"JTI=" + h}}, false},
		{"two values", map[string]certv1.ExtraValue{CredentialIDKey: {"X509SHA256=" + h, "X509SHA256=" + h}}, false},
		{"upper-case hex", map[string]certv1.ExtraValue{CredentialIDKey: {"X509SHA256=" + fmt.Sprintf("%X", sum)}}, false},
		{"short", map[string]certv1.ExtraValue{CredentialIDKey: {"X509SHA256=" + h[:62]}}, false},
		{"under another key", map[string]certv1.ExtraValue{"authentication.kubernetes.io/credential-ID": {"X509SHA256=" + h}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := RequesterCertificate(&certv1.CertificateSigningRequest{Spec: certv1.CertificateSigningRequestSpec{Extra: tc.extra}})
			if (got != nil) != tc.want || (got == nil) == (why == "") {
				t.Fatalf("RequesterCertificate = %x (%q), want a sum: %v", got, why, tc.want)
			}
			if got != nil && hex.EncodeToString(got) != h {
				t.Fatalf("sum %x, want %s", got, h)
			}
		})
	}
}

// TestLineageAttacks: which issued certificates join the lineage of the
// name's owner. Each certificate that does not is an attack row: a
// certificate that must never authenticate a renewal of the name.
func TestLineageAttacks(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	d := &Decider{Store: st, Lineages: st, Tokens: st, Clock: clock}
	ca := newTestSigner(t)
	enrol := func(id, node, identity string, key *ecdsa.PrivateKey, o store.EnrolOptions) {
		t.Helper()
		if err := st.Enrol(ctx, &store.Record{ID: id, NodeName: node, Pool: "worker", Kind: attest.KindTPM, Identity: identity,
			KubeletKeySHA256: keyHash(t, key), CreatedAt: now.Add(-time.Minute), Expires: now.Add(time.Hour)}, o); err != nil {
			t.Fatal(err)
		}
	}
	lineage := func(node string) *store.Lineage {
		l, err := st.Lineage(ctx, node)
		if err != nil {
			t.Fatalf("lineage of %s: %v", node, err)
		}
		return l
	}
	kA, kB := mustKey(t), mustKey(t)
	enrol("rec-a", "n", "ek:A", kA, store.EnrolOptions{})

	first, certA := ca.issue(t, makeCSR(t, clientCSR(t, "first-a", "n", kA, "system:bootstrap:aaaaaa")))
	renewalSpec := clientCSR(t, "renew-a", "n", mustKey(t), NodeUserPrefix+"n")
	renewal := makeCSR(t, renewalSpec)
	renewal.Spec.Extra = credential(certA)
	renewed, certA2 := ca.issue(t, renewal)
	stranger := makeCSR(t, clientCSR(t, "stranger", "n", mustKey(t), NodeUserPrefix+"n"))
	stranger.Spec.Extra = credential(certA2[:16:16]) // malformed: no credential
	strangerIssued, _ := ca.issue(t, stranger)
	unknownCred := makeCSR(t, clientCSR(t, "unknown-cred", "n", mustKey(t), NodeUserPrefix+"n"))
	other := sha256.Sum256([]byte("a certificate nodeproof never saw"))
	unknownCred.Spec.Extra = credential(other[:])
	unknownIssued, _ := ca.issue(t, unknownCred)
	serving, _ := ca.issue(t, makeCSR(t, servingCSR(t, "serving-a", "n", []string{"n"}, nil)))
	mismatched, _ := ca.issue(t, makeCSR(t, clientCSR(t, "other-key", "n", mustKey(t), "system:bootstrap:aaaaaa")))
	block, _ := pem.Decode(mismatched.Status.Certificate)
	forged := first.DeepCopy() // the bound key's CSR, with another CSR's certificate
	forged.Name, forged.UID = "forged", "uid-forged"
	forged.Status.Certificate = pem.EncodeToMemory(block)

	for _, tc := range []struct {
		name   string
		csr    *certv1.CertificateSigningRequest
		before func()
		want   bool
		check  func(t *testing.T)
	}{
		{name: "the first certificate, for the enrolment's bound key, starts the lineage", csr: first, want: true, check: func(t *testing.T) {
			l := lineage("n")
			if _, ok := l.Has(certA); !ok || l.Identity != "ek:A" {
				t.Fatalf("lineage %+v", l)
			}
		}},
		{name: "the same certificate seen again is not added twice", csr: first, want: false},
		{name: "a renewal made with a lineage certificate joins it", csr: renewed, want: true, check: func(t *testing.T) {
			if _, ok := lineage("n").Has(certA2); !ok {
				t.Fatal("the renewal's certificate is not in the lineage")
			}
		}},
		{name: "a renewal made with no credential ID", csr: strangerIssued, want: false},
		{name: "a renewal made with a certificate not in the lineage", csr: unknownIssued, want: false},
		{name: "a serving certificate", csr: serving, want: false},
		{name: "a certificate whose key is not the CSR's", csr: forged, want: false},
		{name: "a name no identity owns", csr: func() *certv1.CertificateSigningRequest {
			c, _ := ca.issue(t, makeCSR(t, clientCSR(t, "nobody", "nobody", kA, "system:bootstrap:aaaaaa")))
			return c
		}(), want: false},
		{name: "after the name moved, the previous owner's renewal", csr: renewed.DeepCopy(), before: func() {
			if _, err := st.Release(ctx, "n"); err != nil {
				t.Fatal(err)
			}
			enrol("rec-b", "n", "ek:B", kB, store.EnrolOptions{})
		}, want: false},
		{name: "after the name moved, the previous owner's first certificate", csr: first, want: false, check: func(t *testing.T) {
			if l := lineage("n"); l.Identity != "ek:A" {
				t.Fatalf("the lineage changed to %s", l.Identity)
			}
		}},
		{name: "the new owner's first certificate replaces the lineage", csr: func() *certv1.CertificateSigningRequest {
			c, _ := ca.issue(t, makeCSR(t, clientCSR(t, "first-b", "n", kB, "system:bootstrap:bbbbbb")))
			return c
		}(), want: true, check: func(t *testing.T) {
			l := lineage("n")
			if _, ok := l.Has(certA); ok || l.Identity != "ek:B" || len(l.Certificates) != 1 {
				t.Fatalf("after the new owner's first certificate: %+v", l)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != nil {
				tc.before()
			}
			got, err := d.RecordIssued(ctx, tc.csr)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want {
				attacktable.Check(t, "approver", "certificate lineage: "+tc.name, "not recorded", map[bool]string{true: "recorded", false: "not recorded"}[got])
			} else if !got {
				t.Fatal("not recorded")
			}
			if tc.check != nil {
				tc.check(t)
			}
		})
	}
}

// TestLimitKey: a machine's own credentials — its node user, a bootstrap
// token issued for it — are one budget whatever names its CSRs ask for; a
// requester many machines may share spends the budget of the name too.
func TestLimitKey(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	if err := st.Enrol(ctx, &store.Record{ID: "rec-1", NodeName: "worker-1", Pool: "worker", Kind: attest.KindTPM, Identity: "ek:1",
		KubeletKeySHA256: keyHash(t, mustKey(t)), BootstrapTokenID: "abcdef", CreatedAt: now, Expires: now.Add(time.Hour)}, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := st.Enrol(ctx, &store.Record{ID: "rec-2", NodeName: "worker-2", Pool: "worker", Kind: attest.KindTPM, Identity: "ek:2",
		KubeletKeySHA256: keyHash(t, mustKey(t)), BootstrapTokenID: "old123", CreatedAt: now.Add(-2 * time.Hour), Expires: now.Add(-time.Hour)}, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	d := &Decider{Store: st, Lineages: st, Tokens: st, Clock: clock}
	key := func(node, requester string) string {
		return d.LimitKey(ctx, makeCSR(t, clientCSR(t, "c", node, mustKey(t), requester)))
	}
	for _, tc := range []struct {
		name string
		a, b [2]string // node, requester
		same bool
	}{
		{"a per-node token naming two nodes", [2]string{"worker-1", "system:bootstrap:abcdef"}, [2]string{"victim", "system:bootstrap:abcdef"}, true},
		{"a per-node token and the victim's own token", [2]string{"victim", "system:bootstrap:abcdef"}, [2]string{"victim", "system:bootstrap:vvvvvv"}, false},
		{"a node's own credentials naming two nodes", [2]string{"worker-1", "system:node:worker-1"}, [2]string{"victim", "system:node:worker-1"}, true},
		{"a node and the victim", [2]string{"victim", "system:node:worker-1"}, [2]string{"victim", "system:node:victim"}, false},
		{"a shared service account, two names", [2]string{"worker-1", "system:serviceaccount:x:node-bootstrapper"}, [2]string{"victim", "system:serviceaccount:x:node-bootstrapper"}, false},
		{"a token no record names, two names", [2]string{"worker-1", "system:bootstrap:shared"}, [2]string{"victim", "system:bootstrap:shared"}, false},
		{"a token whose record expired, two names", [2]string{"worker-2", "system:bootstrap:old123"}, [2]string{"victim", "system:bootstrap:old123"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := key(tc.a[0], tc.a[1]) == key(tc.b[0], tc.b[1]); got != tc.same {
				t.Fatalf("one budget: %v, want %v", got, tc.same)
			}
		})
	}
}
