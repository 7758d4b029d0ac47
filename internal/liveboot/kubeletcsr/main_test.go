package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDescribe(t *testing.T) {
	dir := t.TempDir()
	agent, other := newKey(t), newKey(t)
	keyFile := filepath.Join(dir, "agent.key")
	der, err := x509.MarshalECPrivateKey(agent)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	node := pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes"}}
	for _, tc := range []struct {
		name    string
		subject pkix.Name
		key     *ecdsa.PrivateKey
		want    string
		ok      bool
	}{
		{"the bootstrap certificate: the agent's key", node, agent, "public key the agent's bound key", true},
		{"a renewal: the kubelet's own key", node, other, "public key another key than the agent's", true},
		{"another node's certificate", pkix.Name{CommonName: "system:node:n2", Organization: []string{"system:nodes"}}, agent, "CN=system:node:n2", false},
		{"not in system:nodes", pkix.Name{CommonName: "system:node:n1"}, agent, "CN=system:node:n1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			certFile := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
			if err := os.WriteFile(certFile, selfSigned(t, tc.subject, tc.key), 0o600); err != nil {
				t.Fatal(err)
			}
			line, ok, err := describe(certFile, keyFile, "n1")
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.ok || !strings.Contains(line, tc.want) {
				t.Errorf("describe: %q, %v; want %q in it, %v", line, ok, tc.want, tc.ok)
			}
		})
	}
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func selfSigned(t *testing.T, subject pkix.Name, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	now := time.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(7), Subject: subject,
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour)}, &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}}, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
