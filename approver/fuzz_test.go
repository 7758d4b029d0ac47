package approver

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/cert"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
)

// fuzzUsages are the usages a fuzzed CSR may ask for, one bit each.
var fuzzUsages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment,
	certv1.UsageClientAuth, certv1.UsageServerAuth, certv1.UsageCertSign, certv1.UsageDigitalSignature}

func usagesOf(bits uint8) []certv1.KeyUsage {
	var u []certv1.KeyUsage
	for i, k := range fuzzUsages {
		if bits&(1<<i) != 0 {
			u = append(u, k)
		}
	}
	return u
}

// Usage bits of what a kubelet asks for.
const (
	bitsClient    = 1<<0 | 1<<2
	bitsClientRSA = 1<<0 | 1<<1 | 1<<2
	bitsServing   = 1<<0 | 1<<3
)

// kubeletCSRPEM makes a CSR the way the kubelet does (client-go's
// cert.MakeCSR, what its bootstrap and certificate manager call).
func kubeletCSRPEM(tb testing.TB, key crypto.Signer, node string, dns []string, ips []net.IP) []byte {
	tb.Helper()
	b, err := cert.MakeCSR(key, &pkix.Name{Organization: []string{NodesGroup}, CommonName: NodeUserPrefix + node}, dns, ips)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// FuzzRecognize feeds arbitrary CSRs — spec.request bytes, the signer,
// the usages and the requester (spec.username): everything a bootstrap
// credential holder controls — through the recognizers. Seeds are CSRs
// made as the kubelet makes them (client-go's cert.MakeCSR; ECDSA P-256
// and RSA keys; client and serving). Properties: a refusal has a reason;
// what is accepted is one PEM CSR whose self-signature verifies, for
// system:node:<DNS name> in system:nodes, with an allowed key whose hash
// is the one recorded, with exactly the kubelet usages of its signer, no
// SAN for a client certificate, and for a serving certificate the node's
// own request with the SANs of the CSR.
func FuzzRecognize(f *testing.F) {
	ec := mustKey(f)
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		f.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	ips := []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("fd00::1")}
	seeds := []struct {
		request  []byte
		serving  bool
		usages   uint8
		username string
		accept   bool
	}{
		{kubeletCSRPEM(f, ec, "worker-1", nil, nil), false, bitsClient, "system:bootstrap:abcdef", true},
		{kubeletCSRPEM(f, rk, "worker-1.example.com", nil, nil), false, bitsClientRSA, "system:bootstrap:abcdef", true},
		{kubeletCSRPEM(f, p384, "master-0", nil, nil), false, bitsClient, "system:node:master-0", true},
		{kubeletCSRPEM(f, ec, "worker-1", []string{"worker-1.example.com"}, ips), true, bitsServing, "system:node:worker-1", true},
		{kubeletCSRPEM(f, rk, "worker-1", []string{"worker-1"}, nil), true, bitsServing | 1<<1, "system:node:worker-1", true},
		{kubeletCSRPEM(f, ec, "worker-1", []string{"worker-1"}, nil), true, bitsServing, "system:node:worker-2", false},
		{kubeletCSRPEM(f, ec, "worker-1", nil, ips), false, bitsClient, "system:bootstrap:abcdef", false},
		{kubeletCSRPEM(f, ec, "Worker_1", nil, nil), false, bitsClient, "system:bootstrap:abcdef", false},
		{makeCSR(f, clientCSR(f, "c", "worker-1", ec, "u")).Spec.Request, false, bitsClient | 1<<4, "u", false},
		{[]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"), false, bitsClient, "u", false},
	}
	for _, s := range seeds {
		csr := &certv1.CertificateSigningRequest{Spec: certv1.CertificateSigningRequestSpec{Request: s.request,
			SignerName: SignerKubeletClient, Usages: usagesOf(s.usages), Username: s.username}}
		if s.serving {
			csr.Spec.SignerName = SignerKubeletServing
		}
		if k, reason, _ := recognize(csr); (k != nil) != s.accept {
			f.Fatalf("seed for %q: accepted %v (%s), want %v", s.username, k != nil, reason, s.accept)
		}
		f.Add(s.request, s.serving, s.usages, s.username)
	}
	f.Fuzz(func(t *testing.T, request []byte, serving bool, usageBits uint8, username string) {
		csr := &certv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: "fuzz"},
			Spec: certv1.CertificateSigningRequestSpec{Request: request, SignerName: SignerKubeletClient,
				Usages: usagesOf(usageBits), Username: username},
		}
		if serving {
			csr.Spec.SignerName = SignerKubeletServing
		}
		k, reason, _ := recognize(csr)
		if k == nil {
			if reason == "" {
				t.Fatal("refused without a reason")
			}
			return
		}
		block, rest := pem.Decode(request)
		if block == nil || strings.TrimSpace(string(rest)) != "" {
			t.Fatal("accepted a request that is not one PEM block")
		}
		cr, err := x509.ParseCertificateRequest(block.Bytes)
		if err != nil || cr.CheckSignature() != nil {
			t.Fatalf("accepted a CSR that does not parse or verify: %v", err)
		}
		sum := sha256.Sum256(cr.RawSubjectPublicKeyInfo)
		_, isRSA := cr.PublicKey.(*rsa.PublicKey)
		ext := certv1.UsageClientAuth
		if serving {
			ext = certv1.UsageServerAuth
		}
		wantUsages := [][]certv1.KeyUsage{{certv1.UsageDigitalSignature, ext}}
		if isRSA {
			wantUsages = append(wantUsages, []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, ext})
		}
		usagesOK := false
		for _, w := range wantUsages {
			u := slices.Clone(csr.Spec.Usages)
			slices.Sort(u)
			slices.Sort(w)
			usagesOK = usagesOK || slices.Equal(u, w)
		}
		switch {
		case !slices.Equal(k.keySHA256, sum[:]):
			t.Fatal("recorded key hash is not the CSR's key")
		case len(validation.IsDNS1123Subdomain(k.nodeName)) > 0: // Kubernetes' own rule, not ours
			t.Fatalf("accepted node name %q", k.nodeName)
		case cr.Subject.CommonName != NodeUserPrefix+k.nodeName || !slices.Equal(cr.Subject.Organization, []string{NodesGroup}):
			t.Fatalf("accepted subject %v", cr.Subject)
		case !usagesOK:
			t.Fatalf("accepted usages %v", csr.Spec.Usages)
		case len(cr.EmailAddresses) > 0 || len(cr.URIs) > 0:
			t.Fatal("accepted e-mail or URI SANs")
		case !serving && (len(cr.DNSNames) > 0 || len(cr.IPAddresses) > 0 || len(k.dnsNames) > 0 || len(k.ips) > 0):
			t.Fatal("accepted a client CSR with SANs")
		case serving && NodeUserPrefix+k.nodeName != username:
			t.Fatal("accepted a serving CSR requested by someone else")
		case serving && (len(k.dnsNames)+len(k.ips) == 0 || !slices.Equal(k.dnsNames, cr.DNSNames) || len(k.ips) != len(cr.IPAddresses)):
			t.Fatalf("serving SANs %v %v, CSR %v %v", k.dnsNames, k.ips, cr.DNSNames, cr.IPAddresses)
		}
	})
}

// FuzzIssued feeds what the API server and the signer write into a CSR the
// approver learns lineages from — the credential ID of the requester
// (spec.extra) and the issued certificate (status.certificate) — through
// RequesterCertificate and RecordIssued, on a node whose enrolment bound
// the CSR's key. Seeds: a real credential ID and the certificate a signer
// issues for the CSR. Properties: a credential ID is accepted only as
// exactly X509SHA256=<its hex>; a certificate is recorded only when it is
// one parsed certificate for the CSR's own key and node, and then the
// lineage holds exactly its DER's SHA-256.
func FuzzIssued(f *testing.F) {
	ca := newTestSigner(f)
	key := mustKey(f)
	csr := makeCSR(f, clientCSR(f, "first", "n", key, "system:bootstrap:abcdef"))
	issued, sum := ca.issue(f, csr)
	f.Add("X509SHA256="+hex.EncodeToString(sum), issued.Status.Certificate)
	f.Add("JTI=abc", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	other, _ := ca.issue(f, makeCSR(f, clientCSR(f, "other", "n", mustKey(f), "u")))
	f.Add("X509SHA256=", other.Status.Certificate)
	st := openStore(f)
	if err := st.Enrol(context.Background(), &store.Record{ID: "rec", NodeName: "n", Pool: "worker", Kind: attest.KindTPM, Identity: "ek:n",
		KubeletKeySHA256: keyHash(f, key), CreatedAt: now, Expires: now.Add(time.Hour)}, store.EnrolOptions{}); err != nil {
		f.Fatal(err)
	}
	lins := st
	f.Fuzz(func(t *testing.T, cred string, certPEM []byte) {
		// Each input starts from another enrolment's lineage.
		if _, err := lins.UpdateLineage(context.Background(), "n", func(*store.Lineage) (*store.Lineage, error) {
			return &store.Lineage{NodeName: "n", Identity: "ek:previous", BoundAt: now, KubeletKeySHA256: keyHash(t, key)}, nil
		}); err != nil {
			t.Fatal(err)
		}
		c := csr.DeepCopy()
		c.Spec.Extra = map[string]certv1.ExtraValue{CredentialIDKey: {cred}}
		if got, why := RequesterCertificate(c); got != nil && cred != "X509SHA256="+hex.EncodeToString(got) {
			t.Fatalf("credential %q accepted as %x", cred, got)
		} else if got == nil && why == "" {
			t.Fatal("a refused credential ID without a why")
		}
		c.Status.Certificate = certPEM
		ok, err := (&Decider{Store: st, Lineages: st, Tokens: st, Clock: clock}).RecordIssued(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return
		}
		block, _ := pem.Decode(certPEM)
		parsed, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatalf("recorded a certificate that does not parse: %v", err)
		}
		spki := sha256.Sum256(parsed.RawSubjectPublicKeyInfo)
		if !slices.Equal(spki[:], keyHash(t, key)) || parsed.Subject.CommonName != NodeUserPrefix+"n" {
			t.Fatalf("recorded a certificate for another key or node (%s)", parsed.Subject.CommonName)
		}
		l, err := lins.Lineage(context.Background(), "n")
		want := sha256.Sum256(parsed.Raw)
		if err != nil || len(l.Certificates) != 1 || !slices.Equal(l.Certificates[0].SHA256, want[:]) {
			t.Fatalf("lineage after recording: %+v, %v", l, err)
		}
	})
}
