package cli

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
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vincent-petithory/dataurl"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/agent"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/mcs/userdata"
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
	cfg := clustertest.Start(t, "../../deploy/crds")
	ctx := context.Background()
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	tokenDir := clustertest.NodeBootstrapperSecret(t, ctx, cfg, kc)

	dir := t.TempDir()
	s := &server{stateDir: filepath.Join(dir, "state"), log: new(testenv.LockedBuffer)}
	if s.man, err = swtpm.NewManufacturer(filepath.Join(dir, "vendor")); err != nil {
		t.Fatal(err)
	}
	if err := s.man.Provision(ctx, filepath.Join(dir, "first-tpm")); err != nil {
		t.Fatal(err)
	}
	roots, err := s.man.RootsDir()
	if err != nil {
		t.Fatal(err)
	}
	policyFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyFile, fmt.Appendf(nil, e2ePolicy, roots), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{userdata.DefaultNamespace, "nodeproof"} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
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
		done <- Serve(sctx, ServeConfig{
			Listen: "127.0.0.1", SecurePort: port, TLSMinVersion: "VersionTLS12",
			Kubeconfig: clustertest.AdminKubeconfig(t, cfg), APIServerURL: cfg.Host, TokenDir: tokenDir,
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
	clustertest.LoadExamples(t, "../../deploy/examples/bootstrap").Create(ctx, t, c)
	deadline := time.Now().Add(60 * time.Second)
	for get("/config/worker").StatusCode != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatalf("the worker pool is not served a minute after it was created\n%s", s.log)
		}
		time.Sleep(200 * time.Millisecond)
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
		var ptr struct {
			Ignition struct {
				Security struct {
					TLS struct {
						CertificateAuthorities []struct{ Source string } `json:"certificateAuthorities"`
					} `json:"tls"`
				} `json:"security"`
			} `json:"ignition"`
		}
		if err := json.Unmarshal(worker, &ptr); err != nil || len(ptr.Ignition.Security.TLS.CertificateAuthorities) != 1 {
			t.Fatalf("worker user data: %v\n%s", err, worker)
		}
		du, err := dataurl.DecodeString(ptr.Ignition.Security.TLS.CertificateAuthorities[0].Source)
		if err != nil || !bytes.Equal(du.Data, bundle) {
			t.Fatalf("the worker user data does not carry the current CA bundle: %v", err)
		}
		if n := bytes.Count(du.Data, []byte("BEGIN CERTIFICATE")); n != 2 || !bytes.Contains(du.Data, bytes.TrimSpace(old.CABundlePEM)) {
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
		if code := Run(ctx, []string{"token", "rotate", "--state-dir", s.stateDir, "--grace", "1h"}, io.Discard, &stderr); code != 0 {
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
