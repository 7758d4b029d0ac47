package cli

import (
	"context"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/certs/kubecerts"
	"github.com/nodeproof/nodeproof/mcs/serve"
)

// cmdCA: nodeproof ca [show] | ca rotate [--serving-only]. Ensure runs
// either way (creating on first use, rotating what is due); rotate forces
// a CA rotation (cross-signed, the old CA kept in the bundle) or, with
// --serving-only, a new serving certificate. A running server serves the
// new certificate at its next handshake and the new bundle in its public
// tier and user-data Secrets at its next input check.
func cmdCA(_ context.Context, in *invocation) error {
	stdout := in.stdout
	fs := in.flags()
	var dir, kubeconfig, ns string
	stateDirFlag(fs, &dir)
	hosts := fs.String("hosts", "localhost,127.0.0.1", "names and IPs of the serving certificate, comma-separated (with --kubeconfig and rotate: default the certificate's own)")
	bundle := fs.Bool("print-bundle", false, "print the CA bundle (PEM) to standard output")
	servingOnly := fs.Bool("serving-only", false, "with rotate: a new serving certificate, the CA kept")
	kubeconfigFlag(fs, &kubeconfig)
	certsNamespaceFlag(fs, &ns)
	if _, err := in.exactly(0); err != nil {
		return err
	}
	action := in.action
	if kubeconfig != "" {
		var names []string // the serving certificate's own, unless --hosts is given
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "hosts" {
				names = splitList(*hosts)
			}
		})
		return caInCluster(kubeconfig, ns, action, names, *bundle, *servingOnly, stdout)
	}
	o := certs.Options{Clock: time.Now, Hosts: splitList(*hosts)}
	switch action {
	case "", "show":
	case "rotate":
		o.RotateCA, o.RotateServing = !*servingOnly, *servingOnly
	default:
		return fmt.Errorf("ca: unknown action %q (show or rotate)", action)
	}
	st, err := certs.Ensure(filepath.Join(dir, "certs"), o)
	if err != nil {
		return err
	}
	if *bundle {
		_, err = stdout.Write(st.CABundlePEM)
		return err
	}
	for _, ch := range st.Changes {
		fmt.Fprintln(stdout, ch)
	}
	fmt.Fprintf(stdout, "CA bundle:  %s (%d CA)\nserving:    %s\nvalid to:   %s\n",
		st.CABundleFile, len(st.CABundle), st.ServingCertFile, st.ServingCert.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// caInCluster is `nodeproof ca --kubeconfig`: the objects serve
// --cert-store=cluster keeps. show reads them (creating nothing: the
// server's leader makes them); rotate rotates the CA (or, --serving-only,
// the serving certificate) now, as the leader does at 80%, writing with the
// resourceVersion read. The serving certificate keeps its names unless
// --hosts is given.
func caInCluster(kubeconfig, ns, action string, hosts []string, printBundle, servingOnly bool, stdout io.Writer) error {
	cfg, err := serve.RESTConfig(kubeconfig)
	if err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	read, err := kubecerts.New(kubecerts.Options{Client: kc, Namespace: ns, Clock: time.Now})
	if err != nil {
		return err
	}
	snap, err := read.Read(ctx)
	if err != nil {
		return err
	}
	var changes []string
	switch action {
	case "", "show":
	case "rotate":
		if hosts == nil {
			hosts = certNames(snap.Serving)
		}
		k, err := kubecerts.New(kubecerts.Options{Client: kc, Namespace: ns, Hosts: hosts, Clock: time.Now})
		if err != nil {
			return err
		}
		if servingOnly {
			snap, changes, err = k.RotateServing(ctx)
		} else {
			snap, changes, err = k.Ensure(ctx, true)
		}
		if err != nil {
			return err
		}
	default:
		return fmt.Errorf("ca: unknown action %q (show or rotate)", action)
	}
	if printBundle {
		_, err = stdout.Write(snap.BundlePEM)
		return err
	}
	for _, ch := range changes {
		fmt.Fprintln(stdout, ch)
	}
	fmt.Fprintf(stdout, "CA bundle:  ConfigMap %s/%s (%d CA)\nserving:    Secret %s/%s for %v\nvalid to:   %s\nowner:      %s\n",
		ns, kubecerts.CAName, strings.Count(string(snap.BundlePEM), "BEGIN CERTIFICATE"), ns, kubecerts.ServingName,
		certNames(snap.Serving),
		snap.Serving.NotAfter.UTC().Format(time.RFC3339), map[bool]string{true: "nodeproof", false: "not nodeproof (served as found)"}[snap.Owned])
	return nil
}

// certNames are a certificate's DNS names and IP addresses.
func certNames(c *x509.Certificate) []string {
	out := append([]string(nil), c.DNSNames...)
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}
