package agentcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/kubeletboot"
)

// kubeletBootstrapUsage is the kubelet-bootstrap subcommand's usage.
const kubeletBootstrapUsage = `usage: nodeproof-agent kubelet-bootstrap [flags]

Before the kubelet starts: gets the kubelet's first client certificate with
the key the agent bound into its evidence (the kubelet's TLS bootstrap,
done as the kubelet does it: the bootstrap kubeconfig's token, CSR signer
kubernetes.io/kube-apiserver-client-kubelet, CN system:node:NODE), writes
it where the kubelet reads it (--cert-dir's kubelet-client-current.pem and
the --kubeconfig pointing at it), and keeps a copy of the key for the
agent's re-attestations (--bound-key). Does nothing when a valid
certificate is there. A kubelet that rotates its certificates then only
renews. Exit status: 0 done, 1 error, 2 usage, 3 the CSR was denied.
`

// kubeletBootstrap is `nodeproof-agent kubelet-bootstrap`.
func kubeletBootstrap(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nodeproof-agent kubelet-bootstrap", flag.ContinueOnError)
	bootKC := fs.String("bootstrap-kubeconfig", kubeletboot.DefaultBootstrapKubeconfig, "the bootstrap kubeconfig the attested config carried (the kubelet's --bootstrap-kubeconfig)")
	kc := fs.String("kubeconfig", kubeletboot.DefaultKubeconfig, "where the kubelet's kubeconfig is written (the kubelet's --kubeconfig)")
	certDir := fs.String("cert-dir", kubeletboot.DefaultCertDir, "the kubelet's certificate directory (its --cert-dir)")
	keyPath := fs.String("kubelet-key", agent.DefaultKubeletKeyPath, "the kubelet key the agent bound (read, never made here)")
	bound := fs.String("bound-key", agent.DefaultBoundKeyPath, "the agent's own copy of the bound key: used when there, else written from --kubelet-key")
	nodeName := fs.String("node-name", "", "the node's name (default: the host name, lower-cased, as the kubelet takes it)")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up waiting for the certificate after this long")
	if code, ok := parseFlags(fs, kubeletBootstrapUsage, args, stdout, stderr); !ok {
		return code
	}
	if *nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			fmt.Fprintf(stderr, "nodeproof-agent kubelet-bootstrap: --node-name: %v\n", err)
			return 2
		}
		*nodeName = strings.ToLower(h)
	}
	if _, err := os.Stat(*keyPath); err != nil {
		if _, kerr := os.Stat(*bound); kerr != nil {
			fmt.Fprintf(stderr, "nodeproof-agent kubelet-bootstrap: no bound key: %v (the agent's enrolment writes it)\n", err)
			return 1
		}
	}
	key, _, err := agent.BoundKey(*bound, *keyPath)
	if err != nil {
		fmt.Fprintf(stderr, "nodeproof-agent kubelet-bootstrap: %v\n", err)
		return 1
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	_, err = kubeletboot.Bootstrap(ctx, kubeletboot.Config{
		BootstrapKubeconfig: *bootKC, Kubeconfig: *kc, CertDir: *certDir,
		NodeName: *nodeName, Key: key, Console: stdout,
	})
	switch {
	case err == nil:
		return 0
	case errors.Is(err, kubeletboot.ErrRefused):
		fmt.Fprintf(stdout, "nodeproof-agent: REFUSED: the kubelet's client certificate: %v\n", err)
		fmt.Fprintln(stdout, "nodeproof-agent:   the approver's reason is above; nodeproof inspect NODE says more. The kubelet is not started with a certificate of its own key.")
		return agent.ExitRefused
	default:
		fmt.Fprintf(stderr, "nodeproof-agent kubelet-bootstrap: %v\n", err)
		return 1
	}
}
