package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/certs/kubecerts"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/pointer"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/pemcert"
)

func cmdPointer(_ context.Context, in *invocation) error {
	stdout := in.stdout
	fs := in.flags()
	var stateDir, kubeconfig, certsNS, tokenNS string
	var reload time.Duration
	pool := fs.String("pool", "worker", "pool")
	url := fs.String("url", "", "the server, e.g. https://api-int.example:22623 (the /config/<pool> path is added; required)")
	caFile := fs.String("ca-bundle", "", "CA bundle PEM the node must trust (default: <state-dir>/certs/current/ca-bundle.crt, or with --kubeconfig the cluster's ConfigMap machine-config-server-ca)")
	stateDirFlag(fs, &stateDir)
	tokenFile := fs.String("token-file", "", "provisioning token file to put in the pointer config")
	stateToken := fs.Bool("token", false, "put the server's current provisioning token (from --state-dir, or with --kubeconfig the cluster's Secret machineconfig-auth) in the pointer config")
	inURL := fs.Bool("token-in-url", false, "pass the token as ?token= rather than an Authorization header")
	version := fs.String("spec", pointer.DefaultVersion, "Ignition spec version of the pointer config")
	timeout := fs.Duration("http-total", 0, "ignition.timeouts.httpTotal (0: Ignition's default, retry forever)")
	out := fs.String("o", "", "write here instead of standard output")
	kubeconfigFlag(fs, &kubeconfig)
	certsNamespaceFlag(fs, &certsNS)
	tokenNamespaceFlag(fs, &tokenNS)
	reloadFlag(fs, &reload)
	if _, err := in.exactly(0); err != nil {
		return err
	}
	if *url == "" {
		return in.usageError("--url is required")
	}
	var ca []byte
	var tok string
	var err error
	if kubeconfig != "" {
		if ca, tok, err = pointerFromCluster(kubeconfig, certsNS, tokenNS, *caFile, *stateToken, serve.Config{Reload: reload}.Settle()); err != nil {
			return err
		}
		*stateToken = false
	} else {
		if *caFile == "" {
			*caFile = filepath.Join(stateDir, "certs", "current", certs.CABundleFileName)
		}
		if ca, err = os.ReadFile(*caFile); err != nil {
			return fmt.Errorf("CA bundle: %w", err)
		}
	}
	// A pointer config without the CA its server's certificate chains to
	// would fail at first boot: refuse a missing or broken bundle now.
	if _, err := pemcert.Parse(ca); err != nil {
		return fmt.Errorf("CA bundle: %w", err)
	}
	switch {
	case *tokenFile != "":
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return err
		}
		tok = strings.TrimSpace(string(b))
	case *stateToken:
		p, err := tokens.LoadProvisioning(filepath.Join(stateDir, "tokens.json"), 0, time.Now)
		if err != nil {
			return err
		}
		tok = p.Current()
	}
	b, err := pointer.Build(pointer.Options{
		URL: strings.TrimRight(*url, "/") + "/config/" + *pool, CABundle: ca, Token: tok, TokenInURL: *inURL,
		Version: *version, HTTPTotal: *timeout,
	})
	if err != nil {
		return err
	}
	if *out == "" {
		_, err = stdout.Write(append(b, '\n'))
		return err
	}
	return os.WriteFile(*out, append(b, '\n'), 0o600)
}

// pointerFromCluster reads the bundle (ConfigMap machine-config-server-ca,
// unless caFile is given) and, with withToken, the current provisioning
// token (Secret machineconfig-auth) from the cluster.
func pointerFromCluster(kubeconfig, certsNS, tokenNS, caFile string, withToken bool, settle time.Duration) ([]byte, string, error) {
	cfg, err := serve.RESTConfig(kubeconfig)
	if err != nil {
		return nil, "", err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ca []byte
	if caFile != "" {
		if ca, err = os.ReadFile(caFile); err != nil {
			return nil, "", fmt.Errorf("CA bundle: %w", err)
		}
	} else {
		cm, err := kc.CoreV1().ConfigMaps(certsNS).Get(ctx, kubecerts.CAName, metav1.GetOptions{})
		if err != nil {
			return nil, "", fmt.Errorf("CA bundle: %w", err)
		}
		ca = []byte(cm.Data[kubecerts.BundleKey])
	}
	if !withToken {
		return ca, "", nil
	}
	// The previous token is used only while it was retired less than
	// settle ago, and serve's --token-grace is longer than that (it must
	// exceed 3 x --reload-interval): read with a grace just past settle.
	p, err := tokens.Open(ctx, &cluster.TokenSecret{Client: kc, Namespace: tokenNS}, settle+time.Second, time.Now, false)
	if err != nil {
		return nil, "", err
	}
	// The token every replica knows: a token made in the last settle (3 x
	// serve's --reload-interval) waits, the previous one is still valid
	// meanwhile.
	return ca, p.Published(settle), nil
}
