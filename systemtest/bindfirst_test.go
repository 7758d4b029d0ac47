package systemtest_test

import (
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
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/certs/kubecerts"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/systemtest"
)

// TestFaultServeCannotBind: a cluster-mode server whose port is taken
// (another server on it, a typo) fails before it does anything: it takes
// no Lease and writes no CA, serving certificate or provisioning token to
// the cluster, nor anything to its state directory but the directory.
func TestFaultServeCannotBind(t *testing.T) {
	w := systemtest.New(t, "..", systemtest.Options{Cluster: true, NoExamples: true})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The namespaces are there: a write, had it been tried, would land.
	ensureNamespaces(t, w.KC, serve.DefaultStoreNamespace, kubecerts.DefaultNamespace, cluster.TokenSecretNamespace)
	state := filepath.Join(t.TempDir(), "state")
	log := new(testenv.LockedBuffer)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = serve.Run(ctx, serve.Config{
		Listen: "127.0.0.1", SecurePort: ln.Addr().(*net.TCPAddr).Port, InsecurePort: 0, TLSMinVersion: "VersionTLS12",
		Kubeconfig: w.Admin, APIServerURL: w.Config.Host, TokenDir: w.TokenDir,
		Policy: w.PolicyFile, StateDir: state, Hosts: []string{"127.0.0.1"},
		CertsNamespace: kubecerts.DefaultNamespace, TokenSecretNamespace: cluster.TokenSecretNamespace,
		TokenTTL: 10 * time.Minute, Grace: time.Hour, Reload: time.Second, Clock: time.Now,
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		Log: slog.New(slog.NewJSONHandler(log, nil)),
	})
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("serve on a taken port: %v; want the bind's error", err)
	}
	var wrote []string
	if _, err := w.KC.CoordinationV1().Leases(serve.DefaultStoreNamespace).Get(ctx, cluster.KeeperLease, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		wrote = append(wrote, "the leader Lease")
	}
	if _, err := w.KC.CoreV1().ConfigMaps(kubecerts.DefaultNamespace).Get(ctx, kubecerts.CAName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		wrote = append(wrote, "the CA ConfigMap")
	}
	if _, err := w.KC.CoreV1().Secrets(cluster.TokenSecretNamespace).Get(ctx, cluster.TokenSecretName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		wrote = append(wrote, "the provisioning token Secret")
	}
	got := "wrote nothing"
	if len(wrote) > 0 {
		got = "wrote " + strings.Join(wrote, ", ")
	}
	attacktable.Check(t, "operator", "cluster-mode serve started on a port another process holds", "wrote nothing", got)
}

// ensureNamespaces creates the namespaces that do not exist yet.
func ensureNamespaces(t *testing.T, kc kubernetes.Interface, names ...string) {
	t.Helper()
	for _, ns := range names {
		_, err := kc.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("namespace %s: %v", ns, err)
		}
	}
}
