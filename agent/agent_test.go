package agent

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	ignconfig "github.com/coreos/ignition/v2/config"
	"k8s.io/client-go/util/keyutil"

	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/render"
)

// TestKubeletKey: the key the agent makes is one the kubelet's own loader
// (client-go keyutil, what LoadOrGenerateKeyFile reads) takes, and a
// second run binds the same key.
func TestKubeletKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pki", "kubelet-client.key.tmp")
	pub, err := KubeletKey(path)
	if err != nil {
		t.Fatal(err)
	}
	k, err := keyutil.PrivateKeyFromFile(path)
	if err != nil {
		t.Fatalf("the kubelet would not load the key: %v", err)
	}
	der, err := x509.MarshalPKIXPublicKey(k.(crypto.Signer).Public())
	if err != nil || string(der) != string(pub) {
		t.Fatal("the returned public key is not the file's")
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v %v", fi.Mode(), err)
	}
	again, err := KubeletKey(path)
	if err != nil || string(again) != string(pub) {
		t.Fatalf("a second run made another key: %v", err)
	}
	if err := os.WriteFile(path, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := KubeletKey(path); err == nil {
		t.Fatal("a file that is not a key was accepted (or replaced)")
	}
}

// TestWritePointer: Ignition's user config, pointing at the pool with the
// token header and the CA bundle.
func TestWritePointer(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	bundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	path, err := WritePointer(t.TempDir(), "https://mcs.example:22623/", "worker", bundle, "np1.token")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != UserConfigName {
		t.Fatalf("wrote %s", path)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("pointer file mode %v %v (it holds the token)", fi.Mode(), err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, rpt, err := ignconfig.Parse(b) // any 3.x, translated to the newest
	if err != nil || rpt.IsFatal() {
		t.Fatalf("pointer does not parse: %v %v", err, rpt)
	}
	m := cfg.Ignition.Config.Merge
	if len(m) != 1 || *m[0].Source != "https://mcs.example:22623/config/worker" {
		t.Fatalf("merge %+v", m)
	}
	if len(m[0].HTTPHeaders) != 1 || *m[0].HTTPHeaders[0].Value != "Bearer np1.token" {
		t.Fatalf("headers %+v", m[0].HTTPHeaders)
	}
	if len(cfg.Ignition.Security.TLS.CertificateAuthorities) != 1 {
		t.Fatal("no CA bundle")
	}
}

// TestWriteFirstBootFiles: from the full config the server renders, the
// first-boot files land under root with their contents, the kubeconfig
// last.
func TestWriteFirstBootFiles(t *testing.T) {
	in, err := render.LoadBootstrapDir("../deploy/examples/bootstrap")
	if err != nil {
		t.Fatal(err)
	}
	kc, err := os.ReadFile("../deploy/examples/bootstrap-kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	r, err := render.NewRenderer(in, render.Options{BootstrapKubeconfig: kc})
	if err != nil {
		t.Fatal(err)
	}
	full, err := r.Config("worker", render.TierFull, render.V3_5)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	wrote, err := WriteFirstBootFiles(root, full)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{render.KubeconfigPath, render.EncapsulatedPath, render.NodeAnnotationsPath} {
		if !slices.Contains(wrote, p) {
			t.Errorf("did not write %s (wrote %v)", p, wrote)
		}
	}
	if wrote[len(wrote)-1] != render.KubeconfigPath {
		t.Errorf("wrote %v: the kubeconfig, which marks the files complete, must come last", wrote)
	}
	for _, p := range wrote {
		if !slices.Contains(api.FirstBootFiles, p) {
			t.Errorf("wrote %s, which is not a first-boot file", p)
		}
	}
	got, err := os.ReadFile(filepath.Join(root, render.KubeconfigPath))
	if err != nil || string(got) != string(kc) {
		t.Fatalf("kubeconfig not written as served: %v", err)
	}
	if fi, _ := os.Stat(filepath.Join(root, render.KubeconfigPath)); fi.Mode().Perm()&0o077 != 0 && fi.Mode().Perm() != 0o644 {
		t.Errorf("kubeconfig mode %v", fi.Mode())
	}
	if _, err := WriteFirstBootFiles(root, []byte(`{"ignition":{"version":"3.5.0"}}`)); err == nil {
		t.Error("a config without first-boot files was accepted")
	}
}
