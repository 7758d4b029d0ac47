package systemtest_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/systemtest"
)

// TestStatusClusterMode: each cluster-mode replica publishes what it
// judges by and serves in ConfigMap nodeproof-server-status, and
// `nodeproof status --kubeconfig` shows it per replica with the leader and
// the store, without Prometheus.
func TestStatusClusterMode(t *testing.T) {
	w := systemtest.New(t, "..", systemtest.Options{Cluster: true, NoExamples: true})
	ctx := context.Background()
	ensureNamespaces(t, w.KC, serve.DefaultStoreNamespace)
	if _, err := w.KC.CoreV1().ConfigMaps(serve.DefaultStoreNamespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: serve.ReplicaStatusConfigMap}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	log := new(testenv.LockedBuffer)
	sctx, cancel := context.WithCancel(ctx)
	ready, done := make(chan net.Addr, 1), make(chan error, 1)
	go func() {
		done <- serve.Run(sctx, serve.Config{
			Listen: "127.0.0.1", TLSMinVersion: "VersionTLS12",
			Kubeconfig: w.Admin, APIServerURL: w.Config.Host, TokenDir: w.TokenDir,
			CertStore: "state-dir", TokenStore: "file", Identity: "replica-a",
			Policy: w.PolicyFile, StateDir: filepath.Join(t.TempDir(), "state"), Hosts: []string{"127.0.0.1"},
			TokenTTL: 10 * time.Minute, Grace: time.Hour, Reload: time.Second, Clock: time.Now,
			LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
			Log:   slog.New(slog.NewJSONHandler(log, nil)),
			Ready: func(a, _ net.Addr) { ready <- a },
		})
	}()
	defer func() {
		cancel()
		<-done
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("serve: %v\n%s", err, log)
	case <-time.After(60 * time.Second):
		t.Fatalf("serve did not start\n%s", log)
	}
	var out string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		var o, e bytes.Buffer
		if code := cli.Run(ctx, []string{"status", "--kubeconfig", w.Admin}, &o, &e); code != 0 {
			t.Fatalf("nodeproof status: exit %d\n%s%s", code, o.String(), e.String())
		}
		if out = o.String(); strings.Contains(out, "replica:     replica-a") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodeproof status does not show the replica within 30 s:\n%s\n--- serve ---\n%s", out, log)
		}
	}
	for _, want := range []string{"leader:      none (no Lease", "policy:      " + w.PolicyFile + " version ", "reload:      no refusal stands", "serving:     [127.0.0.1]", "store:       kubernetes"} {
		if !strings.Contains(out, want) {
			t.Errorf("nodeproof status lacks %q:\n%s", want, out)
		}
	}
}
