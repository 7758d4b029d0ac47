package agent

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"testing"

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

// TestWriteUserConfig: the full config becomes Ignition's user config,
// readable by root only, replacing what was there whole.
func TestWriteUserConfig(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ignition")
	full := []byte(`{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"/etc/kubernetes/kubeconfig"}]}}`)
	for _, b := range [][]byte{[]byte(`{"ignition":{"version":"3.5.0"},"old":true}`), full} {
		path, err := WriteUserConfig(dir, b)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(path) != UserConfigName {
			t.Fatalf("wrote %s", path)
		}
	}
	path := filepath.Join(dir, UserConfigName)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("user config mode %v %v (it holds secrets)", fi.Mode(), err)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, full) {
		t.Fatalf("user config %q %v", got, err)
	}
	if _, rpt, err := ignconfig.Parse(full); err != nil || rpt.IsFatal() {
		t.Fatalf("does not parse: %v %v", err, rpt)
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
