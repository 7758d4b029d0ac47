package kubeletboot

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// fakeCSRAPI answers the certificates.k8s.io/v1 CSR calls the agent
// makes, as kube-apiserver does: it checks the bearer token, stores the
// created CSR (409 for a name taken), and decides it after a few reads:
// approve signs the request with its CA, deny denies it.
type fakeCSRAPI struct {
	t        *testing.T
	token    string
	decide   string // "approve", "deny", "" never
	fail5xx  int    // the first this many requests answer 503
	mu       sync.Mutex
	csrs     map[string]*CSR
	requests int
	ca       *x509.Certificate
	caKey    *ecdsa.PrivateKey
}

func (f *fakeCSRAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests++
	if f.requests <= f.fail5xx {
		http.Error(w, `{"message":"etcd is down"}`, http.StatusServiceUnavailable)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		http.Error(w, `{"message":"Unauthorized"}`, http.StatusUnauthorized)
		return
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == csrPath:
		var c CSR
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &c); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if c.Spec.SignerName != SignerKubeletClient || strings.Join(c.Spec.Usages, ",") != "digital signature,client auth" {
			http.Error(w, `{"message":"bad spec"}`, http.StatusUnprocessableEntity)
			return
		}
		if _, ok := f.csrs[c.Metadata.Name]; ok {
			http.Error(w, `{"message":"already exists"}`, http.StatusConflict)
			return
		}
		f.csrs[c.Metadata.Name] = &c
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(c)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, csrPath+"/"):
		c, ok := f.csrs[strings.TrimPrefix(r.URL.Path, csrPath+"/")]
		if !ok {
			http.Error(w, `{"message":"not found"}`, http.StatusNotFound)
			return
		}
		if _, decided := c.Decision(); !decided {
			switch f.decide {
			case "approve":
				c.Status.Conditions = []Condition{{Type: "Approved", Reason: "NodeproofAttestedTPM", Message: "attested"}}
				c.Status.Certificate = f.sign(c.Spec.Request)
			case "deny":
				c.Status.Conditions = []Condition{{Type: "Denied", Reason: "NodeproofKeyNotBound", Message: "the key is not the one the evidence bound"}}
			}
		}
		json.NewEncoder(w).Encode(c)
	default:
		http.Error(w, "no", http.StatusNotFound)
	}
}

func (f *fakeCSRAPI) sign(csrPEM []byte) []byte {
	block, _ := pem.Decode(csrPEM)
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		f.t.Errorf("the agent's CSR: %v", err)
		return nil
	}
	now := time.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: req.Subject,
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, f.ca, req.PublicKey, f.caKey)
	if err != nil {
		f.t.Errorf("sign: %v", err)
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// world is a fake API server and a node's files: the bootstrap
// kubeconfig (as the MCS renders it: CA data and a token) in dir.
type world struct {
	api  *fakeCSRAPI
	srv  *httptest.Server
	dir  string
	cfg  Config
	key  *ecdsa.PrivateKey
	boot string
}

func newWorld(t *testing.T, decide string) *world {
	t.Helper()
	caKey := newKey(t)
	caDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kube-apiserver-client-kubelet-signer"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign,
	}, &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kube-apiserver-client-kubelet-signer"}, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	api := &fakeCSRAPI{t: t, token: "abcdef.0123456789abcdef", decide: decide, csrs: map[string]*CSR{}, ca: ca, caKey: caKey}
	srv := httptest.NewTLSServer(api)
	t.Cleanup(srv.Close)
	serverCA := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	dir := t.TempDir()
	boot := filepath.Join(dir, "etc/kubernetes/kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: %s
    server: %s
  name: local
contexts:
- context:
    cluster: local
    user: kubelet
  name: kubelet
current-context: kubelet
kind: Config
preferences: {}
users:
- name: kubelet
  user:
    token: %s
`, base64.StdEncoding.EncodeToString(serverCA), srv.URL, api.token)
	if err := os.MkdirAll(filepath.Dir(boot), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(boot, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	key := newKey(t)
	return &world{api: api, srv: srv, dir: dir, key: key, boot: boot, cfg: Config{
		BootstrapKubeconfig: boot, Kubeconfig: filepath.Join(dir, "var/lib/kubelet/kubeconfig"),
		CertDir: filepath.Join(dir, "var/lib/kubelet/pki"), NodeName: "worker-0", Key: key,
	}}
}

// TestBootstrap: the agent's CSR is the kubelet's (signer, usages,
// subject, the bound key), and what it writes is what the kubelet reads:
// the pair in kubelet-client-<time>.pem (0600) behind the symlink
// kubelet-client-current.pem, and a kubeconfig client-go loads, with the
// bootstrap kubeconfig's server and CA and the current pair.
func TestBootstrap(t *testing.T) {
	w := newWorld(t, "approve")
	w.api.fail5xx = 2 // retried
	var console bytes.Buffer
	w.cfg.Console = &console
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Bootstrap(ctx, w.cfg)
	if err != nil {
		t.Fatalf("Bootstrap: %v\n%s", err, console.String())
	}
	if res.Approval.Reason != "NodeproofAttestedTPM" || !strings.HasPrefix(res.CSR, "node-csr-") {
		t.Errorf("result %+v", res)
	}
	current := filepath.Join(w.cfg.CertDir, "kubelet-client-current.pem")
	target, err := os.Readlink(current)
	if err != nil {
		t.Fatal(err)
	}
	if target != res.Path || !strings.HasPrefix(filepath.Base(target), "kubelet-client-") || filepath.Dir(target) != w.cfg.CertDir {
		t.Errorf("kubelet-client-current.pem -> %s; result path %s", target, res.Path)
	}
	if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v, mode %v; want 0600", target, err, fi.Mode())
	}
	c, err := ValidPair(current, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	mine, _ := x509.MarshalPKIXPublicKey(&w.key.PublicKey)
	if !bytes.Equal(c.RawSubjectPublicKeyInfo, mine) || c.Subject.CommonName != "system:node:worker-0" || c.Subject.Organization[0] != "system:nodes" {
		t.Errorf("certificate %s: not the bound key's or not the node's", c.Subject)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", w.cfg.Kubeconfig)
	if err != nil {
		t.Fatalf("client-go does not load the kubeconfig: %v", err)
	}
	if rc.Host != w.srv.URL || rc.CertFile != current || rc.KeyFile != current || len(rc.CAData) == 0 {
		t.Errorf("kubeconfig: host %s, cert %s, key %s, CA %d bytes", rc.Host, rc.CertFile, rc.KeyFile, len(rc.CAData))
	}
	if fi, err := os.Stat(w.cfg.Kubeconfig); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig: %v, mode %v", err, fi.Mode())
	}
	if !strings.Contains(console.String(), "retrying") {
		t.Errorf("the console does not say the 503s were retried:\n%s", console.String())
	}

	// Again: a valid certificate is there, nothing is asked.
	before := w.api.requests
	res2, err := Bootstrap(ctx, w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res2.CSR != "" || w.api.requests != before {
		t.Errorf("the second run made CSR %q (%d requests); a valid certificate was there", res2.CSR, w.api.requests-before)
	}
}

// TestBootstrapRefused: a denied CSR, an unknown token and an undecided
// CSR each end the bootstrap with an error that says why, and nothing is
// written for the kubelet.
func TestBootstrapRefused(t *testing.T) {
	for _, tc := range []struct {
		name, decide, token string
		timeout             time.Duration
		refused             bool
		want                string
	}{
		{name: "denied", decide: "deny", refused: true, want: "Denied (NodeproofKeyNotBound"},
		{name: "a token the API server does not know", decide: "approve", token: "other.token", refused: true, want: "HTTP 401"},
		{name: "never decided", decide: "", timeout: 2 * time.Second, want: "context deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, tc.decide)
			if tc.token != "" {
				w.api.token = tc.token
			}
			if tc.timeout == 0 {
				tc.timeout = 30 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			_, err := Bootstrap(ctx, w.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrRefused) != tc.refused {
				t.Fatalf("Bootstrap: %v; want %q, refused %v", err, tc.want, tc.refused)
			}
			for _, f := range []string{filepath.Join(w.cfg.CertDir, "kubelet-client-current.pem"), w.cfg.Kubeconfig} {
				if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s written after a failed bootstrap", f)
				}
			}
		})
	}
}

// TestSubmitAgain: a CSR submitted before (its answer lost) is found
// again by name; one with another key under that name is refused.
func TestSubmitAgain(t *testing.T) {
	w := newWorld(t, "")
	raw, _ := os.ReadFile(w.boot)
	kc, err := ParseKubeconfig(raw, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(kc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req, _ := MakeCSR(w.key, "worker-0")
	n1, err := c.Submit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	req2, _ := MakeCSR(w.key, "worker-0") // the same key and subject, another signature
	n2, err := c.Submit(ctx, req2)
	if err != nil || n2 != n1 {
		t.Fatalf("submitted again: %s, %v; want %s", n2, err, n1)
	}
	w.api.csrs[n1].Spec.Request, _ = MakeCSR(newKey(t), "worker-0")
	if _, err := c.Submit(ctx, req); !errors.Is(err, ErrRefused) {
		t.Errorf("a CSR of that name with another key: %v; want refused", err)
	}
}

func TestParseKubeconfig(t *testing.T) {
	ca := base64.StdEncoding.EncodeToString([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), []byte("CA"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("tok.en\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	one := func(cluster, user string) string {
		return "clusters:\n- name: c\n  cluster:\n" + cluster + "users:\n- name: u\n  user:\n" + user
	}
	for _, tc := range []struct {
		name, in, want, err string
	}{
		{name: "inline CA and token", in: one("    server: https://api:6443\n    certificate-authority-data: "+ca+"\n", "    token: t1\n"), want: "https://api:6443 t1"},
		{name: "CA and token files relative to the kubeconfig", in: one("    server: https://api:6443/\n    certificate-authority: ca.crt\n", "    tokenFile: token\n"), want: "https://api:6443 tok.en"},
		{name: "the current context chooses", in: "current-context: b\ncontexts:\n- name: a\n  context: {cluster: x, user: y}\n- name: b\n  context: {cluster: c, user: u}\n" + one("    server: https://b\n    certificate-authority-data: "+ca+"\n", "    token: t2\n"), want: "https://b t2"},
		{name: "plain http", in: one("    server: http://api:6443\n    certificate-authority-data: "+ca+"\n", "    token: t\n"), err: "not an https URL"},
		{name: "insecure-skip-tls-verify", in: one("    server: https://api\n    insecure-skip-tls-verify: true\n", "    token: t\n"), err: "insecure-skip-tls-verify"},
		{name: "no CA", in: one("    server: https://api\n", "    token: t\n"), err: "no certificate authority"},
		{name: "no token", in: one("    server: https://api\n    certificate-authority-data: "+ca+"\n", "    username: u\n"), err: "has no token"},
		{name: "a current context not there", in: "current-context: z\n" + one("    server: https://api\n", "    token: t\n"), err: `no context "z"`},
		{name: "not YAML", in: "{{", err: "kubeconfig:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := ParseKubeconfig([]byte(tc.in), dir)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v; want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := k.Server + " " + k.Token; got != tc.want || len(k.CA) == 0 {
				t.Errorf("%q (CA %d bytes); want %q", got, len(k.CA), tc.want)
			}
		})
	}
}

// FuzzParseKubeconfig: any input parses or is an error, never a panic.
func FuzzParseKubeconfig(f *testing.F) {
	f.Add([]byte("clusters:\n- name: c\n  cluster:\n    server: https://a\n    certificate-authority-data: QQ==\nusers:\n- name: u\n  user:\n    token: t\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseKubeconfig(b, "")
		if err == nil && (!strings.HasPrefix(k.Server, "https://") || k.Token == "") {
			t.Errorf("accepted %q without https or token: %+v", b, k)
		}
	})
}
