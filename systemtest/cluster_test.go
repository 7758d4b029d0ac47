package systemtest_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vincent-petithory/dataurl"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/mcs/userdata"
	"github.com/nodeproof/nodeproof/systemtest"
)

// servedKubeconfig is the rest.Config of the kubeconfig in an Ignition
// config Ignition cached.
func servedKubeconfig(t *testing.T, cached []byte) *rest.Config {
	t.Helper()
	src, ok := cachedFiles(t, cached)[render.KubeconfigPath]
	if !ok {
		t.Fatalf("the config has no %s", render.KubeconfigPath)
	}
	du, err := dataurl.DecodeString(src)
	if err != nil {
		t.Fatalf("%s: %v", render.KubeconfigPath, err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(du.Data)
	if err != nil {
		t.Fatalf("%s does not load: %v", render.KubeconfigPath, err)
	}
	return rc
}

// TestServeClusterMode runs `nodeproof serve --kubeconfig --apiserver-url`
// against a real kube-apiserver: it serves nothing (503) until the pools
// exist, then what the cluster holds; an attested node's full config
// carries a bootstrap token of its own, which the API server authenticates
// as system:bootstrap:<id> in the pool's group; the token tier carries the
// shared node-bootstrapper kubeconfig, as the OpenShift MCS serves.
func TestServeClusterMode(t *testing.T) {
	// A deployed cluster whose MCO objects do not exist yet, and a vendor.
	w := systemtest.New(t, "..", systemtest.Options{Cluster: true, NoExamples: true, TPM: true,
		Policy: func(w *systemtest.World) *policytest.Builder { return e2ePolicy(w.EKRoots) }})
	cfg, kc, c := w.Config, w.KC, w.Client
	ctx := context.Background()
	tokenDir, policyFile := w.TokenDir, w.PolicyFile
	s := &server{stateDir: filepath.Join(t.TempDir(), "state"), log: new(testenv.LockedBuffer), man: w.Manufacturer}
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: userdata.DefaultNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Certificates made 8.1 years ago, past 80% of the CA's life: the
	// server rotates them when it starts, and the user-data Secrets must
	// carry the new bundle without dropping the old CA.
	then := time.Now().Add(-time.Duration(8.1 * 365.25 * 24 * float64(time.Hour)))
	old, err := certs.Ensure(filepath.Join(s.stateDir, "certs"), certs.Options{Clock: func() time.Time { return then }, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	// The user-data Secrets name the server's URL, so its port is chosen
	// before it starts.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	sctx, cancel := context.WithCancel(ctx)
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve.Run(sctx, serve.Config{
			Listen: "127.0.0.1", SecurePort: port, TLSMinVersion: "VersionTLS12",
			Kubeconfig: w.Admin, APIServerURL: cfg.Host, TokenDir: tokenDir,
			CertStore: "state-dir", TokenStore: "file",
			UserDataURL: fmt.Sprintf("https://127.0.0.1:%d", port), UserDataNamespace: userdata.DefaultNamespace,
			UserDataRoles: map[string]string{"master": "master", "worker": "worker"},
			Policy:        policyFile, StateDir: s.stateDir, Hosts: []string{"127.0.0.1"},
			TokenTTL: 10 * time.Minute, Grace: time.Hour, Reload: time.Second, Clock: time.Now,
			Log:   slog.New(slog.NewJSONHandler(s.log, nil)),
			Ready: func(a, _ net.Addr) { ready <- a },
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	select {
	case a := <-ready:
		s.url = "https://" + a.String()
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("serve failed: %v\n%s", err, s.log)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start")
	}
	bundle, err := os.ReadFile(filepath.Join(s.stateDir, "certs", "current", certs.CABundleFileName))
	if err != nil {
		t.Fatal(err)
	}
	hc, err := agent.NewClient(s.url, bundle)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	plain := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(path string) *http.Response {
		t.Helper()
		resp, err := plain.Get(s.url + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}

	// No pools in the cluster yet: "not yet", which Ignition retries.
	if resp := get("/config/worker"); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("before the pools exist: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// The objects arrive in the worst order — the pools first, the
	// ControllerConfig last, a pause after each stage so that the server
	// sees every incomplete state — while a machine keeps asking. A 200
	// ends Ignition's fetch for good, so every 200 must be the whole
	// public tier; before that, only 503s that say when to retry.
	poll := startPublicPoller(t, plain, s.url+"/config/worker", expectedFiles(t, "worker", render.TierPublic, bundle))
	ex := clustertest.LoadExamples(t, "../deploy/examples/bootstrap")
	if err := ex.CreateBackwards(ctx, c, func(string) { time.Sleep(4 * cluster.DefaultDebounce) }); err != nil {
		t.Fatal(err)
	}
	if err := poll.untilServed(60 * time.Second); err != nil {
		t.Fatalf("%v\n%s", err, s.log)
	}
	if !strings.Contains(s.log.String(), "pool not served until these arrive") {
		t.Errorf("the server never said which inputs it was waiting for:\n%s", s.log)
	}

	t.Run("public tier", func(t *testing.T) {
		cached, out, err := ignitionFetch(t, s.pointerFile(t, "--pool", "worker"))
		if err != nil {
			t.Fatalf("ignition: %v\n%s", err, out)
		}
		sameFiles(t, cachedFiles(t, cached), expectedFiles(t, "worker", render.TierPublic, bundle))
	})

	t.Run("attested node gets its own bootstrap token", func(t *testing.T) {
		m, err := s.man.NewMachine(ctx, t.TempDir(), firmwaretestdata.MustLog("rhel8-uefi"))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		vr, err := hc.AttestTPM(ctx, "worker", "worker-1", m.Collector, m.KubeletDER)
		if err != nil {
			t.Fatalf("attest: %v\n%s", err, s.log)
		}
		tokFile := filepath.Join(t.TempDir(), "token")
		os.WriteFile(tokFile, []byte(vr.ConfigToken), 0o600)
		cached, out, err := ignitionFetch(t, s.pointerFile(t, "--pool", "worker", "--token-file", tokFile))
		if err != nil {
			t.Fatalf("ignition: %v\n%s", err, out)
		}
		// The same files as the full tier from the same objects in a
		// directory; the kubeconfig and the serialised MachineConfig (which
		// carries the cluster's object metadata) have other contents.
		got, want := cachedFiles(t, cached), expectedFiles(t, "worker", render.TierFull, bundle)
		for _, p := range []string{render.KubeconfigPath, render.MachineConfigContentPath, render.EncapsulatedPath} {
			if _, ok := got[p]; !ok {
				t.Errorf("the full config lacks %s", p)
			}
			delete(got, p)
			delete(want, p)
		}
		sameFiles(t, got, want)

		rc := servedKubeconfig(t, cached)
		if rc.Host != cfg.Host {
			t.Errorf("the kubeconfig names %s, want --apiserver-url %s", rc.Host, cfg.Host)
		}
		id, _, ok := strings.Cut(rc.BearerToken, ".")
		if !ok {
			t.Fatalf("the kubeconfig's token is not a bootstrap token")
		}
		u, err := clustertest.WaitWhoAmI(ctx, rc, 30*time.Second)
		if err != nil {
			t.Fatalf("the node's token does not authenticate: %v", err)
		}
		if u.Username != "system:bootstrap:"+id || !slices.Contains(u.Groups, "system:bootstrappers:nodeproof:worker") {
			t.Fatalf("the node's token authenticates as %s %v", u.Username, u.Groups)
		}
		sec, err := kc.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sec.Annotations[cluster.AnnotationNode] != "worker-1" {
			t.Errorf("token Secret annotations %v", sec.Annotations)
		}
		if strings.Contains(s.log.String(), rc.BearerToken) {
			t.Fatal("the bootstrap token was logged")
		}
	})

	t.Run("token tier gets the shared node-bootstrapper kubeconfig", func(t *testing.T) {
		cached, out, err := ignitionFetch(t, s.pointerFile(t, "--pool", "master", "--token"))
		if err != nil {
			t.Fatalf("ignition: %v\n%s", err, out)
		}
		u, err := clustertest.WhoAmI(ctx, servedKubeconfig(t, cached))
		if err != nil {
			t.Fatal(err)
		}
		if want := "system:serviceaccount:" + cluster.MCONamespace + ":node-bootstrapper"; u.Username != want {
			t.Fatalf("token tier kubeconfig authenticates as %s, want %s", u.Username, want)
		}
	})

	t.Run("user-data secrets follow a CA rotation and a token rotation", func(t *testing.T) {
		secrets := kc.CoreV1().Secrets(userdata.DefaultNamespace)
		userData := func(role string, differentFrom []byte) []byte {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			for {
				sec, err := secrets.Get(ctx, role+userdata.SecretSuffix, metav1.GetOptions{})
				if err == nil && len(sec.Data[userdata.UserDataKey]) > 0 && !bytes.Equal(sec.Data[userdata.UserDataKey], differentFrom) {
					return sec.Data[userdata.UserDataKey]
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s user-data Secret not (re)written: %v", role, err)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		write := func(b []byte) string {
			f := filepath.Join(t.TempDir(), "user-data.ign")
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
			return f
		}
		worker := userData("worker", nil)
		if bytes.Contains(worker, []byte("Authorization")) {
			t.Error("the worker pool takes no token, but its user data carries one")
		}
		ca := pointerCA(t, worker)
		if !bytes.Equal(ca, bundle) {
			t.Fatal("the worker user data does not carry the current CA bundle")
		}
		if n := bytes.Count(ca, []byte("BEGIN CERTIFICATE")); n != 2 || !bytes.Contains(ca, bytes.TrimSpace(old.CABundlePEM)) {
			t.Fatalf("after the rotation the bundle holds %d CAs; it must keep the old one beside the new", n)
		}
		// A machine created before the rotation, with the old bundle only,
		// still fetches (the new CA is cross-signed by the old).
		oldBundle := filepath.Join(t.TempDir(), "old-bundle.pem")
		os.WriteFile(oldBundle, old.CABundlePEM, 0o600)
		if _, out, err := ignitionFetch(t, s.pointerFile(t, "--pool", "worker", "--ca-bundle", oldBundle)); err != nil {
			t.Fatalf("ignition with the pre-rotation bundle: %v\n%s", err, out)
		}
		if _, out, err := ignitionFetch(t, write(worker)); err != nil {
			t.Fatalf("ignition with the worker user data: %v\n%s", err, out)
		}
		oldMaster := userData("master", nil)
		if _, out, err := ignitionFetch(t, write(oldMaster)); err != nil {
			t.Fatalf("ignition with the master user data: %v\n%s", err, out)
		}
		var stderr bytes.Buffer
		if code := cli.Run(ctx, []string{"token", "rotate", "--state-dir", s.stateDir, "--grace", "1h"}, io.Discard, &stderr); code != 0 {
			t.Fatalf("token rotate: %s", stderr.String())
		}
		newMaster := userData("master", oldMaster)
		for name, p := range map[string][]byte{"new": newMaster, "old (within grace)": oldMaster} {
			if _, out, err := ignitionFetch(t, write(p)); err != nil {
				t.Fatalf("ignition with the %s master user data: %v\n%s", name, err, out)
			}
		}
	})
}

// applyRenderedRBAC renders a kustomization (`kubectl kustomize`, the
// kubectl `make tools` builds) and creates its service accounts, roles and
// bindings, exactly as deploy/ has them.
func applyRenderedRBAC(t *testing.T, cfg *rest.Config, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.Kubectl(t), "kustomize", dir)
	cmd.Env = []string{"HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	n := 0
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		switch u.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
		default:
			continue
		}
		if err := c.Create(ctx, &u); err != nil {
			t.Fatalf("%s: create %s %s/%s: %v", dir, u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("%s renders no RBAC", dir)
	}
}

// writeAtomic replaces a file the way the kubelet updates a mounted
// ConfigMap or Secret: a reader sees the old or the new contents, whole.
func writeAtomic(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// pointerCA returns the CA bundle an Ignition pointer config carries.
func pointerCA(t *testing.T, ptr []byte) []byte {
	t.Helper()
	ca, _, err := parsePointer(ptr)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestServeUserDataAsDeployed runs `nodeproof serve` as the OpenShift
// overlay deploys it: the MCS's own serving certificate (--cert/--key,
// signed by a CA the test plays the MCO for) with the CA bundle that signed
// it (--ca-bundle), keeping the user-data Secrets current
// (--user-data-url), as the overlay's service account under the RBAC
// `kubectl kustomize deploy/overlays/openshift` renders — not as admin. The
// Secrets exist, as the MCO makes them. Then the MCO's rotation: a new CA
// joins the bundle file and the serving certificate is re-issued by it,
// while the server runs; the Secrets carry the new bundle with the old CA
// kept, the public tier carries it too, and Ignition booting from the
// Secrets' pointer configs still fetches.
func TestServeUserDataAsDeployed(t *testing.T) {
	cfg, kc, c := testCluster(t)
	ctx := context.Background()
	tokenDir := clustertest.NodeBootstrapperSecret(t, ctx, cfg, kc) // makes openshift-machine-config-operator
	for _, ns := range []string{userdata.DefaultNamespace, "nodeproof", cluster.TokenSecretNamespace} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	applyRenderedRBAC(t, cfg, "../deploy/overlays/openshift")
	clustertest.LoadExamples(t, "../deploy/examples/bootstrap").Create(ctx, t, c)
	// The Secrets as the MCO made them (its pointer, another key nodeproof
	// must keep), plus one nodeproof's account must not read.
	secrets := kc.CoreV1().Secrets(userdata.DefaultNamespace)
	mcoPointer := []byte(`{"ignition":{"version":"3.2.0"}}`)
	for _, name := range []string{"worker" + userdata.SecretSuffix, "master" + userdata.SecretSuffix, "aws-cloud-credentials"} {
		if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name},
			Data: map[string][]byte{userdata.UserDataKey: mcoPointer, "disableTemplating": []byte("true")}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The MCO's CA and the MCS certificate it signed, mounted as the
	// overlay mounts them (machine-config-server-tls, machine-config-server-ca).
	dir := t.TempDir()
	ca1, err := certs.Ensure(filepath.Join(dir, "mco-ca-1"), certs.Options{Clock: time.Now, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := certs.Ensure(filepath.Join(dir, "mco-ca-2"), certs.Options{Clock: time.Now, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	read := func(f string) []byte {
		t.Helper()
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	mounted := filepath.Join(dir, "mounted")
	os.Mkdir(mounted, 0o700)
	certFile, keyFile, bundleFile := filepath.Join(mounted, "tls.crt"), filepath.Join(mounted, "tls.key"), filepath.Join(mounted, "ca-bundle.crt")
	writeAtomic(t, certFile, read(ca1.ServingCertFile))
	writeAtomic(t, keyFile, read(ca1.ServingKeyFile))
	writeAtomic(t, bundleFile, ca1.CABundlePEM)

	policyFile := writePolicy(t, dir, clusterStatePolicy())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	stateDir := filepath.Join(dir, "state") // the overlay's emptyDir
	log := new(testenv.LockedBuffer)
	sctx, cancel := context.WithCancel(ctx)
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve.Run(sctx, serve.Config{
			Listen: "127.0.0.1", SecurePort: port, TLSMinVersion: "VersionTLS12",
			CertFile: certFile, KeyFile: keyFile, CABundleFile: bundleFile,
			Kubeconfig:   clustertest.ServiceAccountKubeconfig(t, cfg, "openshift-machine-config-operator", "nodeproof-server"),
			APIServerURL: cfg.Host, TokenDir: tokenDir, StoreNamespace: "nodeproof",
			// The token as deployed: in openshift-config/machineconfig-auth.
			UserDataURL: fmt.Sprintf("https://127.0.0.1:%d", port), UserDataNamespace: userdata.DefaultNamespace,
			UserDataRoles: map[string]string{"master": "master", "worker": "worker"},
			Policy:        policyFile, StateDir: stateDir, Hosts: []string{"127.0.0.1"},
			TokenTTL: 10 * time.Minute, Grace: time.Hour, Reload: time.Second, Clock: time.Now,
			Log:   slog.New(slog.NewJSONHandler(log, nil)),
			Ready: func(a, _ net.Addr) { ready <- a },
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		done <- err
		t.Fatalf("serve failed: %v\n%s", err, log)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start")
	}
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	if !strings.Contains(log.String(), "nodeproof rotates nothing") {
		t.Errorf("with --cert the server did not say at start that it rotates nothing:\n%s", log)
	}
	// trusting reports whether the server's certificate verifies under
	// bundle alone.
	trusting := func(bundle []byte) error {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(bundle)
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
		resp, err := hc.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca1.CABundlePEM)
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		resp, err := hc.Get(url + "/config/worker")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker pool is not served a minute after start: %v\n%s", err, log)
		}
	}
	// userData waits until role's Secret holds a pointer other than old.
	userData := func(role string, old []byte) *corev1.Secret {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			sec, err := secrets.Get(ctx, role+userdata.SecretSuffix, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(sec.Data[userdata.UserDataKey], old) {
				return sec
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s user-data Secret not rewritten\n%s", role, log)
			}
		}
	}
	write := func(b []byte) string {
		f := filepath.Join(t.TempDir(), "user-data.ign")
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	// boot fetches with a user-data pointer and returns the public tier's
	// CA bundle file the config carries, if any.
	boot := func(what string, ptr []byte) []byte {
		t.Helper()
		cached, out, err := ignitionFetch(t, write(ptr))
		if err != nil {
			t.Fatalf("ignition with the %s user data: %v\n%s", what, err, out)
		}
		src, ok := cachedFiles(t, cached)[render.CABundlePath]
		if !ok {
			return nil
		}
		du, err := dataurl.DecodeString(src)
		if err != nil {
			t.Fatal(err)
		}
		return du.Data
	}

	worker := userData("worker", mcoPointer)
	master := userData("master", mcoPointer)
	t.Run("the Secrets carry --ca-bundle, written as the overlay's service account", func(t *testing.T) {
		for role, sec := range map[string]*corev1.Secret{"worker": worker, "master": master} {
			if got := pointerCA(t, sec.Data[userdata.UserDataKey]); !bytes.Equal(got, ca1.CABundlePEM) {
				t.Errorf("%s user data carries another CA bundle than --ca-bundle", role)
			}
			if string(sec.Data["disableTemplating"]) != "true" {
				t.Errorf("%s: the MCO's other key was not kept: %q", role, sec.Data)
			}
		}
		if bytes.Contains(worker.Data[userdata.UserDataKey], []byte("Authorization")) {
			t.Error("the worker pool takes no token, but its user data carries one")
		}
		if !bytes.Contains(master.Data[userdata.UserDataKey], []byte("Authorization")) {
			t.Error("the master pool takes the token tier, but its user data carries no token")
		}
		if got := boot("worker", worker.Data[userdata.UserDataKey]); !bytes.Equal(got, ca1.CABundlePEM) {
			t.Errorf("the public tier carries %q, want --ca-bundle", got)
		}
		boot("master", master.Data[userdata.UserDataKey])
		// The account may touch the two user-data Secrets and nothing else.
		sa, err := kubernetes.NewForConfig(kubetest.AsServiceAccount(cfg, "openshift-machine-config-operator", "nodeproof-server"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sa.CoreV1().Secrets(userdata.DefaultNamespace).Get(ctx, "aws-cloud-credentials", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the server's account reads another Secret in %s: %v", userdata.DefaultNamespace, err)
		}
	})

	t.Run("a CA rotation while the server runs reaches the Secrets with the old CA kept", func(t *testing.T) {
		// As the MCO rotates: the new CA joins the bundle (the old one
		// stays while it is valid), and the MCS certificate is re-issued
		// by the new CA.
		rotated := append(append([]byte(nil), ca2.CABundlePEM...), ca1.CABundlePEM...)
		writeAtomic(t, bundleFile, rotated)
		writeAtomic(t, keyFile, read(ca2.ServingKeyFile))
		writeAtomic(t, certFile, read(ca2.ServingCertFile))
		newWorker := userData("worker", worker.Data[userdata.UserDataKey])
		newMaster := userData("master", master.Data[userdata.UserDataKey])
		for role, sec := range map[string]*corev1.Secret{"worker": newWorker, "master": newMaster} {
			got := pointerCA(t, sec.Data[userdata.UserDataKey])
			if !bytes.Equal(got, rotated) {
				t.Errorf("%s user data does not carry the rotated bundle", role)
			}
			if !bytes.Contains(got, bytes.TrimSpace(ca1.CABundlePEM)) || !bytes.Contains(got, bytes.TrimSpace(ca2.CABundlePEM)) {
				t.Errorf("%s user data: the rotated bundle must hold the old CA beside the new", role)
			}
		}
		// The server presents the new certificate (an old-CA-only client
		// no longer verifies it): booting below proves the new bundle.
		for deadline := time.Now().Add(10 * time.Second); trusting(ca2.CABundlePEM) != nil; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the server does not present the re-issued certificate: %v", trusting(ca2.CABundlePEM))
			}
		}
		if err := trusting(ca1.CABundlePEM); err == nil {
			t.Fatal("the re-issued certificate verifies under the old CA alone: the rotation proves nothing")
		}
		// The public tier carries the rotated bundle too (re-rendered
		// without an input change).
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			got := boot("worker", newWorker.Data[userdata.UserDataKey])
			if bytes.Equal(got, rotated) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the public tier still carries %q after the rotation\n%s", got, log)
			}
		}
		boot("master", newMaster.Data[userdata.UserDataKey])
	})

	// The provisioning token the master user data carries is never logged.
	var toks []struct{ Value string }
	tokSec, err := kc.CoreV1().Secrets(cluster.TokenSecretNamespace).Get(ctx, cluster.TokenSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(tokSec.Data[cluster.TokenHistoryKey], &toks); err != nil || len(toks) == 0 || toks[0].Value == "" {
		t.Fatalf("%s: %v %d", cluster.TokenHistoryKey, err, len(toks))
	}
	for _, tok := range toks {
		if strings.Contains(log.String(), tok.Value) {
			t.Error("the provisioning token was logged")
		}
	}
}

// publicPoller asks for a pool's public tier, as a booting machine does,
// until it gets a 200, and checks every answer on the way.
type publicPoller struct {
	done chan error
}

// startPublicPoller GETs url (spec 3.5) every 50 ms until a 200. A 200
// must carry exactly the files of want; anything else must be a 503 with
// Retry-After. The first violation, or the 200, ends it.
func startPublicPoller(t *testing.T, hc *http.Client, url string, want map[string]string) *publicPoller {
	t.Helper()
	p := &publicPoller{done: make(chan error, 1)}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		p.done <- func() error {
			for n := 1; ; n++ {
				select {
				case <-stop:
					return errors.New("stopped")
				case <-time.After(50 * time.Millisecond):
				}
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("Accept", "application/vnd.coreos.ignition+json;version=3.5.0")
				resp, err := hc.Do(req)
				if err != nil {
					return fmt.Errorf("request %d: %w", n, err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					return fmt.Errorf("request %d: %w", n, err)
				}
				switch resp.StatusCode {
				case http.StatusServiceUnavailable:
					if resp.Header.Get("Retry-After") == "" {
						return fmt.Errorf("request %d: 503 without Retry-After", n)
					}
					continue
				case http.StatusOK:
				default:
					return fmt.Errorf("request %d: %d %s; want 503 until the pool is complete, then 200", n, resp.StatusCode, body)
				}
				files, err := systemtest.ConfigFiles(body)
				if err != nil {
					return fmt.Errorf("request %d: 200 with an undecodable config: %w", n, err)
				}
				for path, src := range want {
					if got, ok := files[path]; !ok {
						return fmt.Errorf("request %d: 200 with a partial public tier: it lacks %s", n, path)
					} else if got != src {
						return fmt.Errorf("request %d: 200 with %s not as the complete pool has it", n, path)
					}
				}
				if len(files) != len(want) {
					return fmt.Errorf("request %d: 200 with %d files; the complete pool has %d", n, len(files), len(want))
				}
				return nil
			}
		}()
	}()
	return p
}

// untilServed waits for the poller's 200 and returns what it found wrong.
func (p *publicPoller) untilServed(timeout time.Duration) error {
	select {
	case err := <-p.done:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("the pool is not served %v after its last input was created", timeout)
	}
}
