// Command kubelet-csr runs in the live boot's guest (internal/liveboot):
// it does what the kubelet's TLS bootstrap does on a node's first boot,
// with the same client-go code the other end-to-end tests use. It reads
// the bootstrap kubeconfig from the Ignition config the node got (the
// file /etc/kubernetes/kubeconfig of Ignition's cached config), makes the
// kubelet's client CSR (CN system:node:<node>, O system:nodes) with the
// key the agent bound into its attestation, submits it with the bootstrap
// token's credentials and waits for the decision, which it prints:
//
//	kubelet-csr: CSR csr-abcde Approved NodeproofAttestedTPM: <message>
//
// Exit 0 approved, 3 denied, 1 anything else.
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto"
	"crypto/x509/pkix"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/coreos/ignition/v2/config"
	"github.com/vincent-petithory/dataurl"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
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
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	cond, name, err := run(ctx, *ign, *keyFile, *node)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-csr: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("kubelet-csr: CSR %s %s %s: %s\n", name, cond.Type, cond.Reason, oneLine(cond.Message))
	if cond.Type != certv1.CertificateApproved {
		os.Exit(3)
	}
}

func run(ctx context.Context, ignFile, keyFile, node string) (certv1.CertificateSigningRequestCondition, string, error) {
	var none certv1.CertificateSigningRequestCondition
	if ignFile == "" || node == "" {
		return none, "", errors.New("--ignition-config and --node are required")
	}
	kubeconfig, err := fileOf(ignFile, kubeconfigPath)
	if err != nil {
		return none, "", err
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return none, "", fmt.Errorf("the served kubeconfig: %w", err)
	}
	rc.Timeout = 30 * time.Second
	k, err := keyutil.PrivateKeyFromFile(keyFile)
	if err != nil {
		return none, "", fmt.Errorf("kubelet key: %w", err)
	}
	key, ok := k.(crypto.Signer)
	if !ok {
		return none, "", fmt.Errorf("kubelet key %s cannot sign", keyFile)
	}
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return none, "", err
	}
	data, err := cert.MakeCSR(key, &pkix.Name{Organization: []string{"system:nodes"}, CommonName: "system:node:" + node}, nil, nil)
	if err != nil {
		return none, "", err
	}
	name, _, err := csr.RequestCertificate(kc, data, "", certv1.KubeAPIServerClientKubeletSignerName, nil,
		[]certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, key)
	if err != nil {
		return none, "", fmt.Errorf("submit the CSR: %w", err)
	}
	fmt.Printf("kubelet-csr: submitted CSR %s for system:node:%s to %s\n", name, node, rc.Host)
	// No signer runs on the test's API server: the decision is the
	// approver's condition, not an issued certificate.
	for {
		got, err := kc.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, c := range got.Status.Conditions {
				if c.Type == certv1.CertificateApproved || c.Type == certv1.CertificateDenied {
					return c, name, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return none, name, fmt.Errorf("CSR %s undecided: %w (last error: %v)", name, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
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

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
