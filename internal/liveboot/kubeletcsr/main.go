// Command kubelet-csr runs in the live boot's guest (internal/liveboot):
// it does what the kubelet's TLS bootstrap does on a node's first boot,
// with the agent's CSR code (kubeletboot, which `nodeproof-agent
// kubelet-bootstrap` runs on a node). It reads
// the bootstrap kubeconfig from the Ignition config the node got (the
// file /etc/kubernetes/kubeconfig of Ignition's cached config), makes the
// kubelet's client CSR (CN system:node:<node>, O system:nodes) with the
// key the agent bound into its attestation, submits it with the bootstrap
// token's credentials and waits for the decision, which it prints:
//
//	kubelet-csr: CSR csr-abcde Approved NodeproofAttestedTPM: <message>
//
// Exit 0 approved, 3 denied, 1 anything else.
//
// Where the guest runs the real kubelet instead (Guest.Kubelet), it helps
// the shell script around it, which has busybox and nothing else:
//
//	kubelet-csr --ignition-config F --print-file P
//	  prints file P of the Ignition config F (the bootstrap kubeconfig);
//	kubelet-csr --check-cert PEM --key KEY --node N
//	  prints what the kubelet's certificate is, and whether its public key
//	  is KEY's (the key the agent bound into its evidence):
//	  kubelet-csr: client certificate CN=system:node:N,O=system:nodes,
//	  issuer …, serial …, valid … to …, public key the agent's bound key
//	  (SHA-256 …); exit 0 when the subject is the node's, 1 otherwise.
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/coreos/ignition/v2/config"
	"github.com/nodeproof/nodeproof/kubeletboot"
	"github.com/vincent-petithory/dataurl"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// kubeconfigPath is where the served config puts the bootstrap
// kubeconfig (mcs/render.KubeconfigPath).
const kubeconfigPath = "/etc/kubernetes/kubeconfig"

func main() {
	ign := flag.String("ignition-config", "", "Ignition's cached config (its fetch stage's -config-cache)")
	keyFile := flag.String("key", "/var/lib/kubelet/pki/kubelet-client.key.tmp", "the kubelet key the agent bound")
	node := flag.String("node", "", "the node's name")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	printFile := flag.String("print-file", "", "print this file of the Ignition config and exit")
	checkCert := flag.String("check-cert", "", "describe this certificate (PEM) against --key and exit")
	flag.Parse()
	switch {
	case *printFile != "":
		b, err := fileOf(*ign, *printFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kubelet-csr: %v\n", err)
			os.Exit(1)
		}
		os.Stdout.Write(b)
		return
	case *checkCert != "":
		line, ok, err := describe(*checkCert, *keyFile, *node)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kubelet-csr: %v\n", err)
			os.Exit(1)
		}
		fmt.Println("kubelet-csr: " + line)
		if !ok {
			os.Exit(1)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	cond, name, err := run(ctx, *ign, *keyFile, *node)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-csr: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("kubelet-csr: CSR %s %s %s: %s\n", name, cond.Type, cond.Reason, oneLine(cond.Message))
	if cond.Type != "Approved" {
		os.Exit(3)
	}
}

func run(ctx context.Context, ignFile, keyFile, node string) (kubeletboot.Condition, string, error) {
	var none kubeletboot.Condition
	if ignFile == "" || node == "" {
		return none, "", errors.New("--ignition-config and --node are required")
	}
	kubeconfig, err := fileOf(ignFile, kubeconfigPath)
	if err != nil {
		return none, "", err
	}
	kc, err := kubeletboot.ParseKubeconfig(kubeconfig, "")
	if err != nil {
		return none, "", fmt.Errorf("the served kubeconfig: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return none, "", fmt.Errorf("kubelet key: %w", err)
	}
	key, err := kubeletboot.ParseKey(keyPEM)
	if err != nil {
		return none, "", fmt.Errorf("kubelet key %s: %w", keyFile, err)
	}
	client, err := kubeletboot.NewClient(kc)
	if err != nil {
		return none, "", err
	}
	data, err := kubeletboot.MakeCSR(key, node)
	if err != nil {
		return none, "", err
	}
	name, err := client.Submit(ctx, data)
	if err != nil {
		return none, "", fmt.Errorf("submit the CSR: %w", err)
	}
	fmt.Printf("kubelet-csr: submitted CSR %s for system:node:%s to %s\n", name, node, kc.Server)
	// No signer runs on the test's API server: the decision is the
	// approver's condition, not an issued certificate.
	csr, err := client.Wait(ctx, name, false, 200*time.Millisecond)
	if csr != nil {
		cond, _ := csr.Decision()
		return cond, name, nil
	}
	return none, name, err
}

// fileOf returns the contents of path in an Ignition config (any spec
// version Ignition reads), from its data: URL.
func fileOf(ignFile, path string) ([]byte, error) {
	raw, err := os.ReadFile(ignFile)
	if err != nil {
		return nil, err
	}
	cfg, _, err := config.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ignFile, err)
	}
	for _, f := range cfg.Storage.Files {
		if f.Path != path || f.Contents.Source == nil {
			continue
		}
		du, err := dataurl.DecodeString(*f.Contents.Source)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		switch c := f.Contents.Compression; {
		case c == nil || *c == "":
			return du.Data, nil
		case *c == "gzip":
			zr, err := gzip.NewReader(bytes.NewReader(du.Data))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			return io.ReadAll(io.LimitReader(zr, 1<<20))
		default:
			return nil, fmt.Errorf("%s: compression %q", path, *c)
		}
	}
	return nil, fmt.Errorf("the Ignition config has no file %s: it is not the full (attested) config", path)
}

// describe says what the certificate in certFile (the kubelet's
// kubelet-client-current.pem: the certificate, then its key) is, and
// whether its public key is the one of keyFile; ok when its subject is
// the node's client identity.
func describe(certFile, keyFile, node string) (line string, ok bool, err error) {
	certs, err := cert.CertsFromFile(certFile)
	if err != nil {
		return "", false, err
	}
	c := certs[0]
	k, err := keyutil.PrivateKeyFromFile(keyFile)
	if err != nil {
		return "", false, fmt.Errorf("the agent's key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return "", false, fmt.Errorf("%s cannot sign", keyFile)
	}
	bound, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil {
		return "", false, err
	}
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	whose := "another key than the agent's (the kubelet's own)"
	if bytes.Equal(c.RawSubjectPublicKeyInfo, bound) {
		whose = "the agent's bound key"
	}
	line = fmt.Sprintf("client certificate %s, issuer %s, serial %x, valid %s to %s, public key %s (SHA-256 %x)",
		c.Subject, c.Issuer, c.SerialNumber, c.NotBefore.UTC().Format(time.TimeOnly), c.NotAfter.UTC().Format(time.TimeOnly), whose, sum[:8])
	want := pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}
	return line, c.Subject.String() == want.String(), nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
