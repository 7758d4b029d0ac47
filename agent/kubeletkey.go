package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nodeproof/nodeproof/fsutil"
)

// DefaultKubeletKeyPath is where the kubelet looks for the private key of
// its bootstrap CSR (certDir /var/lib/kubelet/pki, file
// kubelet-client.key.tmp, in k8s.io/kubernetes pkg/kubelet/certificate/
// bootstrap): a key already there is used, not replaced. Making it here,
// before the kubelet runs, is what lets the evidence bind the key the
// kubelet's CSR will carry.
const DefaultKubeletKeyPath = "/var/lib/kubelet/pki/kubelet-client.key.tmp"

// KubeletKey loads the kubelet's key from path, or makes one (ECDSA P-256,
// as the kubelet does) and writes it there (PEM "EC PRIVATE KEY", mode
// 0600, atomically), and returns its public key as PKIX DER. A file that
// exists but does not hold an ECDSA P-256 key is an error, not replaced.
func KubeletKey(path string) ([]byte, error) {
	_, pub, err := LoadKubeletKey(path)
	return pub, err
}

// LoadKubeletKey is KubeletKey that also returns the private key, which
// proves the node holds it (Client.KubeletKey).
func LoadKubeletKey(path string) (*ecdsa.PrivateKey, []byte, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		block, _ := pem.Decode(b)
		if block == nil || block.Type != "EC PRIVATE KEY" {
			return nil, nil, fmt.Errorf("agent: %s holds no EC PRIVATE KEY", path)
		}
		k, err := x509.ParseECPrivateKey(block.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("agent: %s: %w", path, err)
		}
		if k.Curve != elliptic.P256() {
			return nil, nil, fmt.Errorf("agent: %s is not a P-256 key", path)
		}
		pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
		return k, pub, err
	case !errors.Is(err, os.ErrNotExist):
		return nil, nil, fmt.Errorf("agent: kubelet key: %w", err)
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, nil, fmt.Errorf("agent: kubelet key directory: %w", err)
	}
	if err := fsutil.WriteFileAtomic(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, nil, fmt.Errorf("agent: write kubelet key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	return k, pub, err
}
