package kubeletboot

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nodeproof/nodeproof/fsutil"
)

// Defaults: the paths OpenShift's kubelet.service passes
// (--bootstrap-kubeconfig, --kubeconfig, --cert-dir).
const (
	DefaultBootstrapKubeconfig = "/etc/kubernetes/kubeconfig"
	DefaultKubeconfig          = "/var/lib/kubelet/kubeconfig"
	DefaultCertDir             = "/var/lib/kubelet/pki"
)

// The kubelet's client pair in its certificate directory, as client-go's
// certificate FileStore names it (util/certificate, NewFileStore with
// pairNamePrefix "kubelet-client"): each certificate in
// kubelet-client-<2006-01-02-15-04-05>.pem (the certificate chain, then
// the key), kubelet-client-current.pem a symlink to the one in use,
// replaced through the symlink kubelet-client-updated.pem.
const (
	pairPrefix   = "kubelet-client"
	currentName  = pairPrefix + "-current.pem"
	updatedName  = pairPrefix + "-updated.pem"
	stampLayout  = "2006-01-02-15-04-05"
	pollInterval = time.Second
)

// Config is one bootstrap.
type Config struct {
	// BootstrapKubeconfig, Kubeconfig and CertDir are the kubelet's
	// (DefaultBootstrapKubeconfig, DefaultKubeconfig, DefaultCertDir).
	BootstrapKubeconfig, Kubeconfig, CertDir string
	// NodeName is the node's name: the CSR's CN system:node:NodeName.
	NodeName string
	// Key is the kubelet key the agent bound into its evidence.
	Key *ecdsa.PrivateKey
	// Clock tells the time (default time.Now).
	Clock func() time.Time
	// Console gets one line per step.
	Console io.Writer
}

// Result says what Bootstrap did.
type Result struct {
	// CSR is the CSR's name ("" when a valid certificate was there).
	CSR string
	// Approval is its Approved condition.
	Approval Condition
	// Cert is the kubelet's current client certificate.
	Cert *x509.Certificate
	// Path is the file kubelet-client-current.pem links to.
	Path string
}

// Bootstrap makes sure the kubelet has a client certificate before it
// starts. When CertDir's kubelet-client-current.pem holds a certificate
// valid now with its key, it only writes the kubeconfig if missing and
// returns. Otherwise it submits the client CSR with Key as the bootstrap
// kubeconfig's user, waits until it is approved and issued (retrying
// network errors and 5xx until ctx ends; a denial is ErrRefused, with the
// approver's reason), checks the certificate is for Key and the node, and
// writes the pair (0600) and the symlink, then the kubeconfig (0600), each
// atomically.
func Bootstrap(ctx context.Context, cfg Config) (Result, error) {
	if cfg.BootstrapKubeconfig == "" {
		cfg.BootstrapKubeconfig = DefaultBootstrapKubeconfig
	}
	if cfg.Kubeconfig == "" {
		cfg.Kubeconfig = DefaultKubeconfig
	}
	if cfg.CertDir == "" {
		cfg.CertDir = DefaultCertDir
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Console == nil {
		cfg.Console = io.Discard
	}
	if cfg.NodeName == "" || cfg.Key == nil {
		return Result{}, errors.New("kubeletboot: NodeName and Key are required")
	}
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Console, "nodeproof-agent: "+format+"\n", args...) }
	raw, err := readMax(cfg.BootstrapKubeconfig)
	if err != nil {
		return Result{}, fmt.Errorf("bootstrap kubeconfig: %w", err)
	}
	boot, err := ParseKubeconfig(raw, filepath.Dir(cfg.BootstrapKubeconfig))
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", cfg.BootstrapKubeconfig, err)
	}
	current := filepath.Join(cfg.CertDir, currentName)
	if c, err := ValidPair(current, cfg.Clock()); err == nil {
		say("kubelet client certificate %s valid until %s: nothing to bootstrap", current, c.NotAfter.UTC().Format(time.RFC3339))
		if _, err := os.Stat(cfg.Kubeconfig); errors.Is(err, os.ErrNotExist) {
			if err := writeKubeconfig(cfg.Kubeconfig, boot, current); err != nil {
				return Result{}, err
			}
		}
		return Result{Cert: c, Path: current}, nil
	}
	client, err := NewClient(boot)
	if err != nil {
		return Result{}, err
	}
	csrPEM, err := MakeCSR(cfg.Key, cfg.NodeName)
	if err != nil {
		return Result{}, err
	}
	var name string
	for {
		name, err = client.Submit(ctx, csrPEM)
		if err == nil || errors.Is(err, ErrRefused) {
			break
		}
		say("submitting the kubelet's client CSR to %s: %v; retrying", boot.Server, err)
		select {
		case <-ctx.Done():
			return Result{}, fmt.Errorf("submit the kubelet's client CSR: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(2 * time.Second):
		}
	}
	if err != nil {
		return Result{}, fmt.Errorf("submit the kubelet's client CSR: %w", err)
	}
	say("submitted the kubelet's client CSR %s for system:node:%s with the bound key to %s; waiting for its certificate", name, cfg.NodeName, boot.Server)
	csr, err := client.Wait(ctx, name, true, pollInterval)
	if err != nil {
		return Result{CSR: name}, err
	}
	approval, _ := csr.Decision()
	keyDER, err := x509.MarshalECPrivateKey(cfg.Key)
	if err != nil {
		return Result{}, err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	cert, err := checkIssued(csr.Status.Certificate, keyPEM, cfg.NodeName)
	if err != nil {
		return Result{CSR: name}, fmt.Errorf("CSR %s: %w", name, err)
	}
	path, err := storePair(cfg.CertDir, csr.Status.Certificate, keyPEM, cfg.Clock())
	if err != nil {
		return Result{CSR: name}, err
	}
	if err := writeKubeconfig(cfg.Kubeconfig, boot, current); err != nil {
		return Result{CSR: name}, err
	}
	say("CSR %s %s (%s); wrote %s (serial %x, valid until %s) and %s", name, approval.Type, approval.Reason, path, cert.SerialNumber, cert.NotAfter.UTC().Format(time.RFC3339), cfg.Kubeconfig)
	return Result{CSR: name, Approval: approval, Cert: cert, Path: path}, nil
}

// ValidPair loads the certificate and key at path (the kubelet's
// kubelet-client-current.pem) and returns the leaf when the key is its
// and it is valid at now.
func ValidPair(path string, now time.Time) (*x509.Certificate, error) {
	b, err := readMax(path)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(b, b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if now.Before(c.NotBefore) || !now.Before(c.NotAfter) {
		return nil, fmt.Errorf("%s is valid from %s to %s, not now", path, c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
	}
	return c, nil
}

// checkIssued: the issued certificate's leaf is for keyPEM's key and for
// the node's client identity.
func checkIssued(certPEM, keyPEM []byte, node string) (*x509.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("the issued certificate: %w", err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if c.Subject.CommonName != "system:node:"+node {
		return nil, fmt.Errorf("the issued certificate is for %s, not system:node:%s", c.Subject, node)
	}
	return c, nil
}

// storePair writes the certificate chain and the key into
// kubelet-client-<time>.pem (0600) and points kubelet-client-current.pem
// at it, as client-go's FileStore.Update does: a new symlink
// kubelet-client-updated.pem renamed over the current one.
func storePair(dir string, certPEM, keyPEM []byte, now time.Time) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var out []byte
	rest := certPEM
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type == "CERTIFICATE" {
			out = append(out, pem.EncodeToMemory(block)...)
		}
	}
	out = append(out, keyPEM...)
	path := filepath.Join(dir, pairPrefix+"-"+now.UTC().Format(stampLayout)+".pem")
	if err := fsutil.WriteFileAtomic(path, out, 0o600); err != nil {
		return "", err
	}
	updated := filepath.Join(dir, updatedName)
	if err := os.Remove(updated); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if err := os.Symlink(path, updated); err != nil {
		return "", err
	}
	if err := os.Rename(updated, filepath.Join(dir, currentName)); err != nil {
		return "", err
	}
	return path, nil
}

// writeKubeconfig writes the kubelet's kubeconfig as its bootstrap
// (bootstrap.LoadClientConfig, writeKubeconfigFromBootstrapping) does: the
// bootstrap kubeconfig's server and CA, the client pair at pairPath.
func writeKubeconfig(path string, boot Kubeconfig, pairPath string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: %s
    server: %s
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    namespace: default
    user: default-auth
  name: default-context
current-context: default-context
preferences: {}
users:
- name: default-auth
  user:
    client-certificate: %s
    client-key: %s
`, base64.StdEncoding.EncodeToString(boot.CA), boot.Server, pairPath, pairPath)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(path, []byte(kc), 0o600)
}
