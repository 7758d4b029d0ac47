package systemtest_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	"github.com/nodeproof/nodeproof/internal/faultproxy"
	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// approverCluster is a real API server with nodeproof's CRDs and the
// approver's RBAC from deploy/approver (and nothing else for it), the
// server's side of the store (admin) to write records with, and a kubelet
// signer that issues the certificates of approved CSRs
// (clustertest.StartSigning).
type approverCluster struct {
	cfg   *rest.Config
	admin kubernetes.Interface
	st    *kubestore.Store
}

func startApproverCluster(t *testing.T) *approverCluster {
	t.Helper()
	cfg, _ := clustertest.StartSigning(t, "../deploy/crds")
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeproof"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.ApplyYAML(t, c, "../deploy/approver/rbac.yaml")
	// Nodes create their CSRs (a cluster grants this to system:nodes).
	if err := clustertest.NodesMayRequest(ctx, admin); err != nil {
		t.Fatal(err)
	}
	sc, err := kubestore.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kubestore.New(sc, "nodeproof", time.Now)
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the authorizer has the approver's roles, so the approver
	// does not start into refusals (and their back-off).
	saStoreClient, err := kubestore.NewClient(kubetest.AsServiceAccount(cfg, "nodeproof", "nodeproof-approver"))
	if err != nil {
		t.Fatal(err)
	}
	saStore, err := kubestore.New(saStoreClient, "nodeproof", time.Now)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := saStore.RecordsForNode(ctx, "probe"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the approver cannot list records 30 s after its RBAC was applied: %v", err)
		}
	}
	return &approverCluster{cfg: cfg, admin: admin, st: st}
}

// kubeconfig writes a kubeconfig acting as the approver's service account,
// reaching the API server at host (empty: directly).
func (a *approverCluster) kubeconfig(t *testing.T, host string) string {
	t.Helper()
	cfg := rest.CopyConfig(a.cfg)
	if host != "" {
		cfg.Host = host
	}
	f := filepath.Join(t.TempDir(), "approver.kubeconfig")
	if err := clustertest.WriteKubeconfig(cfg, f, "nodeproof/nodeproof-approver"); err != nil {
		t.Fatal(err)
	}
	return f
}

// csrSpec is a kubelet CSR to create.
type csrSpec struct {
	name, node, signer string
	dns                []string
	ips                []net.IP
	// record, if set, is the ID of a NodeAttestation written for the CSR's
	// key (what a successful attestation leaves).
	record    string
	addresses []string
	// key, if set, is the CSR's key (else a new one).
	key *ecdsa.PrivateKey
}

// kubelet waits for the certificate issued for the client CSR name and
// returns a config authenticating with it and key, as the kubelet does.
func (a *approverCluster) kubelet(t *testing.T, name string, key *ecdsa.PrivateKey) *rest.Config {
	t.Helper()
	keyPEM, err := clustertest.KeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clustertest.KubeletConfig(context.Background(), a.admin, a.cfg, name, keyPEM, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// create makes the CSR's key, writes its record if any, and creates the
// CSR (a serving CSR as the node itself: with the client certificate its
// kubelet got for the record's key when there is a record, else
// impersonated).
func (a *approverCluster) create(t *testing.T, s csrSpec) {
	t.Helper()
	ctx := context.Background()
	key, err := s.key, error(nil)
	if key == nil {
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			t.Fatal(err)
		}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{Organization: []string{approver.NodesGroup}, CommonName: approver.NodeUserPrefix + s.node},
		DNSNames: s.dns, IPAddresses: s.ips,
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	if s.record != "" {
		pub, err := x509.MarshalPKIXPublicKey(key.Public())
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(pub)
		// What the server writes: an enrolment of the node's identity (a
		// later record for the same node is that identity's again).
		rec := &store.Record{ID: s.record, NodeName: s.node, Pool: "worker", Kind: attest.KindTPM, Identity: "tpm-ek:" + s.node,
			KubeletKeySHA256: sum[:], Addresses: s.addresses, Summary: "test",
			CreatedAt: time.Now(), Expires: time.Now().Add(time.Hour)}
		err = a.st.Enrol(ctx, rec, store.EnrolOptions{})
		if errors.Is(err, store.ErrIdentityEnrolled) {
			err = a.st.Enrol(ctx, rec, store.EnrolOptions{Again: true, ReplaceKey: true})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	usage := certv1.UsageClientAuth
	kc := a.admin
	if s.signer == approver.SignerKubeletServing {
		usage = certv1.UsageServerAuth
		node := rest.CopyConfig(a.cfg)
		node.Impersonate = rest.ImpersonationConfig{UserName: approver.NodeUserPrefix + s.node,
			Groups: []string{approver.NodesGroup, "system:masters", "system:authenticated"}}
		if s.record != "" {
			// The kubelet's client certificate first, for the record's key.
			a.create(t, csrSpec{name: s.name + "-client", node: s.node, signer: approver.SignerKubeletClient, key: key})
			node = a.kubelet(t, s.name+"-client", key)
		}
		if kc, err = kubernetes.NewForConfig(node); err != nil {
			t.Fatal(err)
		}
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader) // the serving key
		if err != nil {
			t.Fatal(err)
		}
		if der, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
			Subject:  pkix.Name{Organization: []string{approver.NodesGroup}, CommonName: approver.NodeUserPrefix + s.node},
			DNSNames: s.dns, IPAddresses: s.ips,
		}, key); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kc.CertificatesV1().CertificateSigningRequests().Create(ctx, &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: s.name},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: s.signer, Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, usage},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// decided waits until the CSR has an Approved or Denied condition and
// returns the CSR.
func (a *approverCluster) decided(t *testing.T, name string, timeout time.Duration) *certv1.CertificateSigningRequest {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		csr, err := a.admin.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range csr.Status.Conditions {
			if c.Type == certv1.CertificateApproved || c.Type == certv1.CertificateDenied {
				return csr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("CSR %s undecided after %s", name, timeout)
		}
	}
}

// scrape reads a Prometheus text exposition into series → value, the
// series written as the exposition writes it (labels sorted by name).
func scrape(t *testing.T, u string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET %s: %s, %s", u, resp.Status, resp.Header.Get("Content-Type"))
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// freeAddr returns a loopback address nothing listens on (for a flag that
// takes an address).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestApproveCommand runs `nodeproof approve --deny-unattested` through the
// command line, as the approver's service account under deploy/approver's
// RBAC on a real API server: its decisions, /healthz, and /metrics (the
// decisions by action and reason, the pending gauge, the per-node limit).
func TestApproveCommand(t *testing.T) {
	a := startApproverCluster(t)
	metricsAddr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	stderr := new(testenv.LockedBuffer)
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"approve",
			"--kubeconfig", a.kubeconfig(t, ""), "--store-namespace", "nodeproof",
			"--leader-elect-namespace", "nodeproof", "--leader-elect-id", "approver-cmd",
			"--metrics-addr", metricsAddr, "--deny-unattested",
			// One decision per node name, then one per 100 s: a second
			// CSR for a name stays pending for the whole test.
			"--per-node-rate", "0.01", "--per-node-burst", "1",
		}, io.Discard, stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("nodeproof approve exited %d\n%s", code, stderr)
		}
	})
	base := "http://" + metricsAddr

	// /healthz answers once the command listens.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
				t.Fatalf("/healthz: %s %q", resp.Status, body)
			}
			break
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("nodeproof approve exited %d\n%s", code, stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz: %v\n%s", err, stderr)
		}
	}
	if resp, err := http.Get(base + "/nothing"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /nothing: %v %v", resp, err)
	}

	for _, tc := range []struct {
		name       string
		csr        csrSpec
		wantType   certv1.RequestConditionType // "": stays pending
		wantReason attest.Reason
	}{
		{name: "attested client CSR is approved", csr: csrSpec{name: "attested", node: "worker-1", signer: approver.SignerKubeletClient, record: "rec-worker-1"},
			wantType: certv1.CertificateApproved, wantReason: "NodeproofAttestedTPM"},
		{name: "unattested client CSR is denied", csr: csrSpec{name: "unattested", node: "stranger", signer: approver.SignerKubeletClient},
			wantType: certv1.CertificateDenied, wantReason: attest.ReasonNoAttestation},
		{name: "serving CSR whose record attested no addresses is denied", csr: csrSpec{name: "serving-no-addresses", node: "worker-2",
			signer: approver.SignerKubeletServing, dns: []string{"worker-2"}, record: "rec-worker-2"},
			wantType: certv1.CertificateDenied, wantReason: attest.ReasonNoAddresses},
		{name: "serving CSR for an unattested name is denied", csr: csrSpec{name: "serving-no-record", node: "stranger-2",
			signer: approver.SignerKubeletServing, ips: []net.IP{net.ParseIP("10.0.0.9")}},
			wantType: certv1.CertificateDenied, wantReason: attest.ReasonNoAttestation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.create(t, tc.csr)
			csr := a.decided(t, tc.csr.name, 30*time.Second)
			var got []string
			for _, c := range csr.Status.Conditions {
				got = append(got, string(c.Type)+"/"+c.Reason)
			}
			if want := string(tc.wantType) + "/" + string(tc.wantReason); len(got) != 1 || got[0] != want {
				t.Fatalf("conditions %v, want exactly [%s]", got, want)
			}
		})
	}

	t.Run("another signer's CSR is not ours, even with --deny-unattested", func(t *testing.T) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "x"}}, key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.admin.CertificatesV1().CertificateSigningRequests().Create(ctx, &certv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: "other-signer"},
			Spec: certv1.CertificateSigningRequestSpec{Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
				SignerName: "example.com/other", Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// A CSR of ours created after it is decided: the approver has seen
		// both (its informer delivers them in order).
		a.create(t, csrSpec{name: "probe-signer", node: "probe", signer: approver.SignerKubeletClient})
		a.decided(t, "probe-signer", 30*time.Second)
		got, err := a.admin.CertificatesV1().CertificateSigningRequests().Get(ctx, "other-signer", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) != 0 {
			t.Fatalf("another signer's CSR was decided: %+v", got.Status.Conditions)
		}
	})

	t.Run("a second CSR for a name waits for the per-node limit", func(t *testing.T) {
		a.create(t, csrSpec{name: "stranger-again", node: "stranger", signer: approver.SignerKubeletClient})
		for deadline := time.Now().Add(20 * time.Second); scrape(t, base+"/metrics")["nodeproof_approver_rate_limited_total"] < 1; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the second CSR for stranger was not held by the per-node limit")
			}
		}
		got, err := a.admin.CertificatesV1().CertificateSigningRequests().Get(ctx, "stranger-again", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) != 0 {
			t.Fatalf("decided despite --per-node-rate 0.01: %+v", got.Status.Conditions)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		want := map[string]float64{
			// attested, serving-no-addresses-client (its kubelet's first).
			`nodeproof_approver_decisions_total{action="approve",reason="NodeproofAttestedTPM"}`: 2,
			`nodeproof_approver_decisions_total{action="deny",reason="NoAttestation"}`:           3, // unattested, serving-no-record, probe-signer
			`nodeproof_approver_decisions_total{action="deny",reason="NoAttestedAddresses"}`:     1,
			// stranger-again, held by the limit (other-signer is not ours).
			`nodeproof_approver_pending_csrs`:           1,
			`nodeproof_approver_decision_seconds_count`: 6,
		}
		// The gauge is recounted every 10 s.
		var got map[string]float64
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			got = scrape(t, base+"/metrics")
			ok := true
			for k, v := range want {
				ok = ok && got[k] == v
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				for k, v := range want {
					if got[k] != v {
						t.Errorf("%s = %v, want %v", k, got[k], v)
					}
				}
				t.FailNow()
			}
		}
		if _, ok := got[`nodeproof_approver_decisions_total{action="leave",reason="NoAttestation"}`]; ok {
			t.Error("with --deny-unattested, an unattested CSR was left pending")
		}
		if _, ok := got["go_goroutines"]; !ok {
			t.Error("no Go runtime metrics")
		}
	})
}

// approverProc is one `nodeproof approve` replica reaching the API server
// through its own fault proxy.
type approverProc struct {
	id    string
	proxy *faultproxy.Proxy
	log   *testenv.LockedBuffer
	done  chan error
}

// TestApproveLeaderFailover runs two approver replicas (cli.Approve, as in
// the command, under deploy/approver's RBAC) on a real API server, each
// through a TCP proxy. The leader's connection is cut, as in a partition or
// an API server blip: it cannot release the Lease, stops acting, and
// campaigns again in the same process; the other takes over only after the
// Lease expires. Then the roles swap back. Every CSR is approved exactly
// once (one Approved condition) and every record consumed once, by it.
func TestApproveLeaderFailover(t *testing.T) {
	a := startApproverCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const (
		leaseDuration = 6 * time.Second
		renewDeadline = 4 * time.Second
		retryPeriod   = 500 * time.Millisecond
	)
	u, err := url.Parse(a.cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	start := func(id string) *approverProc {
		p := &approverProc{id: id, proxy: faultproxy.New(t, u.Host), log: new(testenv.LockedBuffer), done: make(chan error, 1)}
		kubeconfig := a.kubeconfig(t, "https://"+p.proxy.Addr())
		go func() {
			p.done <- cli.Approve(ctx, cli.ApproveConfig{
				Kubeconfig: kubeconfig, StoreNamespace: "nodeproof",
				LeaderElect: true, LeaseNamespace: "nodeproof", Identity: id,
				LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
				QPS: 50, Burst: 100, Clock: time.Now, Log: slog.New(slog.NewJSONHandler(p.log, nil)).With("replica", id),
			})
		}()
		return p
	}
	running := func(p *approverProc) {
		t.Helper()
		select {
		case err := <-p.done:
			t.Fatalf("%s: cli.Approve returned (%v) while its context is live\n%s", p.id, err, p.log)
		default:
		}
	}
	holder := func() string {
		l, err := a.admin.CoordinationV1().Leases("nodeproof").Get(ctx, "nodeproof-approver", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	waitHolder := func(id string, timeout time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for deadline := start.Add(timeout); holder() != id; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the Lease is held by %q, not %s, %s later", holder(), id, timeout)
			}
		}
		return time.Since(start)
	}
	var all []csrSpec
	batch := func(prefix string, n int) []csrSpec {
		var b []csrSpec
		for i := range n {
			s := csrSpec{name: fmt.Sprintf("%s-%d", prefix, i), node: fmt.Sprintf("%s-node-%d", prefix, i),
				signer: approver.SignerKubeletClient, record: fmt.Sprintf("rec-%s-%d", prefix, i)}
			a.create(t, s)
			b = append(b, s)
		}
		all = append(all, b...)
		return b
	}
	approved := func(b []csrSpec, timeout time.Duration) {
		t.Helper()
		for _, s := range b {
			csr := a.decided(t, s.name, timeout)
			if c := csr.Status.Conditions[0]; c.Type != certv1.CertificateApproved {
				t.Fatalf("%s: %s %s %s", s.name, c.Type, c.Reason, c.Message)
			}
		}
	}

	pa := start("approver-a")
	waitHolder("approver-a", 60*time.Second)
	pb := start("approver-b")
	approved(batch("first", 3), 30*time.Second)

	// Cut the leader's connection right after a batch was created: some
	// of these may be in flight at a when it loses the Lease. The CSRs
	// created after the cut only b can approve.
	second := batch("second", 4)
	pa.proxy.Cut()
	cutAt := time.Now()
	second = append(second, batch("during", 3)...)
	took := time.Since(cutAt) + waitHolder("approver-b", 60*time.Second)
	t.Logf("approver-b took the Lease %s after approver-a's connection was cut", took.Round(time.Millisecond))
	// a could not release the Lease: b waited for it to expire (a renewed
	// at most retryPeriod before the cut).
	if took < leaseDuration-retryPeriod-time.Second {
		t.Errorf("approver-b took over %s after the cut, before the %s Lease could expire", took, leaseDuration)
	}
	approved(second, 60*time.Second)
	for i := range 3 {
		if want := fmt.Sprintf(`"csr":"during-%d"`, i); !strings.Contains(pb.log.String(), want) {
			t.Errorf("approver-b did not decide during-%d", i)
		}
	}
	// a stopped acting when its term ended, and is still running.
	for deadline := cutAt.Add(30 * time.Second); !strings.Contains(pa.log.String(), "approver stopped acting"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("approver-a did not log that it stopped acting\n%s", pa.log)
		}
	}
	running(pa)

	// a comes back as a follower; now b is cut off, and a, in the same
	// process, takes over again.
	if err := pa.proxy.Restore(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * retryPeriod)
	if h := holder(); h != "approver-b" {
		t.Fatalf("the Lease moved to %q when approver-a came back while approver-b held it", h)
	}
	third := batch("third", 3)
	pb.proxy.Cut()
	waitHolder("approver-a", 60*time.Second)
	approved(third, 60*time.Second)
	running(pa)
	running(pb)
	if n := strings.Count(pa.log.String(), `"msg":"approver leading"`); n != 2 {
		t.Errorf("approver-a led %d terms, want 2\n%s", n, pa.log)
	}
	if err := pb.proxy.Restore(); err != nil {
		t.Fatal(err)
	}

	// Exactly once: one Approved condition per CSR, no other decision,
	// each record consumed by its CSR.
	for _, s := range all {
		csr, err := a.admin.CertificatesV1().CertificateSigningRequests().Get(ctx, s.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(csr.Status.Conditions) != 1 || csr.Status.Conditions[0].Type != certv1.CertificateApproved {
			t.Errorf("%s: conditions %+v, want exactly one Approved", s.name, csr.Status.Conditions)
		}
		r, err := a.st.GetRecord(ctx, s.record)
		if err != nil {
			t.Fatal(err)
		}
		if want := s.name + "/" + string(csr.UID); r.ConsumedAt == nil || r.ConsumedBy != want {
			t.Errorf("record %s consumed by %q, want %q", s.record, r.ConsumedBy, want)
		}
	}

	cancel()
	for _, p := range []*approverProc{pa, pb} {
		select {
		case err := <-p.done:
			if err != nil {
				t.Errorf("%s: %v", p.id, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop", p.id)
		}
	}
}
