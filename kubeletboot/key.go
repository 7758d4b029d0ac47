package kubeletboot

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
)

// ParseKey reads a kubelet key as the kubelet and the agent write it: one
// PEM "EC PRIVATE KEY" block holding a P-256 key.
func ParseKey(b []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "EC PRIVATE KEY" {
		return nil, errors.New("no EC PRIVATE KEY")
	}
	k, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	if k.Curve != elliptic.P256() {
		return nil, errors.New("not a P-256 key")
	}
	return k, nil
}
