package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/store"
)

const examplesDir = "../../deploy/examples/bootstrap"

// One control plane for every subtest (starting one costs seconds); the
// subtests run in order and build on each other's objects.
func TestCluster(t *testing.T) {
	cfg := clustertest.Start(t)
	c, err := client.New(cfg, client.Options{Scheme: kubetest.Scheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfig
	kc, err := cs(cfg)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, cfg.CAData, 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("Watch", func(t *testing.T) { testWatch(t, cfg, c) })
	t.Run("Tokens", func(t *testing.T) { testTokens(t, cfg, kc, caFile) })
	t.Run("RBAC", func(t *testing.T) { testRBAC(t, cfg, c, caFile) })
}

// watcher runs Watch and collects what it reports.
type watcher struct {
	inputs chan *render.Inputs
	mu     sync.Mutex
	errs   []error
	done   chan error
	cancel context.CancelFunc
}

func startWatch(t *testing.T, cfg *rest.Config) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{inputs: make(chan *render.Inputs, 64), done: make(chan error, 1), cancel: cancel}
	go func() {
		w.done <- cluster.Watch(ctx, cfg, cluster.WatchOptions{
			OnInputs: func(in *render.Inputs) { w.inputs <- in },
			OnError: func(err error) {
				w.mu.Lock()
				w.errs = append(w.errs, err)
				w.mu.Unlock()
			},
			Debounce: 200 * time.Millisecond,
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-w.done:
			if err != nil {
				t.Errorf("Watch: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Watch did not return after its context ended")
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, err := range w.errs {
			t.Logf("Watch reported: %v", err)
		}
	})
	return w
}

// next waits for the next Inputs.
func (w *watcher) next(t *testing.T, timeout time.Duration) *render.Inputs {
	t.Helper()
	select {
	case in := <-w.inputs:
		return in
	case err := <-w.done:
		t.Fatalf("Watch returned: %v", err)
	case <-time.After(timeout):
		t.Fatalf("no inputs within %s", timeout)
	}
	return nil
}

// until waits for Inputs that ok accepts; it returns them.
func (w *watcher) until(t *testing.T, timeout time.Duration, ok func(*render.Inputs) error) *render.Inputs {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case in := <-w.inputs:
			if last = ok(in); last == nil {
				return in
			}
		case err := <-w.done:
			t.Fatalf("Watch returned: %v", err)
		case <-time.After(time.Until(deadline)):
		}
	}
	t.Fatalf("no acceptable inputs within %s; last: %v", timeout, last)
	return nil
}

func exampleKubeconfig(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../deploy/examples/bootstrap-kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newRenderer(t *testing.T, in *render.Inputs) *render.Renderer {
	t.Helper()
	r, err := render.NewRenderer(in, render.Options{BootstrapKubeconfig: exampleKubeconfig(t)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// sameServed compares everything two renderers serve: every pool, tier and
// version, bytes and errors.
func sameServed(got, want *render.Renderer) error {
	if !slices.Equal(got.Pools(), want.Pools()) {
		return fmt.Errorf("pools %v, want %v", got.Pools(), want.Pools())
	}
	for _, pool := range want.Pools() {
		for _, tier := range []render.Tier{render.TierPublic, render.TierFull} {
			for _, v := range render.SupportedVersions() {
				g, gerr := got.Config(pool, tier, v)
				w, werr := want.Config(pool, tier, v)
				if fmt.Sprint(gerr) != fmt.Sprint(werr) {
					return fmt.Errorf("%s/%s/%s: error %v, want %v", pool, tier, v, gerr, werr)
				}
				if !bytes.Equal(g, w) {
					return fmt.Errorf("%s/%s/%s: %d bytes differ from directory mode's %d", pool, tier, v, len(g), len(w))
				}
			}
		}
	}
	return nil
}

// directoryMode writes the cluster's objects, as the API server returns
// them, into an MCO bootstrap directory and loads it as directory mode
// does.
func directoryMode(t *testing.T, c client.Client) *render.Inputs {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	write := func(sub, name string, obj any) {
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(dir, sub), 0o700)
		if err := os.WriteFile(filepath.Join(dir, sub, name+".yaml"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	gv := mcfgv1.GroupVersion.String()
	var pools mcfgv1.MachineConfigPoolList
	var mcs mcfgv1.MachineConfigList
	var cc mcfgv1.ControllerConfig
	if err := c.List(ctx, &pools); err != nil {
		t.Fatal(err)
	}
	if err := c.List(ctx, &mcs); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: cluster.ControllerConfigName}, &cc); err != nil {
		t.Fatal(err)
	}
	for _, p := range pools.Items {
		p.APIVersion, p.Kind = gv, "MachineConfigPool"
		write("machine-pools", p.Name, p)
	}
	for _, m := range mcs.Items {
		m.APIVersion, m.Kind = gv, "MachineConfig"
		write("machine-configs", m.Name, m)
	}
	cc.APIVersion, cc.Kind = gv, "ControllerConfig"
	write("controller-config", render.ControllerConfigFile[:len(render.ControllerConfigFile)-len(".yaml")], cc)
	in, err := render.LoadBootstrapDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func testWatch(t *testing.T, cfg *rest.Config, c client.Client) {
	ctx := context.Background()
	w := startWatch(t, cfg)

	// Nothing in the cluster yet: the first inputs come at once, empty.
	start := time.Now()
	if in := w.next(t, 60*time.Second); len(in.PoolNames()) != 0 {
		t.Fatalf("inputs of an empty cluster have pools %v", in.PoolNames())
	}
	t.Logf("first (empty) inputs after %s", time.Since(start).Round(time.Millisecond))

	// The example objects: inputs arrive that serve exactly what directory
	// mode serves for the same objects, every pool, tier and version.
	clustertest.LoadExamples(t, examplesDir).Create(ctx, t, c)
	want := newRenderer(t, directoryMode(t, c))
	if err := want.Prerender(); err != nil {
		t.Logf("directory mode does not render everything (compared as errors): %v", err)
	}
	start = time.Now()
	w.until(t, 30*time.Second, func(in *render.Inputs) error { return sameServed(newRenderer(t, in), want) })
	t.Logf("inputs equal to directory mode's %s after the last object was written", time.Since(start).Round(time.Millisecond))

	// A pool's status moving (machine counts, as in a rollout) changes
	// nothing served: no new inputs.
	var worker mcfgv1.MachineConfigPool
	if err := c.Get(ctx, client.ObjectKey{Name: "worker"}, &worker); err != nil {
		t.Fatal(err)
	}
	worker.Status.MachineCount, worker.Status.ReadyMachineCount = 3, 3
	if err := c.Status().Update(ctx, &worker); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.inputs:
		t.Fatal("a pool's machine count changed and the inputs were rebuilt")
	case <-time.After(1500 * time.Millisecond):
	}

	// A MachineConfig changes: the change arrives.
	name, err := newRenderer(t, directoryMode(t, c)).RenderedConfigName("worker")
	if err != nil {
		t.Fatal(err)
	}
	var mc mcfgv1.MachineConfig
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &mc); err != nil {
		t.Fatal(err)
	}
	var ign map[string]any
	if err := json.Unmarshal(mc.Spec.Config.Raw, &ign); err != nil {
		t.Fatal(err)
	}
	storage := ign["storage"].(map[string]any)
	storage["files"] = append(storage["files"].([]any), map[string]any{
		"path": "/etc/nodeproof-updated", "mode": 420, "contents": map[string]any{"source": "data:,updated"},
	})
	if mc.Spec.Config.Raw, err = json.Marshal(ign); err != nil {
		t.Fatal(err)
	}
	if err := c.Update(ctx, &mc); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	in := w.until(t, 30*time.Second, func(in *render.Inputs) error {
		b, err := newRenderer(t, in).Config("worker", render.TierFull, render.V3_5)
		if err != nil {
			return err
		}
		if !bytes.Contains(b, []byte("/etc/nodeproof-updated")) {
			return errors.New("the worker config lacks the new file")
		}
		return nil
	})
	t.Logf("updated MachineConfig served after %s (debounce 200ms)", time.Since(start).Round(time.Millisecond))
	// And it is what directory mode serves for the cluster's objects now.
	if err := sameServed(newRenderer(t, in), newRenderer(t, directoryMode(t, c))); err != nil {
		t.Fatal(err)
	}

	// A pool goes: so does it from the inputs.
	if err := c.Delete(ctx, &mcfgv1.MachineConfigPool{ObjectMeta: metav1.ObjectMeta{Name: "master"}}); err != nil {
		t.Fatal(err)
	}
	w.until(t, 30*time.Second, func(in *render.Inputs) error {
		if slices.Contains(in.PoolNames(), "master") {
			return errors.New("master still there")
		}
		return nil
	})
}

// tokenConfig is the rest.Config a served kubeconfig makes.
func tokenConfig(t *testing.T, kubeconfig []byte) (*rest.Config, string) {
	t.Helper()
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		t.Fatalf("kubeconfig does not load: %v\n%s", err, kubeconfig)
	}
	return rc, rc.BearerToken
}

var tokenRE = regexp.MustCompile(`^([a-z0-9]{6})\.([a-z0-9]{16})$`)

func testTokens(t *testing.T, cfg *rest.Config, kc kubernetes.Interface, caFile string) {
	ctx := context.Background()
	now := time.Now()
	newTokens := func(clock func() time.Time) *cluster.Tokens {
		tok, err := cluster.NewTokens(cluster.TokenOptions{
			Client: kc, Server: cfg.Host, CABundle: cluster.MCOCABundle(kc, caFile), Clock: clock,
		})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	tokens := newTokens(time.Now)
	secrets := kc.CoreV1().Secrets("kube-system")

	// A record that expired an hour ago, issued by a server whose clock
	// was two hours behind: the Secret says so and the API server refuses
	// the token. (Issued first: once the later, valid token authenticates,
	// the API server's informer has seen this one too.)
	pastTokens := newTokens(func() time.Time { return now.Add(-2 * time.Hour) })
	expired := &store.Record{ID: "rec-expired", NodeName: "worker-0", Pool: "worker", Expires: now.Add(-time.Hour)}
	if err := pastTokens.Issue(ctx, expired); err != nil {
		t.Fatal(err)
	}
	if err := pastTokens.Activate(ctx, expired); err != nil {
		t.Fatal(err)
	}

	rec := &store.Record{ID: "rec-1", NodeName: "worker-1", Pool: "worker", Expires: now.Add(time.Hour)}
	if err := tokens.Issue(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[a-z0-9]{6}$`).MatchString(rec.BootstrapTokenID) {
		t.Fatalf("BootstrapTokenID %q", rec.BootstrapTokenID)
	}
	// Issue draws the token; nothing exists until the config's delivery
	// activates it, once.
	if _, err := secrets.Get(ctx, "bootstrap-token-"+rec.BootstrapTokenID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a token Secret exists before its activation: %v", err)
	}
	if d, err := tokens.Delivered(ctx, rec); err != nil || d {
		t.Fatalf("Delivered before Activate: %v, %v", d, err)
	}
	if err := tokens.Activate(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := tokens.Activate(ctx, rec); !errors.Is(err, store.ErrUsed) {
		t.Fatalf("a second Activate: %v, want store.ErrUsed (the config token's single use)", err)
	}
	if d, err := tokens.Delivered(ctx, rec); err != nil || !d {
		t.Fatalf("Delivered after Activate: %v, %v", d, err)
	}
	// Another record that drew the same ID (one in 2^31) is told so, not
	// taken for a second use.
	twin := &store.Record{ID: "rec-twin", NodeName: "worker-9", Pool: "worker", Expires: now.Add(time.Hour),
		BootstrapTokenID: rec.BootstrapTokenID, BootstrapTokenSecret: rec.BootstrapTokenSecret}
	if err := tokens.Activate(ctx, twin); !errors.Is(err, cluster.ErrTokenIDTaken) {
		t.Fatalf("Activate of a colliding ID: %v, want ErrTokenIDTaken", err)
	}
	s, err := secrets.Get(ctx, "bootstrap-token-"+rec.BootstrapTokenID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Type != corev1.SecretTypeBootstrapToken {
		t.Errorf("type %s", s.Type)
	}
	for k, want := range map[string]string{
		"token-id":                       rec.BootstrapTokenID,
		"expiration":                     rec.Expires.UTC().Format(time.RFC3339),
		"usage-bootstrap-authentication": "true",
		"auth-extra-groups":              "system:bootstrappers:nodeproof,system:bootstrappers:nodeproof:worker",
	} {
		if got := string(s.Data[k]); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if _, ok := s.Data["usage-bootstrap-signing"]; ok {
		t.Error("the token may sign cluster-info")
	}
	if d := string(s.Data["description"]); !strings.Contains(d, "nodeproof") || !strings.Contains(d, "worker-1") || !strings.Contains(d, "rec-1") {
		t.Errorf("description %q does not name nodeproof, the node and the record", d)
	}

	kubeconfig, err := tokens.Kubeconfig(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	// The kubeconfig is built from the secret the record carries in
	// memory (from the sealed config token), never read back: without it,
	// or with one of the wrong length, there is none.
	noSecret := *rec
	noSecret.BootstrapTokenSecret = ""
	if _, err := tokens.Kubeconfig(ctx, &noSecret); err == nil {
		t.Error("a kubeconfig was built for a record without its token's secret")
	}
	bad := *rec
	bad.BootstrapTokenSecret = "short"
	if _, err := tokens.Kubeconfig(ctx, &bad); err == nil {
		t.Error("a malformed secret built a kubeconfig")
	}
	// The MCS's kubeconfig shape: cluster "local", user and context
	// "kubelet", the configured URL and CA.
	kcfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if kcfg.CurrentContext != "kubelet" || kcfg.Contexts["kubelet"].Cluster != "local" || kcfg.Contexts["kubelet"].AuthInfo != "kubelet" {
		t.Errorf("kubeconfig contexts: %+v", kcfg.Contexts)
	}
	if cl := kcfg.Clusters["local"]; cl.Server != cfg.Host || !bytes.Equal(cl.CertificateAuthorityData, cfg.CAData) {
		t.Errorf("kubeconfig cluster: server %s, CA %d bytes; want %s and the API server's CA", cl.Server, len(cl.CertificateAuthorityData), cfg.Host)
	}
	rc, token := tokenConfig(t, kubeconfig)
	m := tokenRE.FindStringSubmatch(token)
	if m == nil || m[1] != rec.BootstrapTokenID || m[2] != string(s.Data["token-secret"]) {
		t.Fatalf("kubeconfig token %q is not <id>.<secret> of the record's token", token)
	}
	start := time.Now()
	u, err := clustertest.WaitWhoAmI(ctx, rc, 30*time.Second)
	if err != nil {
		t.Fatalf("the served kubeconfig does not authenticate: %v", err)
	}
	t.Logf("bootstrap token authenticated %s after it was created", time.Since(start).Round(time.Millisecond))
	if u.Username != "system:bootstrap:"+rec.BootstrapTokenID {
		t.Errorf("authenticated as %q", u.Username)
	}
	for _, g := range []string{"system:bootstrappers", "system:bootstrappers:nodeproof", "system:bootstrappers:nodeproof:worker", "system:authenticated"} {
		if !slices.Contains(u.Groups, g) {
			t.Errorf("groups %v lack %s", u.Groups, g)
		}
	}

	// The expired token: its Secret carries the past expiration, this
	// server will not build a kubeconfig with it, and the API server
	// refuses it.
	es, err := secrets.Get(ctx, "bootstrap-token-"+expired.BootstrapTokenID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(es.Data["expiration"]); got != expired.Expires.UTC().Format(time.RFC3339) {
		t.Errorf("expired token's expiration %s", got)
	}
	if _, err := tokens.Kubeconfig(ctx, expired); err == nil {
		t.Error("a kubeconfig was built with an expired token")
	}
	ekc, err := pastTokens.Kubeconfig(ctx, expired)
	if err != nil {
		t.Fatal(err)
	}
	erc, _ := tokenConfig(t, ekc)
	if _, err := clustertest.WhoAmI(ctx, erc); !apierrors.IsUnauthorized(err) {
		t.Errorf("an expired bootstrap token: %v, want Unauthorized", err)
	}

	// Refusals create nothing.
	before, _ := secrets.List(ctx, metav1.ListOptions{})
	for _, bad := range []*store.Record{
		{ID: "r", NodeName: "n", Pool: "pool.with.dots", Expires: now.Add(time.Hour)}, // not a valid group
		{ID: "r", NodeName: "n", Pool: "worker"},                                      // never expires
		{ID: "r", NodeName: "n", Pool: "worker", Expires: now.Add(-time.Minute)},      // expired
		{ID: "r", Pool: "worker", Expires: now.Add(time.Hour)},                        // no node
	} {
		if err := tokens.Issue(ctx, bad); err == nil || bad.BootstrapTokenID != "" {
			t.Errorf("Issue(%+v) = %v", bad, err)
		}
	}
	after, _ := secrets.List(ctx, metav1.ListOptions{})
	if len(after.Items) != len(before.Items) {
		t.Errorf("refused Issues created %d Secrets", len(after.Items)-len(before.Items))
	}

	// GC deletes the expired token and keeps the valid one.
	if n, err := tokens.GC(ctx); err != nil || n != 1 {
		t.Errorf("GC = %d, %v; want 1 deleted", n, err)
	}
	if _, err := secrets.Get(ctx, "bootstrap-token-"+expired.BootstrapTokenID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("expired token after GC: %v", err)
	}

	// Revoke deletes the token; the API server then refuses it.
	if err := tokens.Revoke(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.Get(ctx, "bootstrap-token-"+rec.BootstrapTokenID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("revoked token: %v", err)
	}
	if err := tokens.Revoke(ctx, rec); err != nil {
		t.Errorf("revoking twice: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := clustertest.WhoAmI(ctx, rc)
		if apierrors.IsUnauthorized(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a revoked token still authenticates: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d, err := tokens.Delivered(ctx, rec); err != nil || d {
		t.Errorf("a revoked token still counts as delivered: %v, %v", d, err)
	}
}

// The RBAC in deploy/cluster is enough: the watch and every token call run
// as a service account that has exactly it; and a node's token may create
// CSRs with deploy/cluster/node-bootstrap-rbac.yaml.
func testRBAC(t *testing.T, cfg *rest.Config, c client.Client, caFile string) {
	ctx := context.Background()
	for _, ns := range []string{"nodeproof", cluster.MCONamespace} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	kubetest.ApplyYAML(t, c, "../../deploy/cluster/rbac.yaml")
	kubetest.ApplyYAML(t, c, "../../deploy/cluster/node-bootstrap-rbac.yaml")

	sa := kubetest.AsServiceAccount(cfg, "nodeproof", "nodeproof-server")
	skc, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	// The impersonation is in force: nothing beyond the rules.
	if _, err := skc.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the service account lists Secrets in default: %v", err)
	}

	w := startWatch(t, sa)
	if in := w.next(t, 60*time.Second); !slices.Contains(in.PoolNames(), "worker") {
		t.Fatalf("watching as the service account: pools %v", in.PoolNames())
	}

	// The CA comes from the MCO's kubeconfig-data ConfigMap when there is
	// one, read as the service account.
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: cluster.KubeconfigDataConfigMap, Namespace: cluster.MCONamespace},
		BinaryData: map[string][]byte{cluster.KubeconfigDataCAKey: cfg.CAData},
	}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	ca := cluster.MCOCABundle(skc, filepath.Join(t.TempDir(), "no-such-ca.crt"))
	if got, err := ca(ctx); err != nil || !bytes.Equal(got, cfg.CAData) {
		t.Fatalf("CA from the ConfigMap: %v", err)
	}
	// The same through the watch the server keeps (list and watch of that
	// one ConfigMap), and a change to it is followed.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	cw := cluster.NewCABundleWatch(skc, filepath.Join(t.TempDir(), "no-such-ca.crt"))
	go cw.Run(wctx)
	for deadline := time.Now().Add(30 * time.Second); !cw.Synced(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the kubeconfig-data watch did not sync as the service account (list/watch of that ConfigMap)")
		}
	}
	if got, err := cw.Get(ctx); err != nil || !bytes.Equal(got, cfg.CAData) {
		t.Fatalf("CA from the watched ConfigMap: %v", err)
	}
	cm.BinaryData[cluster.KubeconfigDataCAKey] = []byte("rotated")
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got, _ := cw.Get(ctx); string(got) == "rotated" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch did not follow a change of kubeconfig-data")
		}
	}
	cm.BinaryData[cluster.KubeconfigDataCAKey] = cfg.CAData
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}

	tokens, err := cluster.NewTokens(cluster.TokenOptions{Client: skc, Server: cfg.Host, CABundle: ca, Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	rec := &store.Record{ID: "rec-rbac", NodeName: "worker-2", Pool: "worker", Expires: time.Now().Add(time.Hour)}
	if err := tokens.Issue(ctx, rec); err != nil {
		t.Fatalf("Issue as the service account: %v", err)
	}
	if err := tokens.Activate(ctx, rec); err != nil {
		t.Fatalf("Activate as the service account: %v", err)
	}
	kubeconfig, err := tokens.Kubeconfig(ctx, rec)
	if err != nil {
		t.Fatalf("Kubeconfig as the service account: %v", err)
	}
	if _, err := tokens.GC(ctx); err != nil {
		t.Fatalf("GC as the service account: %v", err)
	}

	// The node's token may create CSRs (system:node-bootstrapper), and no
	// more than that.
	rc, _ := tokenConfig(t, kubeconfig)
	if _, err := clustertest.WaitWhoAmI(ctx, rc, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	nkc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	for _, ra := range []struct {
		attrs authzv1.ResourceAttributes
		want  bool
	}{
		{authzv1.ResourceAttributes{Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Verb: "create"}, true},
		{authzv1.ResourceAttributes{Resource: "secrets", Verb: "get", Namespace: "kube-system"}, false},
		{authzv1.ResourceAttributes{Group: "machineconfiguration.openshift.io", Resource: "machineconfigs", Verb: "get"}, false},
	} {
		r, err := nkc.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra.attrs},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Allowed != ra.want {
			t.Errorf("node token may %s %s: %v, want %v", ra.attrs.Verb, ra.attrs.Resource, r.Status.Allowed, ra.want)
		}
	}

	if err := tokens.Revoke(ctx, rec); err != nil {
		t.Fatalf("Revoke as the service account: %v", err)
	}
}
