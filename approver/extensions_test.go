package approver

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"net"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/cert"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/store"
)

// extCSR is a CSR made by x509.CreateCertificateRequest from the kubelet's
// template (subject, DNS names, IP addresses) plus extra extensions.
func extCSR(t *testing.T, name, signer string, key crypto.Signer, node string, dns []string, ips []net.IP, requester string, usages []certv1.KeyUsage, extra ...pkix.Extension) *certv1.CertificateSigningRequest {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{Organization: []string{NodesGroup}, CommonName: NodeUserPrefix + node},
		DNSNames: dns, IPAddresses: ips, ExtraExtensions: extra,
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return csrObject(name, signer, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), requester, usages)
}

func csrObject(name, signer string, request []byte, requester string, usages []certv1.KeyUsage) *certv1.CertificateSigningRequest {
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(now.Add(-time.Second))},
		Spec:       certv1.CertificateSigningRequestSpec{Request: request, SignerName: signer, Usages: usages, Username: requester},
	}
}

func mustDER(t *testing.T, v any) []byte {
	t.Helper()
	b, err := asn1.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAttackCSRExtensions: a kubelet CSR carries only what a kubelet's
// certificate needs. An attested node (or anyone holding its key) asking
// for more — CA:TRUE, name constraints, key usages or extended key usages
// beyond its signer's, a SAN of another kind — is denied ExtensionNotAllowed
// even where every other check passes (and even without DenyUnattested);
// CSRs made exactly as client-go's certificate manager makes them, from
// the kubelet's templates, are still approved.
func TestAttackCSRExtensions(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	d := &Decider{Store: st, Lineages: st, Tokens: st, Clock: clock}
	ips := []net.IP{net.ParseIP("10.0.0.1")}
	dns := []string{"worker-1.example.com"}
	enrol := func(node string, key crypto.Signer, token string) {
		t.Helper()
		if err := st.Enrol(ctx, &store.Record{ID: "rec-" + node, NodeName: node, Pool: "worker", Kind: attest.KindTPM, Identity: "tpm-ek:" + node,
			KubeletKeySHA256: keyHash(t, key), Addresses: []string{"10.0.0.1", "worker-1.example.com"}, BootstrapTokenID: token,
			CreatedAt: now.Add(-time.Minute), Expires: now.Add(time.Hour)}, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	serving := []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth}
	client := []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}
	// worker-1's kubelet has its first client certificate (the approver
	// saw it issued, so it is in the node's lineage): its serving CSRs
	// carry that certificate's credential ID, as the API server records it.
	k1 := mustKey(t)
	enrol("worker-1", k1, "")
	first, sum := newTestSigner(t).issue(t, extCSR(t, "first-worker-1", SignerKubeletClient, k1, "worker-1", nil, nil, "system:bootstrap:first0", client))
	if ok, err := d.RecordIssued(ctx, first); err != nil || !ok {
		t.Fatalf("worker-1's first certificate was not recorded: %v", err)
	}
	byKubelet := func(c *certv1.CertificateSigningRequest) *certv1.CertificateSigningRequest {
		c.Spec.Extra = credential(sum)
		return c
	}
	servingFor := func(name string, extra ...pkix.Extension) *certv1.CertificateSigningRequest {
		return byKubelet(extCSR(t, name, SignerKubeletServing, mustKey(t), "worker-1", dns, ips, NodeUserPrefix+"worker-1", serving, extra...))
	}

	caTrue := pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: mustDER(t, struct {
		IsCA       bool `asn1:"optional"`
		MaxPathLen int  `asn1:"optional,default:-1"`
	}{true, 0})}
	nameConstraints := pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 30}, Critical: true, Value: mustDER(t, asn1.RawValue{Tag: asn1.TagSequence, IsCompound: true, Bytes: mustDER(t, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: mustDER(t, asn1.RawValue{Tag: asn1.TagSequence, IsCompound: true, Bytes: mustDER(t, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 2, Bytes: []byte("example.com")})})})})}
	eku := func(oids ...asn1.ObjectIdentifier) pkix.Extension {
		return pkix.Extension{Id: oidExtKeyUsage, Value: mustDER(t, oids)}
	}
	keyUsage := func(bits ...int) pkix.Extension {
		b := make([]byte, 2)
		n := 0
		for _, i := range bits {
			b[i/8] |= 0x80 >> (i % 8)
			n = max(n, i+1)
		}
		return pkix.Extension{Id: oidKeyUsage, Critical: true, Value: mustDER(t, asn1.BitString{Bytes: b[:(n+7)/8], BitLength: n})}
	}
	san := func(names ...asn1.RawValue) pkix.Extension {
		var body []byte
		for _, n := range names {
			body = append(body, mustDER(t, n)...)
		}
		return pkix.Extension{Id: oidSubjectAltName, Value: mustDER(t, asn1.RawValue{Tag: asn1.TagSequence, IsCompound: true, Bytes: body})}
	}
	dnsName := asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: sanDNSName, Bytes: []byte("worker-1.example.com")}
	otherName := asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: append(mustDER(t, asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 311, 20, 2, 3}),
		mustDER(t, asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: mustDER(t, "administrator@example.com")})...)}
	dirName := asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 4, IsCompound: true, Bytes: mustDER(t, pkix.Name{CommonName: "root"}.ToRDNSequence())}
	ipName := asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: sanIPAddress, Bytes: net.ParseIP("10.0.0.1").To4()}
	anyEKU := asn1.ObjectIdentifier{2, 5, 29, 37, 0}
	codeSigning := asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 3}

	// The kubelet's own CSRs, as client-go makes them: its serving
	// template (k8s.io/kubernetes pkg/kubelet/certificate: subject, DNS
	// names, IP addresses) through cert.MakeCSRFromTemplate, and its
	// client CSR through cert.MakeCSR.
	kubeletServing, err := cert.MakeCSRFromTemplate(mustKey(t), &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: NodeUserPrefix + "worker-1", Organization: []string{NodesGroup}},
		DNSNames: dns, IPAddresses: ips,
	})
	if err != nil {
		t.Fatal(err)
	}
	clientKey, rsaKey := mustKey(t), mustRSA(t)
	enrol("worker-2", clientKey, "abc123")
	enrol("worker-3", rsaKey, "def456")
	kubeletClient, err := cert.MakeCSR(clientKey, &pkix.Name{CommonName: NodeUserPrefix + "worker-2", Organization: []string{NodesGroup}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name       string
		csr        *certv1.CertificateSigningRequest
		wantAction Action
		wantReason attest.Reason
	}{
		{"kubelet serving CSR as client-go makes it", byKubelet(csrObject("ok-serving", SignerKubeletServing, kubeletServing, NodeUserPrefix+"worker-1", serving)), Approve, "NodeproofAttestedTPM"},
		{"serving CSR requesting its own usages as extensions", servingFor("ok-usages", keyUsage(keyUsageDigitalSig), eku(oidEKUServerAuth)), Approve, "NodeproofAttestedTPM"},
		{"kubelet client CSR as client-go makes it", csrObject("ok-client", SignerKubeletClient, kubeletClient, "system:bootstrap:abc123", client), Approve, "NodeproofAttestedTPM"},

		{"serving CSR asking for BasicConstraints CA:TRUE", servingFor("ca-true", caTrue), Deny, attest.ReasonExtensionNotAllowed},
		{"serving CSR asking for NameConstraints", servingFor("name-constraints", nameConstraints), Deny, attest.ReasonExtensionNotAllowed},
		{"serving CSR asking for client auth besides server auth", servingFor("eku-client", eku(oidEKUServerAuth, oidEKUClientAuth)), Deny, attest.ReasonExtensionNotAllowed},
		{"serving CSR asking for any extended key usage", servingFor("eku-any", eku(anyEKU)), Deny, attest.ReasonExtensionNotAllowed},
		{"serving CSR asking for code signing", servingFor("eku-code", eku(codeSigning)), Deny, attest.ReasonExtensionNotAllowed},
		{"serving CSR asking for key usage certificate signing", servingFor("ku-certsign", keyUsage(keyUsageDigitalSig, 5)), Deny, attest.ReasonExtensionNotAllowed},
		{"serving CSR (ECDSA) asking for key usage key encipherment", servingFor("ku-encipher", keyUsage(keyUsageDigitalSig, keyUsageKeyEncipher)), Deny, attest.ReasonExtensionNotAllowed},
		{"serving CSR with an otherName (UPN) SAN beside its DNS name", servingFor("san-upn", san(dnsName, otherName)), Deny, attest.ReasonExtensionNotAllowed},
		{"serving CSR with a directoryName SAN", servingFor("san-dir", san(ipName, dirName)), Deny, attest.ReasonExtensionNotAllowed},
		{"serving CSR with an unknown private extension", servingFor("private", pkix.Extension{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1}, Value: []byte{5, 0}}), Deny, attest.ReasonExtensionNotAllowed},
		{"client CSR asking for BasicConstraints CA:TRUE", extCSR(t, "client-ca", SignerKubeletClient, rsaKey, "worker-3", nil, nil, "system:bootstrap:def456",
			append(client, certv1.UsageKeyEncipherment), caTrue), Deny, attest.ReasonExtensionNotAllowed},
		{"client CSR asking for server auth", extCSR(t, "client-eku", SignerKubeletClient, rsaKey, "worker-3", nil, nil, "system:bootstrap:def456", client,
			eku(oidEKUClientAuth, oidEKUServerAuth)), Deny, attest.ReasonExtensionNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec, err := d.Decide(ctx, tc.csr)
			if err != nil {
				t.Fatal(err)
			}
			got := fmt.Sprintf("%s %s", dec.Action, dec.Reason)
			if tc.wantAction == Approve {
				if got != fmt.Sprintf("%s %s", tc.wantAction, tc.wantReason) {
					t.Fatalf("a kubelet's own CSR: %s (%s)", got, dec.Message)
				}
				return
			}
			attacktable.Check(t, "approver", "CSR: "+tc.name, fmt.Sprintf("%s %s", tc.wantAction, tc.wantReason), got)
		})
	}
}

func mustRSA(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
