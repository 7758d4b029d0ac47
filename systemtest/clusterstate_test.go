package systemtest_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vincent-petithory/dataurl"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/certs/kubecerts"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/pointer"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/mcs/userdata"
	"github.com/nodeproof/nodeproof/pemcert"
	"github.com/nodeproof/nodeproof/systemtest"
)

// offsetClock is the wall clock moved forward by an offset the test sets:
// schedules still run in real time, and years pass in an instant.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) Advance(d time.Duration) { c.off.Add(int64(d)) }

// replicaSet is several `nodeproof serve` replicas in cluster mode with
// the certificates and tokens kept in the cluster (the defaults).
type replicaSet struct {
	urls       []string
	kubeconfig string // admin
	logs       []*testenv.LockedBuffer
	kc         kubernetes.Interface
	clk        *offsetClock
}

// startReplicas prepares a cluster (a world's, with the user-data and
// token Secret namespaces and an installer's <role>-user-data Secret) and
// starts n replicas.
func startReplicas(t *testing.T, n int, edit func(*serve.Config)) *replicaSet {
	t.Helper()
	w := systemtest.New(t, "..", systemtest.Options{Cluster: true,
		Policy: func(*systemtest.World) *policytest.Builder { return clusterStatePolicy() }})
	kc, ctx := w.KC, context.Background()
	for _, ns := range []string{userdata.DefaultNamespace, cluster.TokenSecretNamespace} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	rs := &replicaSet{kc: kc, clk: &offsetClock{}, kubeconfig: w.Admin}
	ports := make([]int, n)
	for i := range ports {
		ports[i] = testenv.FreePort(t)
	}
	// The installer's master-user-data: a pointer with a CA and token of
	// its day, which the leader must bring up to date.
	stale, err := pointer.Build(pointer.Options{URL: fmt.Sprintf("https://127.0.0.1:%d/config/master", ports[0]),
		CABundle: selfSignedBundle(t), Token: "aW5zdGFsbGVyLXRva2Vu"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Secrets(userdata.DefaultNamespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "master" + userdata.InstallerSuffix},
		Data: map[string][]byte{userdata.UserDataKey: stale, "disableTemplating": []byte("true")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	ready := make(chan int, n)
	for i := range n {
		log := new(testenv.LockedBuffer)
		rs.logs = append(rs.logs, log)
		rs.urls = append(rs.urls, fmt.Sprintf("https://127.0.0.1:%d", ports[i]))
		sc := serve.Config{
			Listen: "127.0.0.1", SecurePort: ports[i], TLSMinVersion: "VersionTLS12",
			Kubeconfig: rs.kubeconfig, APIServerURL: w.Config.Host, TokenDir: w.TokenDir, StoreNamespace: systemtest.Namespace,
			UserDataURL: rs.urls[0], UserDataNamespace: userdata.DefaultNamespace, UserDataRoles: map[string]string{"master": "master", "worker": "worker"},
			Policy: w.PolicyFile, StateDir: filepath.Join(dir, fmt.Sprint("state-", i)), Hosts: []string{"127.0.0.1"},
			Identity: fmt.Sprint("replica-", i), LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond,
			TokenTTL: 10 * time.Minute, Grace: time.Hour, Reload: 300 * time.Millisecond, Clock: rs.clk.Now,
			Log:   slog.New(slog.NewJSONHandler(log, nil)),
			Ready: func(net.Addr, net.Addr) { ready <- i },
		}
		if edit != nil {
			edit(&sc)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := serve.Run(sctx, sc); err != nil && sctx.Err() == nil {
				t.Errorf("replica %d: %v\n%s", i, err, log)
			}
		}()
	}
	for range n {
		select {
		case <-ready:
		case <-time.After(60 * time.Second):
			t.Fatalf("the replicas did not start\n%s", rs.allLogs())
		}
	}
	return rs
}

func (rs *replicaSet) allLogs() string {
	var b strings.Builder
	for i, l := range rs.logs {
		fmt.Fprintf(&b, "--- replica %d\n%s", i, l)
	}
	return b.String()
}

func selfSignedBundle(t *testing.T) []byte {
	t.Helper()
	f, _, err := certs.Next(nil, func(n string) string { return n }, "", certs.Options{Clock: time.Now, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	return f[certs.CABundleFileName]
}

// machine is a pointer config as a machine was given it: the bundle it
// trusts and the token it presents.
type machine struct {
	name   string
	bundle []byte
	token  string
}

// userDataMachine reads role's user-data Secret (managed, or the
// installer's) as a new machine would be given it.
func (rs *replicaSet) userDataMachine(t *testing.T, name, secret string) machine {
	t.Helper()
	var sec *corev1.Secret
	eventually(t, 30*time.Second, secret+" exists", func() bool {
		var err error
		sec, err = rs.kc.CoreV1().Secrets(userdata.DefaultNamespace).Get(context.Background(), secret, metav1.GetOptions{})
		return err == nil
	}, rs.allLogs)
	ca, tok, err := parsePointer(sec.Data[userdata.UserDataKey])
	if err != nil {
		t.Fatalf("%s: %v", secret, err)
	}
	return machine{name: name, bundle: ca, token: tok}
}

func parsePointer(b []byte) (ca []byte, token string, err error) {
	var p struct {
		Ignition struct {
			Config struct {
				Merge []struct {
					HTTPHeaders []struct{ Name, Value string } `json:"httpHeaders"`
				} `json:"merge"`
			} `json:"config"`
			Security struct {
				TLS struct {
					CertificateAuthorities []struct{ Source string } `json:"certificateAuthorities"`
				} `json:"tls"`
			} `json:"security"`
		} `json:"ignition"`
	}
	if err := json.Unmarshal(b, &p); err != nil || len(p.Ignition.Security.TLS.CertificateAuthorities) != 1 {
		return nil, "", fmt.Errorf("pointer config: %v: %s", err, b)
	}
	du, err := dataurl.DecodeString(p.Ignition.Security.TLS.CertificateAuthorities[0].Source)
	if err != nil {
		return nil, "", err
	}
	ca = du.Data
	for _, m := range p.Ignition.Config.Merge {
		for _, h := range m.HTTPHeaders {
			if h.Name == "Authorization" {
				token = strings.TrimPrefix(h.Value, "Bearer ")
			}
		}
	}
	return ca, token, nil
}

// fetch asks replica url for pool's config as m would, verifying the
// server with m's bundle at the test clock's time (as Ignition's
// crypto/tls does at the machine's).
func (rs *replicaSet) fetch(m machine, url, pool string) error {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(m.bundle) {
		return fmt.Errorf("%s: no certificate in its bundle", m.name)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: roots, Time: rs.clk.Now}}}
	req, err := http.NewRequest(http.MethodGet, url+"/config/"+pool, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/vnd.coreos.ignition+json;version=3.5.0")
	if m.token != "" {
		req.Header.Set("Authorization", "Bearer "+m.token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s from %s: %w", m.name, url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s from %s: HTTP %d", m.name, url, resp.StatusCode)
	}
	return nil
}

// eventually polls cond every 100 ms for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool, logs func() string) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s\n%s", what, d, logs())
		}
	}
}

// TestClusterCertificatesLifetime runs two replicas on a real
// kube-apiserver with the CA, serving certificate and provisioning token
// kept in the cluster's objects, and moves their clock from year 0 to 8
// (the CA rotated, cross-signed) to 10 (the first CA expired). Machines
// provisioned at each step from the user-data Secrets keep fetching from
// both replicas, checked without a pause throughout; then bad objects are
// refused by name while the last good state stays in service.
func TestClusterCertificatesLifetime(t *testing.T) {
	rs := startReplicas(t, 2, nil)
	ctx := context.Background()
	mco := rs.kc.CoreV1().ConfigMaps(kubecerts.DefaultNamespace)
	bundleCAs := func() int {
		cm, err := mco.Get(ctx, kubecerts.CAName, metav1.GetOptions{})
		if err != nil {
			return -1
		}
		return strings.Count(cm.Data[kubecerts.BundleKey], "BEGIN CERTIFICATE")
	}
	if n := bundleCAs(); n != 1 {
		t.Fatalf("after the first start the bundle ConfigMap holds %d CAs, want 1\n%s", n, rs.allLogs())
	}
	ca, err := rs.kc.CoreV1().Secrets(kubecerts.DefaultNamespace).Get(ctx, kubecerts.CAName, metav1.GetOptions{})
	if err != nil || ca.Labels[kubecerts.LabelManagedBy] != "nodeproof" {
		t.Fatalf("CA Secret: %v, labels %v", err, ca.Labels)
	}
	managed := "master" + userdata.SecretSuffix
	installer := "master" + userdata.InstallerSuffix
	withCAs := func(secret string, n int) func() bool {
		return func() bool {
			sec, err := rs.kc.CoreV1().Secrets(userdata.DefaultNamespace).Get(ctx, secret, metav1.GetOptions{})
			if err != nil {
				return false
			}
			ca, tok, err := parsePointer(sec.Data[userdata.UserDataKey])
			cm, _ := mco.Get(ctx, kubecerts.CAName, metav1.GetOptions{})
			return err == nil && tok != "" && strings.Count(string(ca), "BEGIN CERTIFICATE") == n && cm != nil && string(ca) == cm.Data[kubecerts.BundleKey]
		}
	}
	eventually(t, 30*time.Second, "user-data Secrets carry the bundle", func() bool { return withCAs(managed, 1)() && withCAs(installer, 1)() }, rs.allLogs)
	y0 := rs.userDataMachine(t, "year-0 machine", managed)
	y0installer := rs.userDataMachine(t, "year-0 installer machine", installer)
	if y0installer.token != y0.token {
		t.Fatalf("the installer's Secret carries token %q, the managed one %q", y0installer.token, y0.token)
	}

	// Both replicas have synced their inputs (until then, 503 "not yet").
	for _, u := range rs.urls {
		eventually(t, 30*time.Second, "replica "+u+" serves", func() bool { return rs.fetch(y0, u, "master") == nil }, rs.allLogs)
	}

	// Machines fetch from every replica, without a pause, while the clock
	// moves; any failure is a window where a valid machine was refused.
	var (
		mu       sync.Mutex
		fleet    = []machine{y0, y0installer}
		failures []string
		fetches  atomic.Int64
		passes   atomic.Int64
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			passes.Add(1)
			mu.Lock()
			ms := append([]machine(nil), fleet...)
			mu.Unlock()
			for _, m := range ms {
				for _, u := range rs.urls {
					fetches.Add(1)
					if err := rs.fetch(m, u, "master"); err != nil {
						mu.Lock()
						failures = append(failures, err.Error())
						mu.Unlock()
					}
				}
			}
		}
	}()
	join := func(m machine) {
		mu.Lock()
		fleet = append(fleet, m)
		mu.Unlock()
	}
	leave := func(name string) {
		mu.Lock()
		for i := range fleet {
			if fleet[i].name == name {
				fleet = append(fleet[:i], fleet[i+1:]...)
				break
			}
		}
		mu.Unlock()
		// A pass that began before it left may still be fetching for it.
		for p := passes.Load(); passes.Load() < p+2; time.Sleep(10 * time.Millisecond) {
		}
	}
	served := func(url string) *x509.Certificate {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(url, "https://"), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return nil
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0]
	}
	servingFromNewestCA := func() bool {
		cm, err := mco.Get(ctx, kubecerts.CAName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		bundle, err := pemcert.Parse([]byte(cm.Data[kubecerts.BundleKey]))
		if err != nil {
			return false
		}
		for _, u := range rs.urls {
			leaf := served(u)
			if leaf == nil || leaf.CheckSignatureFrom(bundle[0]) != nil { // the newest CA is first
				return false
			}
		}
		return true
	}
	time.Sleep(time.Second)

	// Year 8.1: the CA is past 80% of its life.
	rs.clk.Advance(years(8.1))
	eventually(t, 30*time.Second, "year 8.1: the bundle holds the new CA and the old", func() bool { return bundleCAs() == 2 }, rs.allLogs)
	eventually(t, 30*time.Second, "year 8.1: both replicas serve a certificate from the new CA", servingFromNewestCA, rs.allLogs)
	eventually(t, 30*time.Second, "year 8.1: the user-data Secrets carry both CAs", func() bool { return withCAs(managed, 2)() && withCAs(installer, 2)() }, rs.allLogs)
	y8 := rs.userDataMachine(t, "year-8 machine", managed)
	join(y8)
	time.Sleep(time.Second)

	// Year 10.1: the first CA has expired, and with it every pointer
	// config that trusts only it (X.509: no chain to an expired root).
	leave(y0.name)
	leave(y0installer.name)
	rs.clk.Advance(years(2))
	eventually(t, 30*time.Second, "year 10.1: the expired CA leaves the bundle", func() bool { return bundleCAs() == 1 }, rs.allLogs)
	eventually(t, 30*time.Second, "year 10.1: the user-data Secrets drop it", func() bool { return withCAs(managed, 1)() && withCAs(installer, 1)() }, rs.allLogs)
	y10 := rs.userDataMachine(t, "year-10 machine", managed)
	join(y10)
	time.Sleep(time.Second)

	// Bad objects: refused by name, the last good state kept in service.
	spoil := func(name string, f func(*corev1.Secret)) {
		t.Helper()
		s, err := rs.kc.CoreV1().Secrets(kubecerts.DefaultNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f(s)
		if _, err := rs.kc.CoreV1().Secrets(kubecerts.DefaultNamespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	goodKey := append([]byte(nil), ca.Data[corev1.TLSPrivateKeyKey]...)
	spoil(kubecerts.CAName, func(s *corev1.Secret) { s.Data[corev1.TLSPrivateKeyKey] = []byte("garbage") })
	eventually(t, 30*time.Second, "a malformed CA Secret is refused by name", func() bool {
		return strings.Contains(rs.allLogs(), "Secret openshift-machine-config-operator/machine-config-server-ca key tls.key is unusable")
	}, rs.allLogs)
	spoil(kubecerts.ServingName, func(s *corev1.Secret) { s.Data[corev1.TLSPrivateKeyKey] = goodKey })
	eventually(t, 30*time.Second, "a serving Secret whose key does not match is refused by name", func() bool {
		return strings.Contains(rs.allLogs(), "Secret openshift-machine-config-operator/machine-config-server-tls key tls.crt and tls.key")
	}, rs.allLogs)
	toks := rs.kc.CoreV1().Secrets(cluster.TokenSecretNamespace)
	tokSec, err := toks.Get(ctx, cluster.TokenSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tokSec.Data = map[string][]byte{"Token": tokSec.Data["token"]}
	if _, err := toks.Update(ctx, tokSec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a token Secret with the wrong keys is refused by name", func() bool {
		return strings.Contains(rs.allLogs(), `Secret openshift-config/machineconfig-auth has no key \"token\" (it has: Token)`)
	}, rs.allLogs)
	time.Sleep(2 * time.Second) // machines keep fetching on the last good state

	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d fetches failed, e.g. %q\n%s", len(failures), fetches.Load(), failures[:min(5, len(failures))], rs.allLogs())
	}
	if fetches.Load() < 50 {
		t.Fatalf("only %d fetches made", fetches.Load())
	}
	t.Logf("%d fetches from 2 replicas across years 0, 8.1 and 10.1 and three bad objects, none failed", fetches.Load())
	leaders := 0
	for _, l := range rs.logs {
		if strings.Contains(l.String(), `"msg":"server leading"`) {
			leaders++
		}
	}
	if leaders != 1 {
		t.Errorf("%d replicas led; want exactly 1", leaders)
	}
}

func years(y float64) time.Duration { return time.Duration(y * 365.25 * 24 * float64(time.Hour)) }

// TestTokenRotationUnderLoad rotates the provisioning token every 2 s
// (--token-rotate-every) on two replicas while machines keep being
// created: each reads its role's user-data Secret, as a MachineSet hands
// it over, and fetches its config from either replica. No fetch may fail.
func TestTokenRotationUnderLoad(t *testing.T) {
	rs := startReplicas(t, 2, func(c *serve.Config) { c.TokenRotateEvery = 2 * time.Second; c.Grace = 10 * time.Second })
	ctx := context.Background()
	for _, u := range rs.urls {
		eventually(t, 30*time.Second, "replica "+u+" serves", func() bool {
			// Read afresh each time: the token may rotate meanwhile.
			sec, err := rs.kc.CoreV1().Secrets(userdata.DefaultNamespace).Get(ctx, "master"+userdata.SecretSuffix, metav1.GetOptions{})
			if err != nil {
				return false
			}
			ca, tok, err := parsePointer(sec.Data[userdata.UserDataKey])
			return err == nil && rs.fetch(machine{name: "first", bundle: ca, token: tok}, u, "master") == nil
		}, rs.allLogs)
	}
	var (
		mu       sync.Mutex
		failures []string
		seen     = map[string]bool{}
		fetches  atomic.Int64
	)
	deadline := time.Now().Add(12 * time.Second)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				secret := "master" + []string{userdata.SecretSuffix, userdata.InstallerSuffix}[i%2]
				sec, err := rs.kc.CoreV1().Secrets(userdata.DefaultNamespace).Get(ctx, secret, metav1.GetOptions{})
				if err != nil {
					continue
				}
				ca, tok, err := parsePointer(sec.Data[userdata.UserDataKey])
				if err != nil || tok == "aW5zdGFsbGVyLXRva2Vu" {
					continue // the installer's Secret before its first update
				}
				m := machine{name: fmt.Sprintf("machine %d.%d", w, i), bundle: ca, token: tok}
				// Machines take a while to boot: some fetch at once, some later.
				time.Sleep(time.Duration(i%4) * 150 * time.Millisecond)
				fetches.Add(1)
				err = rs.fetch(m, rs.urls[(w+i)%len(rs.urls)], "master")
				mu.Lock()
				seen[tok] = true
				if err != nil {
					failures = append(failures, err.Error())
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d fetches failed during rotations, e.g. %q\n%s", len(failures), fetches.Load(), failures[:min(5, len(failures))], rs.allLogs())
	}
	rotations := strings.Count(rs.allLogs(), "provisioning token rotated")
	if rotations < 3 || len(seen) < 3 || fetches.Load() < 60 {
		t.Fatalf("%d rotations, %d distinct tokens handed out, %d fetches: the load did not span rotations\n%s", rotations, len(seen), fetches.Load(), rs.allLogs())
	}
	t.Logf("%d fetches, %d rotations, %d tokens handed out through the user-data Secrets, none failed", fetches.Load(), rotations, len(seen))
}

// TestTokensMovedToTheCluster starts a replica in cluster mode beside the
// token file an earlier release kept (--tokens-file): the leader imports
// its tokens into openshift-config/machineconfig-auth, so machines holding
// the old token keep fetching through the move, and that token then
// rotates away like any other: refused once its grace has passed.
func TestTokensMovedToTheCluster(t *testing.T) {
	var old string
	rs := startReplicas(t, 1, func(c *serve.Config) {
		c.TokensFile = filepath.Join(t.TempDir(), "tokens.json")
		p, err := tokens.LoadProvisioning(c.TokensFile, time.Hour, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		old = p.Current()
		c.TokenRotateEvery, c.Grace = 2*time.Second, 3*time.Second
	})
	ctx := context.Background()
	sec, err := rs.kc.CoreV1().Secrets(cluster.TokenSecretNamespace).Get(ctx, cluster.TokenSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(sec.Data[cluster.TokenHistoryKey]), old) {
		t.Fatalf("the file's token was not imported into the Secret: %s", sec.Data[cluster.TokenHistoryKey])
	}
	m := rs.userDataMachine(t, "bundle holder", "master"+userdata.SecretSuffix)
	m.token = old
	eventually(t, 30*time.Second, "the old token fetches after the move", func() bool { return rs.fetch(m, rs.urls[0], "master") == nil }, rs.allLogs)
	eventually(t, 30*time.Second, "the old token is refused after rotation and grace", func() bool {
		err := rs.fetch(m, rs.urls[0], "master")
		return err != nil && strings.Contains(err.Error(), "HTTP 40")
	}, rs.allLogs)
	if !strings.Contains(rs.allLogs(), "imported from --tokens-file") {
		t.Errorf("the import was not logged\n%s", rs.allLogs())
	}
}

// TestCAAndPointerFromTheCluster: `nodeproof ca --kubeconfig` shows and
// rotates the CA kept in the cluster (the replica follows; a machine given
// the bundle before still fetches), and `nodeproof pointer --kubeconfig
// --token` writes a pointer config from the cluster's bundle and token
// that fetches.
func TestCAAndPointerFromTheCluster(t *testing.T) {
	rs := startReplicas(t, 1, nil)
	ctx := context.Background()
	kubeconfig := rs.kubeconfig
	run := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := cli.Run(ctx, args, &stdout, &stderr); code != 0 {
			t.Fatalf("nodeproof %v: exit %d: %s", args, code, stderr.String())
		}
		return stdout.String()
	}
	before := rs.userDataMachine(t, "before the rotation", "master"+userdata.SecretSuffix)
	eventually(t, 30*time.Second, "the replica serves", func() bool { return rs.fetch(before, rs.urls[0], "master") == nil }, rs.allLogs)
	if out := run("ca", "show", "--kubeconfig", kubeconfig); !strings.Contains(out, "(1 CA)") || !strings.Contains(out, "owner:      nodeproof") {
		t.Fatalf("ca show: %s", out)
	}
	// CA names carry their creation second: a rotation in the second the
	// CA was made is refused ("a second later"); the first start may have
	// been that quick.
	var out string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var stdout, stderr bytes.Buffer
		code := cli.Run(ctx, []string{"ca", "rotate", "--kubeconfig", kubeconfig}, &stdout, &stderr)
		if code == 0 {
			out = stdout.String()
			break
		}
		if !strings.Contains(stderr.String(), "a second later") || time.Now().After(deadline) {
			t.Fatalf("ca rotate: exit %d: %s", code, stderr.String())
		}
	}
	if !strings.Contains(out, "rotated CA") || !strings.Contains(out, "(2 CA)") || !strings.Contains(out, "127.0.0.1") {
		t.Fatalf("ca rotate: %s", out)
	}
	ptr := filepath.Join(t.TempDir(), "pointer.ign")
	run("pointer", "--kubeconfig", kubeconfig, "--token", "--pool", "master", "--url", rs.urls[0], "-o", ptr)
	b, err := os.ReadFile(ptr)
	if err != nil {
		t.Fatal(err)
	}
	ca, tok, err := parsePointer(b)
	if err != nil || strings.Count(string(ca), "BEGIN CERTIFICATE") != 2 || tok == "" {
		t.Fatalf("pointer from the cluster: %d CAs, token %q, %v", strings.Count(string(ca), "BEGIN CERTIFICATE"), tok, err)
	}
	after := machine{name: "after the rotation", bundle: ca, token: tok}
	eventually(t, 30*time.Second, "the replica serves the rotated certificate", func() bool {
		return rs.fetch(after, rs.urls[0], "master") == nil && rs.fetch(before, rs.urls[0], "master") == nil
	}, rs.allLogs)
}
