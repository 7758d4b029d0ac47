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
	"github.com/nodeproof/nodeproof/kubeletboot"
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
		k, err := kubeletboot.ParseKey(b)
		if err != nil {
			return nil, nil, fmt.Errorf("agent: %s: %w", path, err)
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

// DefaultBoundKeyPath is where the agent keeps its own copy of the
// kubelet key it bound into its evidence (--bound-key): the kubelet
// removes kubelet-client.key.tmp once its certificate is issued and
// rotates its key at each renewal, and the agent's re-attestations and
// failure reports must still prove the key the binding holds.
const DefaultBoundKeyPath = "/var/lib/nodeproof/kubelet-bound.key"

// BoundKey is the key the agent bound: the copy at keptPath when there,
// else LoadKubeletKey(kubeletPath), which it then keeps at keptPath
// (KeepKey). keptPath "" keeps no copy.
func BoundKey(keptPath, kubeletPath string) (*ecdsa.PrivateKey, []byte, error) {
	if keptPath != "" {
		if _, err := os.Stat(keptPath); err == nil {
			return LoadKubeletKey(keptPath)
		}
	}
	k, pub, err := LoadKubeletKey(kubeletPath)
	if err != nil {
		return nil, nil, err
	}
	if keptPath != "" {
		if err := KeepKey(keptPath, k); err != nil {
			return nil, nil, err
		}
	}
	return k, pub, nil
}

// KeepKey writes k to path (PEM "EC PRIVATE KEY", mode 0600, its
// directory 0700 when missing, atomically).
func KeepKey(path string, k *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("agent: bound key directory: %w", err)
	}
	if err := fsutil.WriteFileAtomic(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("agent: keep the bound key: %w", err)
	}
	return nil
}
