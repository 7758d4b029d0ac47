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
	"encoding/pem"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func clock() time.Time { return now }

// csrSpec describes a CSR to make.
type csrSpec struct {
	name      string
	signer    string
	key       crypto.Signer
	org       []string
	cn        string
	dns       []string
	ips       []net.IP
	usages    []certv1.KeyUsage
	requester string
	// extra is the requester's extra info, as the API server records it
	// (the client certificate's credential ID).
	extra map[string]certv1.ExtraValue
}

func mustKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func keyHash(t testing.TB, k crypto.Signer) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(der)
	return s[:]
}

func makeCSR(t testing.TB, s csrSpec) *certv1.CertificateSigningRequest {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{Organization: s.org, CommonName: s.cn}, DNSNames: s.dns, IPAddresses: s.ips,
	}, s.key)
	if err != nil {
		t.Fatal(err)
	}
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, UID: types.UID("uid-" + s.name), CreationTimestamp: metav1.NewTime(now.Add(-time.Second))},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: s.signer, Usages: s.usages, Username: s.requester, Extra: s.extra,
		},
	}
}

// clientCSR is what a kubelet sends for node with key, from requester.
func clientCSR(t testing.TB, name, node string, key crypto.Signer, requester string) csrSpec {
	return csrSpec{
		name: name, signer: SignerKubeletClient, key: key, org: []string{NodesGroup}, cn: NodeUserPrefix + node,
		usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, requester: requester,
	}
}

func servingCSR(t testing.TB, name, node string, dns []string, ips []net.IP) csrSpec {
	return csrSpec{
		name: name, signer: SignerKubeletServing, key: mustKey(t), org: []string{NodesGroup}, cn: NodeUserPrefix + node,
		dns: dns, ips: ips, usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth},
		requester: NodeUserPrefix + node,
	}
}

func openStore(t testing.TB) *boltstore.Store {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), time.Second, clock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestDecide(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	d := &Decider{Store: st, Lineages: st, Tokens: st, Clock: clock}
	// creds holds the credential (the SHA-256 of a client certificate) of
	// each node's kubelet, as the approver recorded it in the node's
	// lineage when it saw the certificate issued for the first CSR, the
	// one with the key the enrolment bound.
	ca := newTestSigner(t)
	creds := map[string][]byte{}
	issueFirst := func(node string, key crypto.Signer) []byte {
		t.Helper()
		csr, sum := ca.issue(t, makeCSR(t, clientCSR(t, "first-"+node+fmt.Sprint(len(creds)), node, key, "system:bootstrap:first0")))
		if ok, err := d.RecordIssued(ctx, csr); err != nil || !ok {
			t.Fatalf("the first certificate of %s was not recorded: %v", node, err)
		}
		creds[node] = sum
		return sum
	}
	put := func(r *store.Record) *store.Record {
		t.Helper()
		if r.CreatedAt.IsZero() {
			r.CreatedAt = now.Add(-time.Minute)
		}
		if r.Expires.IsZero() {
			r.Expires = now.Add(time.Hour)
		}
		if r.Identity == "" {
			r.Identity = "tpm-ek:" + r.NodeName
		}
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	k1, k2, k3, kTok := mustKey(t), mustKey(t), mustKey(t), mustKey(t)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	smallRSA, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	put(&store.Record{ID: "rec-w1", NodeName: "worker-1", Pool: "worker", Kind: attest.KindTPM, KubeletKeySHA256: keyHash(t, k1),
		Addresses: []string{"10.0.0.1", "worker-1.example.com"}, Summary: "tpm ek=…"})
	issueFirst("worker-1", k1)
	put(&store.Record{ID: "rec-w2", NodeName: "worker-2", Pool: "worker", Kind: attest.KindGCP, KubeletKeySHA256: keyHash(t, k2)})
	issueFirst("worker-2", k2)
	put(&store.Record{ID: "rec-old", NodeName: "worker-3", Pool: "worker", Kind: attest.KindTPM, KubeletKeySHA256: keyHash(t, k3),
		Addresses: []string{"10.0.0.3"}, CreatedAt: now.Add(-2 * time.Hour), Expires: now.Add(-time.Hour)})
	issueFirst("worker-3", k3)
	put(&store.Record{ID: "rec-tok", NodeName: "worker-4", Pool: "worker", Kind: attest.KindAWS, KubeletKeySHA256: keyHash(t, kTok), BootstrapTokenID: "abcdef"})
	// worker-7's record named the token old123 and expired (so did the
	// token).
	put(&store.Record{ID: "rec-w7", NodeName: "worker-7", Pool: "worker", Kind: attest.KindTPM, KubeletKeySHA256: keyHash(t, mustKey(t)), BootstrapTokenID: "old123",
		CreatedAt: now.Add(-2 * time.Hour), Expires: now.Add(-time.Hour)})
	put(&store.Record{ID: "rec-rsa", NodeName: "worker-5", Pool: "worker", Kind: attest.KindTPM, KubeletKeySHA256: keyHash(t, rsaKey)})
	// worker-6: an older record with addresses, a newer one (a TPM trusted
	// through its vendor CA, no inventory entry) with none: the newest decides.
	// Its kubelet before the re-enrolment had a certificate (credential
	// w6old); the one after, another.
	kW6old, kW6 := mustKey(t), mustKey(t)
	put(&store.Record{ID: "rec-w6-old", NodeName: "worker-6", Pool: "worker", Kind: attest.KindTPM, KubeletKeySHA256: keyHash(t, kW6old),
		Addresses: []string{"10.0.0.6"}, CreatedAt: now.Add(-30 * time.Minute)})
	w6old := issueFirst("worker-6", kW6old)
	if err := st.Enrol(ctx, &store.Record{ID: "rec-w6", NodeName: "worker-6", Pool: "worker", Kind: attest.KindTPM, Identity: "tpm-ek:worker-6",
		KubeletKeySHA256: keyHash(t, kW6), CreatedAt: now.Add(-time.Minute), Expires: now.Add(time.Hour)}, store.EnrolOptions{Again: true, ReplaceKey: true}); err != nil {
		t.Fatal(err)
	}
	issueFirst("worker-6", kW6)
	// master-0: enrolled by machine A, released, enrolled by machine B
	// (whose record is older than A's last one, so "the newest record"
	// would be A's); gone-1: enrolled by machine C, released.
	kA, kB, kC := mustKey(t), mustKey(t), mustKey(t)
	put(&store.Record{ID: "rec-m0-b", NodeName: "master-0", Pool: "master", Kind: attest.KindTPM, Identity: "tpm-ek:B", KubeletKeySHA256: keyHash(t, kB),
		Addresses: []string{"10.0.0.20"}, CreatedAt: now.Add(-50 * time.Minute)})
	if _, err := st.Release(ctx, "master-0"); err != nil {
		t.Fatal(err)
	}
	put(&store.Record{ID: "rec-m0-a", NodeName: "master-0", Pool: "master", Kind: attest.KindTPM, Identity: "tpm-ek:A", KubeletKeySHA256: keyHash(t, kA),
		Addresses: []string{"10.0.0.10"}, CreatedAt: now.Add(-10 * time.Minute)})
	m0A := issueFirst("master-0", kA) // machine A's kubelet, while A owned the name
	if _, err := st.Release(ctx, "master-0"); err != nil {
		t.Fatal(err)
	}
	if err := st.Enrol(ctx, &store.Record{ID: "rec-m0-b2", NodeName: "master-0", Pool: "master", Kind: attest.KindTPM, Identity: "tpm-ek:B",
		KubeletKeySHA256: keyHash(t, kB), Addresses: []string{"10.0.0.20"}, CreatedAt: now.Add(-40 * time.Minute), Expires: now.Add(time.Hour)}, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	issueFirst("master-0", kB)
	put(&store.Record{ID: "rec-gone", NodeName: "gone-1", Pool: "worker", Kind: attest.KindTPM, Identity: "tpm-ek:C", KubeletKeySHA256: keyHash(t, kC)})
	if _, err := st.Release(ctx, "gone-1"); err != nil {
		t.Fatal(err)
	}
	// Nodes renewing: fresh, enrolled long ago and never since, failing
	// their last re-attestation, revoked, passing again after a failure.
	lifeKeys := map[string]*ecdsa.PrivateKey{}
	for _, n := range []struct {
		node     string
		enrolled time.Time
		status   *store.AttestationStatus
		revoke   bool
	}{
		{"life-fresh", now.Add(-time.Minute), nil, false},
		{"life-stale", now.Add(-4 * time.Hour), nil, false},
		{"life-failed", now.Add(-2 * time.Hour), &store.AttestationStatus{LastAttempt: now.Add(-time.Minute), LastSuccess: now.Add(-time.Hour), Reason: "SecureBootDisabled"}, false},
		{"life-revoked", now.Add(-time.Minute), nil, true},
		{"life-passed", now.Add(-5 * time.Hour), &store.AttestationStatus{LastAttempt: now.Add(-time.Minute), LastSuccess: now.Add(-time.Minute), Passed: true}, false},
	} {
		lifeKeys[n.node] = mustKey(t)
		put(&store.Record{ID: "rec-" + n.node, NodeName: n.node, Pool: "worker", Kind: attest.KindTPM, KubeletKeySHA256: keyHash(t, lifeKeys[n.node]),
			Addresses: []string{"10.0.9.9"}, CreatedAt: n.enrolled, Expires: n.enrolled.Add(time.Hour), BootstrapTokenID: "life" + n.node[5:7]})
		issueFirst(n.node, lifeKeys[n.node])
		if n.status != nil {
			if _, err := st.UpdateStatus(ctx, n.node, "tpm-ek:"+n.node, func(b *store.Binding) error { b.Status = *n.status; return nil }); err != nil {
				t.Fatal(err)
			}
		}
		if n.revoke {
			if _, err := st.Revoke(ctx, n.node, "stolen", now); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A GCP record as identity/gcp now writes it: the instance name and its
	// zonal internal DNS name.
	kGKE := mustKey(t)
	put(&store.Record{ID: "rec-gcp", NodeName: "gke-1", Pool: "worker", Kind: attest.KindGCP, KubeletKeySHA256: keyHash(t, kGKE),
		Addresses: []string{"gke-1", "gke-1.us-central1-a.c.my-project.internal"}})
	issueFirst("gke-1", kGKE)

	// CSRs the node makes itself, with its kubelet's certificate (or cred).
	withCred := func(s csrSpec, cred []byte) csrSpec {
		if cred != nil {
			s.extra = credential(cred)
		}
		return s
	}
	renewal := func(name, node string) csrSpec {
		return withCred(clientCSR(t, name, node, mustKey(t), NodeUserPrefix+node), creds[node])
	}
	srv := func(name, node string, dns []string, ips []net.IP) csrSpec {
		return withCred(servingCSR(t, name, node, dns, ips), creds[node])
	}
	// life-fresh's kubelet renewed once: its second certificate (issued for
	// a renewal its first one made) is in the lineage too.
	renewed, freshSecond := ca.issue(t, makeCSR(t, renewal("renewed-fresh", "life-fresh")))
	if ok, err := d.RecordIssued(ctx, renewed); err != nil || !ok {
		t.Fatalf("life-fresh's renewed certificate was not recorded: %v", err)
	}
	never := sha256.Sum256([]byte("a certificate nodeproof never saw issued"))
	jti := func(s csrSpec) csrSpec {
		s.extra = map[string]certv1.ExtraValue{CredentialIDKey: {"JTI=0f6d1d67-8a4b-4bd6-8e3e-5d5bde0c0c9a"}}
		return s
	}

	withUsages := func(s csrSpec, u ...certv1.KeyUsage) csrSpec { s.usages = u; return s }
	withOrg := func(s csrSpec, o ...string) csrSpec { s.org = o; return s }
	withSANs := func(s csrSpec) csrSpec { s.dns = []string{"worker-1"}; return s }
	withSigner := func(s csrSpec, signer string) csrSpec { s.signer = signer; return s }
	withRequester := func(s csrSpec, r string) csrSpec { s.requester = r; return s }

	reached := map[ruleOutcome]bool{} // the rules' outcomes the cases reach
	// Ordered: later cases see what earlier ones consumed.
	for _, tc := range []struct {
		name        string
		csr         csrSpec
		deny        bool // DenyUnattested
		wantAction  Action
		wantReason  attest.Reason
		wantRecord  string
		wantConsume string // record that must now be consumed
	}{
		{name: "attested key approves and consumes", csr: clientCSR(t, "csr-1", "worker-1", k1, "system:serviceaccount:x:node-bootstrapper"),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM", wantRecord: "rec-w1", wantConsume: "rec-w1"},
		{name: "the same CSR again (approval write retried) approves", csr: clientCSR(t, "csr-1", "worker-1", k1, "system:serviceaccount:x:node-bootstrapper"),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM", wantRecord: "rec-w1"},
		{name: "a second CSR after the record was consumed", csr: clientCSR(t, "csr-1b", "worker-1", k1, "system:serviceaccount:x:node-bootstrapper"),
			wantAction: Deny, wantReason: attest.ReasonRecordConsumed, wantRecord: "rec-w1"},
		{name: "swapped key", csr: clientCSR(t, "csr-2", "worker-2", k1, "u"),
			wantAction: Deny, wantReason: attest.ReasonKeyNotAttested},
		{name: "another node's key under this node's name", csr: clientCSR(t, "csr-2b", "worker-2", k3, "u"),
			wantAction: Deny, wantReason: attest.ReasonKeyNotAttested},
		{name: "gcp evidence names its kind", csr: clientCSR(t, "csr-2c", "worker-2", k2, "u"),
			wantAction: Approve, wantReason: "NodeproofAttestedGCP", wantRecord: "rec-w2", wantConsume: "rec-w2"},
		{name: "no record: left pending", csr: clientCSR(t, "csr-3", "stranger", mustKey(t), "u"),
			wantAction: Leave, wantReason: attest.ReasonNoAttestation},
		{name: "no record, deny unattested", csr: clientCSR(t, "csr-3b", "stranger", mustKey(t), "u"), deny: true,
			wantAction: Deny, wantReason: attest.ReasonNoAttestation},
		{name: "expired record: left pending", csr: clientCSR(t, "csr-4", "worker-3", k3, "u"),
			wantAction: Leave, wantReason: attest.ReasonRecordExpired},
		{name: "token record, other requester", csr: clientCSR(t, "csr-5", "worker-4", kTok, "system:bootstrap:zzzzzz"),
			wantAction: Deny, wantReason: attest.ReasonRequesterMismatch, wantRecord: "rec-tok"},
		{name: "token record, its token's user", csr: clientCSR(t, "csr-5b", "worker-4", kTok, "system:bootstrap:abcdef"),
			wantAction: Approve, wantReason: "NodeproofAttestedAWS", wantRecord: "rec-tok", wantConsume: "rec-tok"},
		{name: "RSA with key encipherment", csr: withUsages(clientCSR(t, "csr-6", "worker-5", rsaKey, "u"),
			certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, certv1.UsageClientAuth),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM", wantRecord: "rec-rsa"},
		{name: "ECDSA with key encipherment", csr: withUsages(clientCSR(t, "csr-7", "worker-1", mustKey(t), "u"),
			certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, certv1.UsageClientAuth),
			wantAction: Leave, wantReason: attest.ReasonUsagesNotAllowed},
		{name: "server auth on a client CSR", csr: withUsages(clientCSR(t, "csr-8", "worker-1", mustKey(t), "u"),
			certv1.UsageDigitalSignature, certv1.UsageServerAuth),
			wantAction: Leave, wantReason: attest.ReasonUsagesNotAllowed},
		{name: "extra organization", csr: withOrg(clientCSR(t, "csr-9", "worker-1", mustKey(t), "u"), NodesGroup, "system:masters"),
			wantAction: Leave, wantReason: attest.ReasonBadSubject},
		{name: "not system:node", csr: func() csrSpec { s := clientCSR(t, "csr-10", "x", mustKey(t), "u"); s.cn = "admin"; return s }(),
			wantAction: Leave, wantReason: attest.ReasonBadSubject},
		{name: "client CSR with SANs", csr: withSANs(clientCSR(t, "csr-11", "worker-1", mustKey(t), "u")),
			wantAction: Leave, wantReason: attest.ReasonSANsNotAllowed},
		{name: "RSA 1024", csr: clientCSR(t, "csr-12", "worker-1", smallRSA, "u"),
			wantAction: Leave, wantReason: attest.ReasonKeyNotAllowed},
		{name: "P-521", csr: clientCSR(t, "csr-13", "worker-1", p521, "u"), deny: true,
			wantAction: Deny, wantReason: attest.ReasonKeyNotAllowed},
		{name: "another signer is not ours", csr: withSigner(clientCSR(t, "csr-14", "worker-1", mustKey(t), "u"), "example.com/other"), deny: true,
			wantAction: Leave, wantReason: attest.ReasonNotKubelet},
		{name: "serving, attested SANs", csr: srv("srv-1", "worker-1", []string{"worker-1.example.com"}, []net.IP{net.ParseIP("10.0.0.1")}),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM", wantRecord: "rec-w1"},
		{name: "serving, unattested IP", csr: srv("srv-2", "worker-1", nil, []net.IP{net.ParseIP("10.9.9.9")}),
			wantAction: Deny, wantReason: attest.ReasonSANNotAttested, wantRecord: "rec-w1"},
		{name: "serving, unattested name", csr: srv("srv-3", "worker-1", []string{"evil.example.com"}, nil),
			wantAction: Deny, wantReason: attest.ReasonSANNotAttested},
		{name: "serving, requested by someone else", csr: withRequester(srv("srv-4", "worker-1", nil, []net.IP{net.ParseIP("10.0.0.1")}), "system:node:worker-2"),
			wantAction: Leave, wantReason: attest.ReasonRequesterMismatch},
		{name: "serving, no record", csr: srv("srv-5", "stranger", nil, []net.IP{net.ParseIP("10.0.0.1")}),
			wantAction: Leave, wantReason: attest.ReasonNoAttestation},
		{name: "serving, no record, deny unattested", csr: srv("srv-5b", "stranger", nil, []net.IP{net.ParseIP("10.0.0.1")}), deny: true,
			wantAction: Deny, wantReason: attest.ReasonNoAttestation},
		{name: "serving, one SAN attested and one not", csr: srv("srv-6", "worker-1", []string{"worker-1.example.com", "worker-1.evil.com"}, nil),
			wantAction: Deny, wantReason: attest.ReasonSANNotAttested, wantRecord: "rec-w1"},
		{name: "serving, DNS SAN in another case, IPv4-mapped IP", csr: srv("srv-7", "worker-1", []string{"WORKER-1.example.com"}, []net.IP{net.ParseIP("::ffff:10.0.0.1")}),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM", wantRecord: "rec-w1"},
		{name: "serving, record without addresses (GCP before addresses): left pending", csr: srv("srv-8", "worker-2", []string{"worker-2"}, nil),
			wantAction: Leave, wantReason: attest.ReasonNoAddresses, wantRecord: "rec-w2"},
		{name: "serving, record without addresses, deny unattested", csr: srv("srv-8b", "worker-2", []string{"worker-2"}, nil), deny: true,
			wantAction: Deny, wantReason: attest.ReasonNoAddresses, wantRecord: "rec-w2"},
		{name: "serving, the newest record attested no addresses: left pending", csr: srv("srv-9", "worker-6", nil, []net.IP{net.ParseIP("10.0.0.6")}),
			wantAction: Leave, wantReason: attest.ReasonNoAddresses, wantRecord: "rec-w6"},
		{name: "serving, expired record's addresses still count", csr: srv("srv-10", "worker-3", nil, []net.IP{net.ParseIP("10.0.0.3")}),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM", wantRecord: "rec-old"},
		{name: "serving, GCP instance name and zonal DNS name", csr: srv("srv-11", "gke-1", []string{"gke-1", "gke-1.us-central1-a.c.my-project.internal"}, nil),
			wantAction: Approve, wantReason: "NodeproofAttestedGCP", wantRecord: "rec-gcp"},
		{name: "serving, GCP node with an IP SAN: GCP evidence attests no IP, left to another approver", csr: srv("srv-12", "gke-1", []string{"gke-1"}, []net.IP{net.ParseIP("10.128.0.5")}),
			wantAction: Leave, wantReason: attest.ReasonNoAddresses, wantRecord: "rec-gcp"},
		{name: "the key of a machine whose name was released and taken by another", csr: clientCSR(t, "csr-m0-a", "master-0", kA, "u"),
			wantAction: Deny, wantReason: attest.ReasonNodeNameTaken, wantRecord: "rec-m0-a"},
		{name: "the key of a machine whose name was released", csr: clientCSR(t, "csr-gone", "gone-1", kC, "u"),
			wantAction: Deny, wantReason: attest.ReasonNodeNameTaken, wantRecord: "rec-gone"},
		{name: "the owner of a name taken over approves", csr: clientCSR(t, "csr-m0-b", "master-0", kB, "u"),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM", wantRecord: "rec-m0-b2", wantConsume: "rec-m0-b2"},
		{name: "serving, the addresses of the newest record, not the owner's", csr: srv("srv-m0-a", "master-0", nil, []net.IP{net.ParseIP("10.0.0.10")}),
			wantAction: Deny, wantReason: attest.ReasonSANNotAttested, wantRecord: "rec-m0-b2"},
		{name: "serving, the owner's addresses", csr: srv("srv-m0-b", "master-0", nil, []net.IP{net.ParseIP("10.0.0.20")}),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM", wantRecord: "rec-m0-b2"},
		{name: "serving, a released name", csr: srv("srv-gone", "gone-1", nil, []net.IP{net.ParseIP("10.0.0.30")}), deny: true,
			wantAction: Deny, wantReason: attest.ReasonNoAttestation},
		{name: "renewal by a freshly attested node", csr: renewal("renew-1", "life-fresh"),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM", wantRecord: "rec-life-fresh"},
		{name: "renewal by a node that passed a re-attestation after its enrolment went stale", csr: renewal("renew-2", "life-passed"),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM"},
		{name: "renewal by a node not attested since its enrolment 4 h ago", csr: renewal("renew-3", "life-stale"),
			wantAction: Deny, wantReason: attest.ReasonAttestationStale},
		{name: "renewal by a node whose last re-attestation failed", csr: renewal("renew-4", "life-failed"),
			wantAction: Deny, wantReason: attest.ReasonAttestationFailed},
		{name: "renewal by a revoked node", csr: renewal("renew-5", "life-revoked"),
			wantAction: Deny, wantReason: attest.ReasonRevoked},
		{name: "renewal for a node name no identity owns", csr: renewal("renew-6", "stranger"), deny: true,
			wantAction: Deny, wantReason: attest.ReasonNoAttestation},
		{name: "serving, a node whose last re-attestation failed", csr: srv("srv-life-1", "life-failed", nil, []net.IP{net.ParseIP("10.0.9.9")}),
			wantAction: Deny, wantReason: attest.ReasonAttestationFailed},
		{name: "serving, a revoked node", csr: srv("srv-life-2", "life-revoked", nil, []net.IP{net.ParseIP("10.0.9.9")}),
			wantAction: Deny, wantReason: attest.ReasonRevoked},
		{name: "serving, a stale node", csr: srv("srv-life-3", "life-stale", nil, []net.IP{net.ParseIP("10.0.9.9")}),
			wantAction: Deny, wantReason: attest.ReasonAttestationStale},
		{name: "serving, GCP node with a DNS SAN the token does not attest", csr: srv("srv-13", "gke-1", []string{"gke-1.evil.example"}, nil),
			wantAction: Deny, wantReason: attest.ReasonSANNotAttested, wantRecord: "rec-gcp"},
		// Renewals and serving CSRs belong to the kubelet of the identity
		// that owns the name now.
		{name: "renewal with the node's second certificate (issued for a renewal the first made)", csr: withCred(renewal("renew-7", "life-fresh"), freshSecond),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM", wantRecord: "rec-life-fresh"},
		{name: "renewal by the node with no client certificate credential (a token; impersonation)", csr: withCred(clientCSR(t, "renew-8", "life-fresh", mustKey(t), NodeUserPrefix+"life-fresh"), nil),
			wantAction: Deny, wantReason: attest.ReasonNoClientCertificate},
		{name: "renewal by the node with a service account token's credential ID", csr: jti(renewal("renew-9", "life-fresh")),
			wantAction: Deny, wantReason: attest.ReasonNoClientCertificate},
		{name: "renewal with a client certificate nodeproof never saw issued", csr: withCred(renewal("renew-10", "life-fresh"), never[:]),
			wantAction: Deny, wantReason: attest.ReasonNotCurrentOwner},
		{name: "renewal by the previous owner of a name that moved (its certificate from before)", csr: withCred(renewal("renew-11", "master-0"), m0A),
			wantAction: Deny, wantReason: attest.ReasonNotCurrentOwner, wantRecord: "rec-m0-b2"},
		{name: "renewal by the current owner of a name that moved", csr: renewal("renew-12", "master-0"),
			wantAction: Approve, wantReason: "NodeproofAttestedTPM", wantRecord: "rec-m0-b2"},
		{name: "serving, by the previous owner of a name that moved, with addresses it attested", csr: withCred(srv("srv-m0-a2", "master-0", nil, []net.IP{net.ParseIP("10.0.0.10")}), m0A),
			wantAction: Deny, wantReason: attest.ReasonNotCurrentOwner},
		{name: "serving, by the previous owner of a name that moved, with the owner's addresses", csr: withCred(srv("srv-m0-a3", "master-0", nil, []net.IP{net.ParseIP("10.0.0.20")}), m0A),
			wantAction: Deny, wantReason: attest.ReasonNotCurrentOwner},
		{name: "serving, without a client certificate credential", csr: withCred(servingCSR(t, "srv-14", "worker-1", nil, []net.IP{net.ParseIP("10.0.0.1")}), nil),
			wantAction: Deny, wantReason: attest.ReasonNoClientCertificate},
		{name: "renewal with the certificate of the kubelet of an earlier enrolment (enrolled again with a new key)", csr: withCred(renewal("renew-13", "worker-6"), w6old),
			wantAction: Deny, wantReason: attest.ReasonNotCurrentOwner},
		{name: "renewal with another node's certificate", csr: withCred(renewal("renew-14", "worker-2"), creds["worker-1"]),
			wantAction: Deny, wantReason: attest.ReasonNotCurrentOwner},
		// A node that is not attested gets no certificate, whoever asks.
		{name: "first client CSR of a revoked node, with its bootstrap token and bound key", csr: clientCSR(t, "csr-life-1", "life-revoked", lifeKeys["life-revoked"], "system:bootstrap:lifere"),
			wantAction: Deny, wantReason: attest.ReasonRevoked},
		{name: "first client CSR of a node whose last re-attestation failed, with its bootstrap token and bound key", csr: clientCSR(t, "csr-life-2", "life-failed", lifeKeys["life-failed"], "system:bootstrap:lifefa"),
			wantAction: Deny, wantReason: attest.ReasonAttestationFailed},
		{name: "first client CSR of a stale node, with its bound key", csr: clientCSR(t, "csr-life-3", "life-stale", lifeKeys["life-stale"], "system:serviceaccount:x:node-bootstrapper"),
			wantAction: Deny, wantReason: attest.ReasonAttestationStale},
		// A per-node bootstrap token asks for its own node only.
		{name: "a node's bootstrap token asks for another node's certificate, with that node's attested key", csr: clientCSR(t, "csr-tok-1", "worker-1", k1, "system:bootstrap:abcdef"),
			wantAction: Deny, wantReason: attest.ReasonTokenOtherNode},
		{name: "a node's bootstrap token asks for a name no identity owns", csr: clientCSR(t, "csr-tok-2", "stranger", mustKey(t), "system:bootstrap:abcdef"),
			wantAction: Deny, wantReason: attest.ReasonTokenOtherNode},
		{name: "a bootstrap token whose record expired asks for another node (left to the record checks)", csr: clientCSR(t, "csr-tok-3", "worker-1", mustKey(t), "system:bootstrap:old123"),
			wantAction: Deny, wantReason: attest.ReasonKeyNotAttested},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d.DenyUnattested = tc.deny
			dec, err := d.Decide(ctx, makeCSR(t, tc.csr))
			if err != nil {
				t.Fatal(err)
			}
			reached[checkOutcome(t, dec)] = true
			if tc.wantAction == Approve {
				if dec.Action != tc.wantAction || dec.Reason != tc.wantReason {
					t.Fatalf("decision %s %s (%s), want %s %s", dec.Action, dec.Reason, dec.Message, tc.wantAction, tc.wantReason)
				}
			} else {
				// Every CSR not approved is an attack row: a CSR an attacker
				// (or a confused kubelet) could submit.
				attacktable.Check(t, "approver", "CSR: "+tc.name, fmt.Sprintf("%s %s", tc.wantAction, tc.wantReason), fmt.Sprintf("%s %s", dec.Action, dec.Reason))
			}
			if tc.wantRecord != "" && dec.Record != tc.wantRecord {
				t.Errorf("record %q, want %q", dec.Record, tc.wantRecord)
			}
			if dec.Message == "" && dec.Reason != attest.ReasonNotKubelet {
				t.Error("no message")
			}
			if tc.wantConsume != "" {
				r, err := st.GetRecord(ctx, tc.wantConsume)
				if err != nil {
					t.Fatal(err)
				}
				if r.ConsumedAt == nil || r.ConsumedBy != tc.csr.name+"/uid-"+tc.csr.name {
					t.Errorf("record %s consumed by %q", r.ID, r.ConsumedBy)
				}
			}
		})
	}
	// Every decision of every rule is reached by a case here, but for those
	// that other tests reach: an extension (TestAttackCSRExtensions), a
	// request that does not parse (TestDecideMalformedRequest), a ban the
	// binding does not show yet (TestAttackBanNotYetInBinding).
	elsewhere := map[ruleOutcome]bool{
		{"a kubelet's CSR", attest.ReasonExtensionNotAllowed}:                   true,
		{"a kubelet's CSR", attest.ReasonBadCSR}:                                true,
		{"a first client certificate's key was attested", attest.ReasonRevoked}: true,
	}
	for _, r := range Rules() {
		for _, o := range r.Outcomes {
			if k := (ruleOutcome{r.Name, o.Reason}); !reached[k] && !elsewhere[k] {
				t.Errorf("rule %q: no case decides %s", r.Name, o.Reason)
			}
		}
	}
}

// TestDecideRace: many CSRs with the attested key at once: exactly one is
// approved, every other is denied as a second use.
func TestDecideRace(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	k := mustKey(t)
	if err := st.Enrol(ctx, &store.Record{ID: "rec", NodeName: "n", Kind: attest.KindTPM, Identity: "tpm-ek:n", KubeletKeySHA256: keyHash(t, k),
		CreatedAt: now, Expires: now.Add(time.Hour)}, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	d := &Decider{Store: st, Lineages: st, Tokens: st, Clock: clock}
	const n = 16
	var wg sync.WaitGroup
	results := make([]Decision, n)
	for i := range n {
		csr := makeCSR(t, clientCSR(t, "csr-"+string(rune('a'+i)), "n", k, "u"))
		wg.Add(1)
		go func() {
			defer wg.Done()
			dec, err := d.Decide(ctx, csr)
			if err != nil {
				t.Error(err)
			}
			results[i] = dec
		}()
	}
	wg.Wait()
	approved := 0
	for _, r := range results {
		switch {
		case r.Action == Approve:
			approved++
		case r.Action != Deny || r.Reason != attest.ReasonRecordConsumed:
			t.Errorf("decision %s %s", r.Action, r.Reason)
		}
	}
	if approved != 1 {
		t.Fatalf("%d CSRs approved with one attestation", approved)
	}
}

// TestDecideFresh: a denial decided on a cache (Store) a moment behind is
// decided again on the API server's state (Fresh), which stands: a
// re-enrolment with a new kubelet key the cache has not seen yet does not
// deny the node's CSR for good, and a true denial is still a denial.
func TestDecideFresh(t *testing.T) {
	ctx := context.Background()
	stale, fresh := openStore(t), openStore(t)
	oldKey, newKey := mustKey(t), mustKey(t)
	enrol := func(st store.Store, id string, key crypto.Signer) {
		t.Helper()
		if err := st.Enrol(ctx, &store.Record{ID: id, NodeName: "n", Kind: attest.KindTPM, Identity: "tpm-ek:n", KubeletKeySHA256: keyHash(t, key),
			CreatedAt: now, Expires: now.Add(time.Hour)}, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	enrol(stale, "rec-old", oldKey) // what the watch still shows
	enrol(fresh, "rec-new", newKey) // what the API server holds now
	csr := makeCSR(t, clientCSR(t, "csr-new", "n", newKey, "u"))

	if dec, err := (&Decider{Store: stale, Lineages: stale, Tokens: stale, Clock: clock}).Decide(ctx, csr); err != nil || dec.Action != Deny {
		t.Fatalf("on the stale state alone: %s %s, %v; want a denial (else this test shows nothing)", dec.Action, dec.Reason, err)
	}
	dec, err := (&Decider{Store: stale, Lineages: stale, Tokens: stale, Fresh: fresh, FreshLineages: fresh, Clock: clock}).Decide(ctx, csr)
	if err != nil || dec.Action != Approve || dec.Record != "rec-new" {
		t.Fatalf("with Fresh: %s %s (record %s), %v; want approved with rec-new", dec.Action, dec.Reason, dec.Record, err)
	}
	// Now consumed on both: a second CSR with that key is denied, on Fresh too.
	again := makeCSR(t, clientCSR(t, "csr-again", "n", newKey, "u"))
	dec, err = (&Decider{Store: fresh, Lineages: fresh, Tokens: fresh, Fresh: fresh, FreshLineages: fresh, Clock: clock}).Decide(ctx, again)
	if err != nil || dec.Action != Deny || dec.Reason != attest.ReasonRecordConsumed {
		t.Fatalf("a second CSR: %s %s, %v; want denied as consumed", dec.Action, dec.Reason, err)
	}
}

// ruleOutcome is a rule and a reason it gives.
type ruleOutcome struct {
	rule   string
	reason attest.Reason
}

// checkOutcome fails unless dec is one of the outcomes its rule lists
// (Rules: each rule's table row says every decision it makes), and
// returns it.
func checkOutcome(t *testing.T, dec Decision) ruleOutcome {
	t.Helper()
	for _, r := range Rules() {
		if r.Name != dec.Rule {
			continue
		}
		for _, o := range r.Outcomes {
			reason := dec.Reason
			if o.Action == Approve && strings.HasPrefix(string(reason), attest.ReasonAttestedPrefix) {
				reason = attest.ReasonAttestedPrefix
			}
			if o.Reason == reason && (o.Action == dec.Action || o.Action == Unattested && (dec.Action == Leave || dec.Action == Deny)) {
				return ruleOutcome{r.Name, o.Reason}
			}
		}
		t.Fatalf("rule %q decided %s %s, which its outcomes %v do not list", r.Name, dec.Action, dec.Reason, r.Outcomes)
	}
	t.Fatalf("decision %s %s names rule %q, which Rules does not have", dec.Action, dec.Reason, dec.Rule)
	return ruleOutcome{}
}

// bindingsBehind is a store whose binding reads are a moment behind, as a
// watch cache is (kubestore.Cached): Binding answers what was read before
// the test moved the store on.
type bindingsBehind struct {
	store.Store
	bindings map[string]*store.Binding
}

func (s *bindingsBehind) Binding(_ context.Context, node string) (*store.Binding, error) {
	if b, ok := s.bindings[node]; ok {
		return b, nil
	}
	return nil, store.ErrNotFound
}

// TestAttackBanNotYetInBinding: a machine banned a moment ago, whose
// binding the decision's cache still shows attested, asks for its first
// client certificate with the key its record bound: the store refuses to
// consume a banned identity's record, and the CSR is denied Revoked by
// the first-client rule (a ban written by hand before the server's watch
// revokes the binding).
func TestAttackBanNotYetInBinding(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	k := mustKey(t)
	if err := st.Enrol(ctx, &store.Record{ID: "rec-b", NodeName: "banned-0", Pool: "worker", Kind: attest.KindTPM, Identity: "tpm-ek:banned",
		KubeletKeySHA256: keyHash(t, k), CreatedAt: now.Add(-time.Minute), Expires: now.Add(time.Hour)}, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	before, err := st.Binding(ctx, "banned-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Ban(ctx, store.Ban{Identity: "tpm-ek:banned", Kind: attest.KindTPM, NodeName: "banned-0", At: now, By: "test"}); err != nil {
		t.Fatal(err)
	}
	d := &Decider{Store: &bindingsBehind{Store: st, bindings: map[string]*store.Binding{"banned-0": before}}, Lineages: st, Clock: clock}
	dec, err := d.Decide(ctx, makeCSR(t, clientCSR(t, "csr-banned", "banned-0", k, "system:serviceaccount:x:node-bootstrapper")))
	if err != nil {
		t.Fatal(err)
	}
	attacktable.Check(t, "approver", "CSR: a machine banned a moment ago, its binding not yet revoked in the approver's cache, asks for its first certificate",
		fmt.Sprintf("%s %s", Deny, attest.ReasonRevoked), fmt.Sprintf("%s %s", dec.Action, dec.Reason))
	if o := checkOutcome(t, dec); o.rule != "a first client certificate's key was attested" {
		t.Errorf("decided by %q, want the first-client rule (the cache's binding is attested)", o.rule)
	}
}

// TestDecideMalformedRequest: a kubelet signer's CSR whose request is not
// a CSR is left to another approver (denied with DenyUnattested), by the
// shape rule.
func TestDecideMalformedRequest(t *testing.T) {
	for _, deny := range []bool{false, true} {
		st := openStore(t)
		d := &Decider{Store: st, Lineages: st, Tokens: st, Clock: clock, DenyUnattested: deny}
		csr := makeCSR(t, clientCSR(t, "csr-junk", "worker-1", mustKey(t), "u"))
		csr.Spec.Request = []byte("-----BEGIN CERTIFICATE REQUEST-----\nnot base64\n-----END CERTIFICATE REQUEST-----\n")
		dec, err := d.Decide(context.Background(), csr)
		if err != nil {
			t.Fatal(err)
		}
		want := Leave
		if deny {
			want = Deny
		}
		if dec.Action != want || dec.Reason != attest.ReasonBadCSR {
			t.Fatalf("DenyUnattested %v: %s %s, want %s %s", deny, dec.Action, dec.Reason, want, attest.ReasonBadCSR)
		}
		checkOutcome(t, dec)
	}
}
