package approver

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
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
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/leader"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
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

// kubeletConfig waits for the certificate issued for the CSR name (the
// test's signer issues it once the CSR is approved) and returns the
// kubelet's config with it and key, authenticating as the node by its
// client certificate, and the certificate's SHA-256 (its credential ID).
func kubeletConfig(t *testing.T, kc kubernetes.Interface, base *rest.Config, name string, key *ecdsa.PrivateKey) (*rest.Config, []byte) {
	t.Helper()
	keyPEM, err := clustertest.KeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clustertest.KubeletConfig(context.Background(), kc, base, name, keyPEM, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(rc.CertData)
	sum := sha256.Sum256(block.Bytes)
	return rc, sum[:]
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
func waitEvent(t *testing.T, kc kubernetes.Interface, csrName string, reason attest.Reason) *corev1.Event {
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

// waitMetric waits until the metric (summed over series matching labels)
// equals want.
func waitMetric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string, want float64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := metricValue(t, reg, name, labels)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v after %s, want %v", name, labels, got, timeout, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// decisions is the decisions metric for one action and reason.
func decisions(t *testing.T, reg *prometheus.Registry, action Action, reason attest.Reason) float64 {
	t.Helper()
	return metricValue(t, reg, "nodeproof_approver_decisions_total", map[string]string{"action": string(action), "reason": string(reason)})
}

// pendingNow counts the kubelet CSRs with no Approved, Denied or Failed
// condition, as the API server has them.
func pendingNow(t *testing.T, kc kubernetes.Interface) int {
	t.Helper()
	l, err := kc.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := range l.Items {
		if ours(&l.Items[i]) && pending(&l.Items[i]) {
			n++
		}
	}
	return n
}

// TestControllerOnAPIServer runs two approver replicas under leader
// election against a real kube-apiserver with bootstrap token
// authentication, as the service account of deploy/approver/rbac.yaml and
// with nothing else: the CSR calls, the Lease, the NodeAttestation
// records and the certificate lineages (the Kubernetes store, read from
// the approver's watch as `nodeproof approve` does, consumed and written
// through the approver's own Role) all go through its RBAC, so a missing
// permission fails the test. The records are written as the server
// writes them; kubelets ask for certificates through client-go's
// bootstrap code, a signer issues the approved ones from the API server's
// client CA (clustertest.StartSigning), and kubelets then authenticate
// with them, so the CSRs they make themselves carry the credential ID the
// API server records.
func TestControllerOnAPIServer(t *testing.T) {
	w := newAPIWorld(t)
	ctx, cfg, admin, st := context.Background(), w.cfg, w.admin, w.st
	attestNode, servingRequest := w.attestNode, w.servingRequest

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
			done <- leader.Run(rctx, leader.Options{Client: w.sa, Namespace: "nodeproof", Name: "nodeproof-approver", Role: "approver", Identity: identity,
				// A leader renews every RetryPeriod and has RenewDeadline to
				// get one through: generous, so a leader on a loaded machine
				// (a slow API server) keeps the lease mid-subtest; stopping
				// one releases it, so the takeover below is quick anyway.
				LeaseDuration: 30 * time.Second, RenewDeadline: 20 * time.Second, RetryPeriod: 500 * time.Millisecond},
				func(lctx context.Context) {
					n := active.Add(1)
					defer active.Add(-1)
					for m := maxActive.Load(); n > m && !maxActive.CompareAndSwap(m, n); m = maxActive.Load() {
					}
					leaders.Store(identity, true)
					if err := w.term(lctx, Options{Metrics: metrics, PerNodeRate: 2, PerNodeBurst: 3, Resync: 2 * time.Second,
						Log: slog.New(slog.NewJSONHandler(log, nil)).With("replica", identity)}); err != nil {
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
	// a takes the lease first (waited for, not slept for: on a loaded
	// machine a second may not be enough).
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, ok := leaders.Load("replica-a"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("replica-a did not take the lease within a minute")
		}
	}
	stopB := replica("replica-b")
	defer stopB()

	// expectDecision waits for the CSR's condition and for the decisions
	// metric to count it under its reason (it is counted just after the
	// condition is written: the test may see the condition first).
	expectDecision := func(t *testing.T, name string, action Action, reason attest.Reason, before float64) certv1.CertificateSigningRequestCondition {
		t.Helper()
		cond := waitDecided(t, admin, name, 30*time.Second)
		wantType := certv1.CertificateApproved
		if action == Deny {
			wantType = certv1.CertificateDenied
		}
		if cond.Type != wantType || cond.Reason != string(reason) {
			t.Fatalf("condition %s %s (%s), want %s %s", cond.Type, cond.Reason, cond.Message, wantType, reason)
		}
		waitMetric(t, reg, "nodeproof_approver_decisions_total", map[string]string{"action": string(action), "reason": string(reason)}, before+1, 10*time.Second)
		return cond
	}

	k1 := mustKey(t)
	kubelet1 := attestNode("rec-1", "worker-1", k1, "10.0.0.1", "worker-1.example.com")
	var node1 *rest.Config // worker-1's kubelet, with its client certificate
	var node1Cert []byte

	t.Run("attested kubelet's bootstrap CSR is approved", func(t *testing.T) {
		before := decisions(t, reg, Approve, "NodeproofAttestedTPM")
		name := kubeletRequest(t, kubelet1, "worker-1", k1)
		cond := expectDecision(t, name, Approve, "NodeproofAttestedTPM", before)
		if !strings.Contains(cond.Message, "rec-1") {
			t.Errorf("the approval does not name the record: %q", cond.Message)
		}
		r, err := st.GetRecord(ctx, "rec-1")
		if err != nil || r.ConsumedAt == nil || !strings.HasPrefix(r.ConsumedBy, name+"/") {
			t.Fatalf("record not consumed by %s: %+v %v", name, r, err)
		}
		node1, node1Cert = kubeletConfig(t, admin, cfg, name, k1)
	})

	t.Run("a second CSR with the consumed attestation is denied", func(t *testing.T) {
		before := decisions(t, reg, Deny, attest.ReasonRecordConsumed)
		expectDecision(t, kubeletRequest(t, kubelet1, "worker-1", k1), Deny, attest.ReasonRecordConsumed, before)
	})

	k2 := mustKey(t)
	kubelet2 := attestNode("rec-2", "worker-2", k2)
	t.Run("a swapped key is denied", func(t *testing.T) {
		before := decisions(t, reg, Deny, attest.ReasonKeyNotAttested)
		expectDecision(t, kubeletRequest(t, kubelet2, "worker-2", mustKey(t)), Deny, attest.ReasonKeyNotAttested, before)
	})

	t.Run("another node's name from this token is denied", func(t *testing.T) {
		k3 := mustKey(t)
		attestNode("rec-3", "worker-3", k3)
		// worker-1's token asks for worker-3's certificate, even with the
		// right key: the token was issued for worker-1.
		before := decisions(t, reg, Deny, attest.ReasonTokenOtherNode)
		expectDecision(t, kubeletRequest(t, kubelet1, "worker-3", k3), Deny, attest.ReasonTokenOtherNode, before)
	})

	t.Run("without attestation the CSR stays pending, with the reason visible", func(t *testing.T) {
		before := decisions(t, reg, Leave, attest.ReasonNoAttestation)
		// A requester no record names (a shared bootstrap credential).
		name := kubeletRequest(t, cfg, "worker-9", mustKey(t))
		ev := waitEvent(t, admin, name, attest.ReasonNoAttestation)
		if ev.Type != corev1.EventTypeWarning {
			t.Errorf("event type %s", ev.Type)
		}
		waitMetric(t, reg, "nodeproof_approver_decisions_total", map[string]string{"action": string(Leave), "reason": string(attest.ReasonNoAttestation)}, before+1, 10*time.Second)
		got, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) != 0 {
			t.Fatalf("an unattested CSR was decided: %+v", got.Status.Conditions)
		}
	})

	t.Run("serving CSR with an unattested IP is denied", func(t *testing.T) {
		before := decisions(t, reg, Deny, attest.ReasonSANNotAttested)
		servingRequest(node1, "serving-1", "worker-1", nil, []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("10.9.9.9")})
		expectDecision(t, "serving-1", Deny, attest.ReasonSANNotAttested, before)
	})

	t.Run("serving CSR with attested SANs is approved", func(t *testing.T) {
		before := decisions(t, reg, Approve, "NodeproofAttestedTPM")
		servingRequest(node1, "serving-2", "worker-1", []string{"worker-1.example.com"}, []net.IP{net.ParseIP("10.0.0.1")})
		expectDecision(t, "serving-2", Approve, "NodeproofAttestedTPM", before)
	})

	t.Run("serving CSR whose record attested no addresses stays pending", func(t *testing.T) {
		// worker-2's record (TPM through a vendor CA: no inventory
		// addresses) cannot vouch for SANs: another approver may.
		// worker-2's kubelet, with the right key this time.
		name := kubeletRequest(t, kubelet2, "worker-2", k2)
		if cond := waitDecided(t, admin, name, 30*time.Second); cond.Type != certv1.CertificateApproved {
			t.Fatalf("worker-2's bootstrap CSR: %s %s", cond.Type, cond.Reason)
		}
		node2, _ := kubeletConfig(t, admin, cfg, name, k2)
		before := decisions(t, reg, Leave, attest.ReasonNoAddresses)
		servingRequest(node2, "serving-3", "worker-2", []string{"worker-2"}, []net.IP{net.ParseIP("10.0.0.2")})
		ev := waitEvent(t, admin, "serving-3", attest.ReasonNoAddresses)
		if ev.Type != corev1.EventTypeWarning {
			t.Errorf("event type %s", ev.Type)
		}
		waitMetric(t, reg, "nodeproof_approver_decisions_total", map[string]string{"action": string(Leave), "reason": string(attest.ReasonNoAddresses)}, before+1, 10*time.Second)
		got, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, "serving-3", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) != 0 {
			t.Fatalf("a serving CSR without attested addresses was decided: %+v", got.Status.Conditions)
		}
	})

	t.Run("the pending gauge counts the undecided kubelet CSRs", func(t *testing.T) {
		// worker-9's client CSR and serving-3.
		if n := pendingNow(t, admin); n != 2 {
			t.Fatalf("%d pending kubelet CSRs on the API server, want 2", n)
		}
		waitMetric(t, reg, "nodeproof_approver_pending_csrs", nil, 2, 10*time.Second)
	})

	renew, decided := w.renew, w.decided

	t.Run("a renewal names the kubelet's certificate and is approved; the renewed certificate renews again", func(t *testing.T) {
		kr := mustKey(t)
		c := renew(t, node1, "worker-1", kr)
		// What the API server records (KEP-4193), checked on this
		// kube-apiserver rather than assumed.
		want := "X509SHA256=" + hex.EncodeToString(node1Cert)
		if got := c.Spec.Extra[CredentialIDKey]; len(got) != 1 || got[0] != want || c.Spec.Username != NodeUserPrefix+"worker-1" {
			t.Fatalf("the CSR's requester %q, extra %v; want system:node:worker-1 with %s", c.Spec.Username, c.Spec.Extra, want)
		}
		if got := decided(t, c.Name); got != "Approved NodeproofAttestedTPM" {
			t.Fatalf("the renewal: %s", got)
		}
		renewed, _ := kubeletConfig(t, admin, cfg, c.Name, kr)
		if got := decided(t, renew(t, renewed, "worker-1", mustKey(t)).Name); got != "Approved NodeproofAttestedTPM" {
			t.Fatalf("the renewal made with the renewed certificate: %s", got)
		}
		if v := metricValue(t, reg, "nodeproof_approver_certificates_recorded_total", nil); v < 2 {
			t.Errorf("%v certificates recorded, want at least worker-1's first and its renewal", v)
		}
	})

	t.Run("a flood for one name does not hold up another", func(t *testing.T) {
		const flood = 40
		limitedBefore := metricValue(t, reg, "nodeproof_approver_rate_limited_total", nil)
		leftBefore := decisions(t, reg, Leave, attest.ReasonNoAttestation)
		for i := range flood {
			obj := makeCSR(t, clientCSR(t, fmt.Sprintf("flood-%02d", i), "flooded", mustKey(t), ""))
			obj.UID, obj.CreationTimestamp = "", metav1.Time{}
			if _, err := admin.CertificatesV1().CertificateSigningRequests().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// The flood is being limited (2 a second, bursts of 3: its 40
		// CSRs take about 19 s to be seen once each) ...
		for deadline := time.Now().Add(20 * time.Second); metricValue(t, reg, "nodeproof_approver_rate_limited_total", nil) <= limitedBefore; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the flood was not rate limited")
			}
		}
		// ... while another node's CSR is approved within a bound well
		// under the flood's drain time.
		const bound = 8 * time.Second
		k4 := mustKey(t)
		kubelet4 := attestNode("rec-4", "worker-4", k4)
		start := time.Now()
		name := kubeletRequest(t, kubelet4, "worker-4", k4)
		cond := waitDecided(t, admin, name, bound)
		took := time.Since(start)
		if cond.Type != certv1.CertificateApproved {
			t.Fatalf("condition %s %s", cond.Type, cond.Reason)
		}
		seen := decisions(t, reg, Leave, attest.ReasonNoAttestation) - leftBefore
		limitedAt := metricValue(t, reg, "nodeproof_approver_rate_limited_total", nil)
		t.Logf("approved in %s while %v of %d flood CSRs had been decided", took.Round(time.Millisecond), seen, flood)
		if seen >= flood {
			t.Fatalf("all %d flood CSRs were decided before worker-4's was approved: the limit was not in the way", flood)
		}
		// The flood is still being limited after the approval.
		for deadline := time.Now().Add(5 * time.Second); metricValue(t, reg, "nodeproof_approver_rate_limited_total", nil) <= limitedAt; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the flood stopped being limited when worker-4 was approved")
			}
		}
		// Every flood CSR is eventually seen (left pending, one event
		// each), and the gauge counts them. The limit drains the flood in
		// about 19 s on an idle machine; with the CPUs busy (two hogs
		// beside the suite) 31 of 40 were seen after 40 s: the deadline
		// is for a lost CSR, not for a slow machine.
		waitMetric(t, reg, "nodeproof_approver_decisions_total", map[string]string{"action": string(Leave), "reason": string(attest.ReasonNoAttestation)}, leftBefore+flood, 3*time.Minute)
		waitMetric(t, reg, "nodeproof_approver_pending_csrs", nil, float64(2+flood), 10*time.Second)
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
	if v := metricValue(t, reg, "nodeproof_approver_decision_seconds", nil); v == 0 {
		t.Error("no decision latency observed")
	}
}
