package approver

import (
	"context"
	"crypto"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/store"
)

// kubeletRequest submits a client CSR for node with key exactly as a
// kubelet does on its bootstrap path (client-go's certificate request
// code), as the user of cfg; it returns the CSR's name.
func kubeletRequest(t *testing.T, cfg *rest.Config, node string, key crypto.Signer) string {
	t.Helper()
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	data, err := cert.MakeCSR(key, &pkix.Name{Organization: []string{NodesGroup}, CommonName: NodeUserPrefix + node}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	name, _, err := csr.RequestCertificate(kc, data, "", SignerKubeletClient, nil,
		[]certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, key)
	if err != nil {
		t.Fatalf("request certificate for %s: %v", node, err)
	}
	return name
}

// waitDecided waits until the CSR has an Approved or Denied condition.
func waitDecided(t *testing.T, kc kubernetes.Interface, name string, timeout time.Duration) certv1.CertificateSigningRequestCondition {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c, err := kc.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cond := range c.Status.Conditions {
			if cond.Type == certv1.CertificateApproved || cond.Type == certv1.CertificateDenied {
				return cond
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("CSR %s undecided after %s", name, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitEvent waits for an event on the CSR with reason.
func waitEvent(t *testing.T, kc kubernetes.Interface, csrName string, reason Reason) *corev1.Event {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		evs, err := kc.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + csrName})
		if err != nil {
			t.Fatal(err)
		}
		for i := range evs.Items {
			if evs.Items[i].Reason == string(reason) {
				return &evs.Items[i]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event on CSR %s", reason, csrName)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metrics
				}
			}
			sum += value(m)
		}
	}
	return sum
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

// TestControllerOnAPIServer runs two approver replicas under leader
// election, as the service account of deploy/approver/rbac.yaml, against a
// real kube-apiserver with bootstrap token authentication; kubelets ask for
// certificates through client-go's bootstrap code.
func TestControllerOnAPIServer(t *testing.T) {
	cfg := clustertest.Start(t)
	ctx := context.Background()
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeproof"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.ApplyYAML(t, c, "../deploy/approver/rbac.yaml")
	kubetest.ApplyYAML(t, c, "../deploy/cluster/node-bootstrap-rbac.yaml")
	sa, err := kubernetes.NewForConfig(kubetest.AsServiceAccount(cfg, "nodeproof", "nodeproof-approver"))
	if err != nil {
		t.Fatal(err)
	}

	st := openStore(t)
	tokens, err := cluster.NewTokens(cluster.TokenOptions{Client: admin, Server: cfg.Host,
		CABundle: func(context.Context) ([]byte, error) { return cfg.CAData, nil }, Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	// attest writes what the server writes after a successful attestation
	// (a record, with a bootstrap token) and returns the kubelet's config.
	attestNode := func(id, node string, key crypto.Signer) *rest.Config {
		t.Helper()
		rec := &store.Record{ID: id, NodeName: node, Pool: "worker", Kind: attest.KindTPM, KubeletKeySHA256: keyHash(t, key),
			Summary: "tpm test", CreatedAt: time.Now(), Expires: time.Now().Add(time.Hour)}
		if err := tokens.Issue(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if err := st.CreateRecord(ctx, rec); err != nil {
			t.Fatal(err)
		}
		kubeconfig, err := tokens.Kubeconfig(ctx, rec)
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

	// Two replicas; count how many run at once.
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	log := new(testenv.LockedBuffer)
	var active, maxActive atomic.Int32
	var leaders sync.Map
	replica := func(identity string) (stop func()) {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- RunLeader(rctx, LeaderOptions{Client: sa, Namespace: "nodeproof", Identity: identity,
				LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond},
				func(lctx context.Context) {
					n := active.Add(1)
					defer active.Add(-1)
					for m := maxActive.Load(); n > m && !maxActive.CompareAndSwap(m, n); m = maxActive.Load() {
					}
					leaders.Store(identity, true)
					ctl, err := New(Options{Client: sa, Decider: &Decider{Store: st, Clock: time.Now}, Metrics: metrics,
						PerNodeRate: 2, PerNodeBurst: 3, Resync: 2 * time.Second, Clock: time.Now,
						Log: slog.New(slog.NewJSONHandler(log, nil)).With("replica", identity)})
					if err != nil {
						t.Error(err)
						return
					}
					if err := ctl.Run(lctx); err != nil {
						t.Errorf("%s: %v", identity, err)
					}
				})
		}()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", identity, err)
			}
		}
	}
	stopA := replica("replica-a")
	time.Sleep(time.Second) // a takes the lease first
	stopB := replica("replica-b")
	defer stopB()

	k1 := mustKey(t)
	kubelet1 := attestNode("rec-1", "worker-1", k1)

	t.Run("attested kubelet's bootstrap CSR is approved", func(t *testing.T) {
		name := kubeletRequest(t, kubelet1, "worker-1", k1)
		cond := waitDecided(t, admin, name, 30*time.Second)
		if cond.Type != certv1.CertificateApproved || cond.Reason != "NodeproofAttestedTPM" || !strings.Contains(cond.Message, "rec-1") {
			t.Fatalf("condition %s %s %q", cond.Type, cond.Reason, cond.Message)
		}
		waitEvent(t, admin, name, "NodeproofAttestedTPM")
		r, err := st.GetRecord(ctx, "rec-1")
		if err != nil || r.ConsumedAt == nil || !strings.HasPrefix(r.ConsumedBy, name+"/") {
			t.Fatalf("record not consumed by %s: %+v %v", name, r, err)
		}
	})

	t.Run("a second CSR with the consumed attestation is denied", func(t *testing.T) {
		name := kubeletRequest(t, kubelet1, "worker-1", k1)
		if cond := waitDecided(t, admin, name, 30*time.Second); cond.Type != certv1.CertificateDenied || cond.Reason != string(ReasonRecordConsumed) {
			t.Fatalf("condition %s %s", cond.Type, cond.Reason)
		}
	})

	t.Run("a swapped key is denied", func(t *testing.T) {
		k2 := mustKey(t)
		kubelet2 := attestNode("rec-2", "worker-2", k2)
		name := kubeletRequest(t, kubelet2, "worker-2", mustKey(t))
		if cond := waitDecided(t, admin, name, 30*time.Second); cond.Type != certv1.CertificateDenied || cond.Reason != string(ReasonKeyMismatch) {
			t.Fatalf("condition %s %s", cond.Type, cond.Reason)
		}
	})

	t.Run("another node's name from this token is denied", func(t *testing.T) {
		k3 := mustKey(t)
		attestNode("rec-3", "worker-3", k3)
		// worker-1's token asks for worker-3's certificate, even with the
		// right key: the record names another token.
		name := kubeletRequest(t, kubelet1, "worker-3", k3)
		if cond := waitDecided(t, admin, name, 30*time.Second); cond.Type != certv1.CertificateDenied || cond.Reason != string(ReasonRequesterMismatch) {
			t.Fatalf("condition %s %s", cond.Type, cond.Reason)
		}
	})

	t.Run("without attestation the CSR stays pending, with the reason visible", func(t *testing.T) {
		name := kubeletRequest(t, kubelet1, "worker-9", mustKey(t))
		ev := waitEvent(t, admin, name, ReasonNoAttestation)
		if ev.Type != corev1.EventTypeWarning {
			t.Errorf("event type %s", ev.Type)
		}
		got, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) != 0 {
			t.Fatalf("an unattested CSR was decided: %+v", got.Status.Conditions)
		}
	})

	t.Run("serving CSR with an unattested IP is denied", func(t *testing.T) {
		node := rest.CopyConfig(cfg)
		node.Impersonate = rest.ImpersonationConfig{UserName: "system:node:worker-1", Groups: []string{NodesGroup, "system:masters", "system:authenticated"}}
		nkc, err := kubernetes.NewForConfig(node)
		if err != nil {
			t.Fatal(err)
		}
		s := servingCSR(t, "serving-1", "worker-1", nil, nil)
		s.ips = append(s.ips, []byte{10, 9, 9, 9})
		obj := makeCSR(t, s)
		obj.UID, obj.CreationTimestamp = "", metav1.Time{}
		if _, err := nkc.CertificatesV1().CertificateSigningRequests().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if cond := waitDecided(t, admin, "serving-1", 30*time.Second); cond.Type != certv1.CertificateDenied || cond.Reason != string(ReasonSANNotAttested) {
			t.Fatalf("condition %s %s", cond.Type, cond.Reason)
		}
	})

	t.Run("a flood for one name does not hold up another", func(t *testing.T) {
		limitedBefore := metricValue(t, reg, "nodeproof_approver_rate_limited_total", nil)
		for i := range 40 {
			obj := makeCSR(t, clientCSR(t, fmt.Sprintf("flood-%02d", i), "flooded", mustKey(t), ""))
			obj.UID, obj.CreationTimestamp = "", metav1.Time{}
			if _, err := admin.CertificatesV1().CertificateSigningRequests().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		k4 := mustKey(t)
		kubelet4 := attestNode("rec-4", "worker-4", k4)
		start := time.Now()
		name := kubeletRequest(t, kubelet4, "worker-4", k4)
		if cond := waitDecided(t, admin, name, 30*time.Second); cond.Type != certv1.CertificateApproved {
			t.Fatalf("condition %s %s", cond.Type, cond.Reason)
		}
		t.Logf("approved in %s behind a flood of 40 CSRs for another name", time.Since(start).Round(time.Millisecond))
		if metricValue(t, reg, "nodeproof_approver_rate_limited_total", nil) <= limitedBefore {
			t.Error("the flood was not rate limited")
		}
	})

	t.Run("the other replica takes over when the leader stops", func(t *testing.T) {
		stopA()
		k5 := mustKey(t)
		kubelet5 := attestNode("rec-5", "worker-5", k5)
		name := kubeletRequest(t, kubelet5, "worker-5", k5)
		if cond := waitDecided(t, admin, name, 60*time.Second); cond.Type != certv1.CertificateApproved {
			t.Fatalf("condition %s %s", cond.Type, cond.Reason)
		}
		if _, ok := leaders.Load("replica-b"); !ok {
			t.Fatal("replica-b never led")
		}
	})

	if m := maxActive.Load(); m != 1 {
		t.Errorf("%d replicas ran at once", m)
	}
	// The metric is counted just after the approval is written: the test
	// may see the approval first.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		v := metricValue(t, reg, "nodeproof_approver_decisions_total", map[string]string{"action": "approve"})
		if v >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("approve decisions metric %v, want 3", v)
			break
		}
	}
	if v := metricValue(t, reg, "nodeproof_approver_decision_seconds", nil); v == 0 {
		t.Error("no decision latency observed")
	}
}
