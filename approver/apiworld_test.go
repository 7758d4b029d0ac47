package approver

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

// apiWorld is a real kube-apiserver with bootstrap token authentication
// and a kubelet signer (clustertest.StartSigning), the approver's RBAC
// (deploy/approver/rbac.yaml) and its service account, and the server's
// side: records, bindings and per-node bootstrap tokens written as the
// server writes them.
type apiWorld struct {
	t     *testing.T
	cfg   *rest.Config
	admin kubernetes.Interface
	// sa and saCfg are the approver's service account; approverStore is
	// the store through its own Role; st the server's (admin here: the
	// server's RBAC is tested in deploy/ and store/kubestore).
	sa            kubernetes.Interface
	saCfg         *rest.Config
	approverStore *kubestore.Store
	st            *kubestore.Store
	tokens        *cluster.Tokens
}

func newAPIWorld(t *testing.T) *apiWorld {
	t.Helper()
	cfg, _ := clustertest.StartSigning(t, "../deploy/crds")
	ctx := context.Background()
	w := &apiWorld{t: t, cfg: cfg}
	var err error
	if w.admin, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeproof"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.ApplyYAML(t, c, "../deploy/approver/rbac.yaml")
	kubetest.ApplyYAML(t, c, "../deploy/cluster/node-bootstrap-rbac.yaml")
	w.saCfg = kubetest.AsServiceAccount(cfg, "nodeproof", "nodeproof-approver")
	if w.sa, err = kubernetes.NewForConfig(w.saCfg); err != nil {
		t.Fatal(err)
	}
	saStoreClient, err := kubestore.NewClient(w.saCfg)
	if err != nil {
		t.Fatal(err)
	}
	if w.approverStore, err = kubestore.New(saStoreClient, "nodeproof", time.Now); err != nil {
		t.Fatal(err)
	}
	adminStoreClient, err := kubestore.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if w.st, err = kubestore.New(adminStoreClient, "nodeproof", time.Now); err != nil {
		t.Fatal(err)
	}
	// RBAC is evaluated from informers: wait until the approver may read
	// records and lineages, so the first decisions do not race the role
	// binding.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := w.approverStore.RecordsForNode(ctx, "probe")
		if err == nil {
			if _, err = w.approverStore.Lineage(ctx, "probe"); errors.Is(err, store.ErrNotFound) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the approver cannot read records and lineages 30 s after its RBAC was applied: %v", err)
		}
	}
	if w.tokens, err = cluster.NewTokens(cluster.TokenOptions{Client: w.admin, Server: cfg.Host,
		CABundle: func(context.Context) ([]byte, error) { return cfg.CAData, nil }, Clock: time.Now}); err != nil {
		t.Fatal(err)
	}
	// The node-bootstrap RBAC lets bootstrap tokens create CSRs; nodes
	// creating serving CSRs need a rule of their own here.
	if err := clustertest.NodesMayRequest(ctx, w.admin); err != nil {
		t.Fatal(err)
	}
	return w
}

// attestAs writes what the server writes after a successful attestation
// of identity for node (a record, with a bootstrap token; the binding) and
// returns the kubelet's bootstrap config.
func (w *apiWorld) attestAs(id, node, identity string, key crypto.Signer, addresses ...string) *rest.Config {
	t, ctx := w.t, context.Background()
	t.Helper()
	rec := &store.Record{ID: id, NodeName: node, Pool: "worker", Kind: attest.KindTPM, Identity: identity, KubeletKeySHA256: keyHash(t, key),
		Addresses: addresses, Summary: "tpm test", CreatedAt: time.Now(), Expires: time.Now().Add(time.Hour)}
	if err := w.tokens.Issue(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := w.tokens.Activate(ctx, rec); err != nil { // as the config's delivery does
		t.Fatal(err)
	}
	if err := w.st.Enrol(ctx, rec, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := w.tokens.Kubeconfig(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := clustertest.WaitWhoAmI(ctx, rc, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return rc
}

// attestNode is attestAs for the node's own identity, tpm-ek:<node>.
func (w *apiWorld) attestNode(id, node string, key crypto.Signer, addresses ...string) *rest.Config {
	w.t.Helper()
	return w.attestAs(id, node, "tpm-ek:"+node, key, addresses...)
}

// servingRequest creates a kubelet serving CSR as the node itself, with
// its kubelet's client certificate (nodeCfg).
func (w *apiWorld) servingRequest(nodeCfg *rest.Config, name, node string, dns []string, ips []net.IP) *certv1.CertificateSigningRequest {
	t := w.t
	t.Helper()
	nkc, err := kubernetes.NewForConfig(nodeCfg)
	if err != nil {
		t.Fatal(err)
	}
	obj := makeCSR(t, servingCSR(t, name, node, dns, ips))
	obj.UID, obj.CreationTimestamp = "", metav1.Time{}
	created, err := nkc.CertificatesV1().CertificateSigningRequests().Create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// renew makes a kubelet client CSR as the node, with its client
// certificate (nodeCfg), and returns it as created.
func (w *apiWorld) renew(t *testing.T, nodeCfg *rest.Config, node string, key crypto.Signer) *certv1.CertificateSigningRequest {
	t.Helper()
	name := kubeletRequest(t, nodeCfg, node, key)
	got, err := w.admin.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// decided waits for the CSR's decision: "Approved REASON" or "Denied REASON".
func (w *apiWorld) decided(t *testing.T, name string) string {
	t.Helper()
	cond := waitDecided(t, w.admin, name, 30*time.Second)
	return string(cond.Type) + " " + cond.Reason
}

// term runs one approver term as `nodeproof approve` does, as the
// approver's service account, until ctx ends: decisions on a watch of
// records, bindings and lineages (kubestore.Cached), denials decided again
// on the API (Fresh). o's Client, Decider and Clock are set here.
func (w *apiWorld) term(ctx context.Context, o Options) error {
	cached, err := kubestore.NewCached(w.saCfg, w.approverStore)
	if err != nil {
		return err
	}
	go cached.Start(ctx)
	if !cached.WaitForSync(ctx) {
		if ctx.Err() == nil {
			return fmt.Errorf("the approver's watch did not sync")
		}
		return nil
	}
	// Lineages written through a client of their own, as the command does.
	lc, err := kubestore.NewClient(w.saCfg)
	if err != nil {
		return err
	}
	lst, err := kubestore.New(lc, "nodeproof", time.Now)
	if err != nil {
		return err
	}
	lineages, err := cached.LineagesWith(lst)
	if err != nil {
		return err
	}
	o.Client, o.Clock = w.sa, time.Now
	o.Decider = &Decider{Store: cached, Fresh: w.approverStore, Lineages: lineages, FreshLineages: w.approverStore, Tokens: cached, Clock: time.Now}
	if o.Log == nil {
		o.Log = slog.New(slog.NewJSONHandler(new(testenv.LockedBuffer), nil))
	}
	ctl, err := New(o)
	if err != nil {
		return err
	}
	return ctl.Run(ctx)
}

// TestCSRAttacksOnAPIServer: what a machine can still get from the
// approver, on a real kube-apiserver, through real client certificates:
// after its name moved to another machine, after it was revoked, without
// its client certificate, and by flooding with its own bootstrap token.
func TestCSRAttacksOnAPIServer(t *testing.T) {
	w := newAPIWorld(t)
	// A machine banned by an IdentityBan applied by hand (GitOps), before
	// the approver starts (so its watch holds the ban): no server runs here
	// to revoke the binding from its watch, so the binding still says
	// attested, and only the store's refusal to consume the record stands
	// between the machine and a certificate.
	k9 := mustKey(t)
	kubelet9 := w.attestNode("rec-9", "worker-9", k9)
	banClient, err := kubestore.NewClient(w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := banClient.Create(context.Background(), &v1alpha1.IdentityBan{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.BanName("tpm-ek:worker-9"), Namespace: "nodeproof"},
		Spec:       v1alpha1.IdentityBanSpec{Identity: "tpm-ek:worker-9", At: metav1.NewMicroTime(time.Now()), By: "test", Reason: "disk stolen"},
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.term(ctx, Options{Resync: 2 * time.Second}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	cfg, admin, st := w.cfg, w.admin, w.st
	attestAs, attestNode, servingRequest, renew, decided := w.attestAs, w.attestNode, w.servingRequest, w.renew, w.decided

	t.Run("after a name moves, the previous owner's kubelet gets no certificate", func(t *testing.T) {
		// Machine A enrols as worker-6 and gets its client certificate ...
		kA, kB := mustKey(t), mustKey(t)
		name := kubeletRequest(t, attestAs("rec-6a", "worker-6", "tpm-ek:A", kA), "worker-6", kA)
		if got := decided(t, name); got != "Approved NodeproofAttestedTPM" {
			t.Fatalf("machine A's bootstrap CSR: %s", got)
		}
		oldKubelet, _ := kubeletConfig(t, admin, cfg, name, kA)
		// ... the operator releases the name and machine B enrols with it.
		if _, err := st.Release(ctx, "worker-6"); err != nil {
			t.Fatal(err)
		}
		name = kubeletRequest(t, attestAs("rec-6b", "worker-6", "tpm-ek:B", kB, "10.0.0.6"), "worker-6", kB)
		if got := decided(t, name); got != "Approved NodeproofAttestedTPM" {
			t.Fatalf("machine B's bootstrap CSR: %s", got)
		}
		newKubelet, _ := kubeletConfig(t, admin, cfg, name, kB)
		attacktable.Check(t, "approver", "on a real API server: the previous owner of a moved name renews its client certificate",
			"Denied "+string(attest.ReasonNotCurrentOwner), decided(t, renew(t, oldKubelet, "worker-6", mustKey(t)).Name))
		attacktable.Check(t, "approver", "on a real API server: the previous owner of a moved name asks for a serving certificate with the new owner's address",
			"Denied "+string(attest.ReasonNotCurrentOwner), decided(t, servingRequest(oldKubelet, "serving-6a", "worker-6", nil, []net.IP{net.ParseIP("10.0.0.6")}).Name))
		if got := decided(t, renew(t, newKubelet, "worker-6", mustKey(t)).Name); got != "Approved NodeproofAttestedTPM" {
			t.Fatalf("the new owner's renewal: %s", got)
		}
		if got := decided(t, servingRequest(newKubelet, "serving-6b", "worker-6", nil, []net.IP{net.ParseIP("10.0.0.6")}).Name); got != "Approved NodeproofAttestedTPM" {
			t.Fatalf("the new owner's serving CSR: %s", got)
		}
	})

	t.Run("a revoked node's first CSR, made with its bootstrap token, is denied", func(t *testing.T) {
		k7 := mustKey(t)
		kubelet7 := attestNode("rec-7", "worker-7", k7)
		if _, err := st.Revoke(ctx, "worker-7", "disk stolen", time.Now()); err != nil {
			t.Fatal(err)
		}
		attacktable.Check(t, "approver", "on a real API server: a revoked node's first client CSR, with its bootstrap token and its attested key",
			"Denied "+string(attest.ReasonRevoked), decided(t, kubeletRequest(t, kubelet7, "worker-7", k7)))
	})

	t.Run("a ban written by hand, before the binding shows it, denies the first CSR", func(t *testing.T) {
		attacktable.Check(t, "approver", "on a real API server: the first client CSR of a machine banned by hand (an IdentityBan applied with kubectl), before its binding is revoked",
			"Denied "+string(attest.ReasonRevoked), decided(t, kubeletRequest(t, kubelet9, "worker-9", k9)))
	})

	t.Run("a CSR as the node without its client certificate is denied", func(t *testing.T) {
		attestNode("rec-8", "worker-8", mustKey(t))
		imp := rest.CopyConfig(cfg)
		imp.Impersonate = rest.ImpersonationConfig{UserName: NodeUserPrefix + "worker-8", Groups: []string{NodesGroup, "system:authenticated"}}
		attacktable.Check(t, "approver", "on a real API server: a renewal as system:node:NAME made without a client certificate (impersonation)",
			"Denied "+string(attest.ReasonNoClientCertificate), decided(t, kubeletRequest(t, imp, "worker-8", mustKey(t))))
	})

	t.Run("2,000 junk CSRs from one machine's bootstrap token do not delay the victim", func(t *testing.T) {
		// The attacker: root on one enrolled machine, with its bootstrap
		// token; every CSR names the victim.
		kAtt, kVictim := mustKey(t), mustKey(t)
		attacker := rest.CopyConfig(attestNode("rec-att", "attacker", kAtt))
		attacker.QPS, attacker.Burst = 1000, 1000
		victim := attestNode("rec-victim", "victim", kVictim)
		akc, err := kubernetes.NewForConfig(attacker)
		if err != nil {
			t.Fatal(err)
		}
		junk := makeCSR(t, clientCSR(t, "", "victim", mustKey(t), "")).Spec.Request
		const flood, senders = 2000, 16
		var wg sync.WaitGroup
		var failed atomic.Int32
		start := time.Now()
		for w := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < flood; i += senders {
					obj := &certv1.CertificateSigningRequest{
						ObjectMeta: metav1.ObjectMeta{GenerateName: "junk-"},
						Spec: certv1.CertificateSigningRequestSpec{Request: junk, SignerName: SignerKubeletClient,
							Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}},
					}
					if _, err := akc.CertificatesV1().CertificateSigningRequests().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if n := failed.Load(); n > 0 {
			t.Fatalf("%d of %d junk CSRs were not created", n, flood)
		}
		t.Logf("%d junk CSRs created in %s", flood, time.Since(start).Round(time.Millisecond))

		// Now the victim's kubelet asks, behind all of them.
		start = time.Now()
		name := kubeletRequest(t, victim, "victim", kVictim)
		cond := waitDecided(t, admin, name, 60*time.Second)
		took := time.Since(start)
		t.Logf("MEASURED: the victim's CSR was approved %s after it was created, behind %d junk CSRs from another machine's token", took.Round(time.Millisecond), flood)
		if cond.Type != certv1.CertificateApproved {
			t.Fatalf("the victim's CSR: %s %s (%s)", cond.Type, cond.Reason, cond.Message)
		}
		// 2 s with margin for a busy 2-core machine (typically well under).
		const bound = 2 * time.Second
		got := fmt.Sprintf("approved within %s", bound)
		if took > bound {
			got = fmt.Sprintf("approved after %s", took.Round(100*time.Millisecond))
		}
		attacktable.Check(t, "approver", fmt.Sprintf("on a real API server: %d junk CSRs naming a victim from one enrolled machine's bootstrap token, then the victim's own CSR", flood),
			fmt.Sprintf("approved within %s", bound), got)

		// The junk is denied as what it is, at the attacker's own pace.
		l, err := admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		denied, approved := 0, 0
		for i := range l.Items {
			c := &l.Items[i]
			if c.Spec.Username != "system:bootstrap:"+tokenOf(t, st, "rec-att") {
				continue
			}
			for _, cond := range c.Status.Conditions {
				switch {
				case cond.Type == certv1.CertificateApproved:
					approved++
				case cond.Type == certv1.CertificateDenied && cond.Reason == string(attest.ReasonTokenOtherNode):
					denied++
				}
			}
		}
		t.Logf("%d junk CSRs denied %s so far, %d approved", denied, attest.ReasonTokenOtherNode, approved)
		if approved > 0 || denied == 0 {
			t.Fatalf("junk CSRs: %d approved, %d denied %s; want none approved and some denied", approved, denied, attest.ReasonTokenOtherNode)
		}
	})

}

// tokenOf is the bootstrap token ID of the record id.
func tokenOf(t *testing.T, st store.Store, id string) string {
	t.Helper()
	r, err := st.GetRecord(context.Background(), id)
	if err != nil || r.BootstrapTokenID == "" {
		t.Fatalf("record %s: %+v, %v", id, r, err)
	}
	return r.BootstrapTokenID
}
