package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/certs/kubecerts"
	"github.com/nodeproof/nodeproof/mcs/serve"
)

// cmdCA: nodeproof ca [show] | ca create | ca rotate [--serving-only].
// show is a view: it reads the CA and serving certificate and changes
// nothing (an empty state directory is an error that says how to make
// them). create makes them on first use (--hosts names the serving
// certificate) and renews what is due; it never changes the serving
// certificate's names — that is rotate's, explicitly. rotate forces a CA
// rotation (cross-signed, the old CA kept in the bundle) or, with
// --serving-only, a new serving certificate, for --hosts or the names it
// had. A running server serves the new certificate at its next handshake
// (and logs names that are not its --hosts) and the new bundle in its
// public tier and user-data Secrets at its next input check.
func cmdCA(_ context.Context, in *invocation) error {
	stdout := in.stdout
	fs := in.flags()
	var dir, kubeconfig, ns string
	stateDirFlag(fs, &dir)
	hosts := fs.String("hosts", "", "names and IPs of the serving certificate, comma-separated: create's (default localhost,127.0.0.1), or rotate's new ones (default: the certificate's own)")
	bundle := fs.Bool("print-bundle", false, "print the CA bundle (PEM) to standard output")
	servingOnly := fs.Bool("serving-only", false, "with rotate: a new serving certificate, the CA kept")
	kubeconfigFlag(fs, &kubeconfig)
	certsNamespaceFlag(fs, &ns)
	if _, err := in.exactly(0); err != nil {
		return err
	}
	action := in.action
	names := splitList(*hosts)
	if kubeconfig != "" {
		if action == "create" {
			return errors.New("ca create --kubeconfig: the server's leader makes the CA kept in the cluster (serve --cert-store=cluster); ca show --kubeconfig shows it")
		}
		return caInCluster(kubeconfig, ns, action, names, *bundle, *servingOnly, stdout)
	}
	certsDir := filepath.Join(dir, "certs")
	var st *certs.State
	var err error
	switch action {
	case "", "show":
		if *hosts != "" || *servingOnly {
			return errors.New("ca show is a view: it changes nothing (--hosts and --serving-only are create's and rotate's)")
		}
		if st, err = certs.Read(certsDir); errors.Is(err, certs.ErrNone) {
			return fmt.Errorf("%w: make them with `nodeproof ca create --state-dir %s --hosts NAMES` (the names Ignition reaches the server by), or start nodeproof serve --hosts NAMES, which makes them", err, dir)
		}
	case "create":
		if *servingOnly {
			return errors.New("ca create: --serving-only is rotate's")
		}
		if len(names) == 0 {
			names = []string{"localhost", "127.0.0.1"}
		}
		if cur, rerr := certs.Read(certsDir); rerr == nil {
			if have := certs.Names(cur.ServingCert); !sameNames(have, names) {
				return fmt.Errorf("ca create: the serving certificate in %s names %v, not %v; a running server and its machines use it: change its names explicitly with `nodeproof ca rotate --serving-only --hosts %s`", certsDir, have, names, strings.Join(names, ","))
			}
		}
		st, err = certs.Ensure(certsDir, certs.Options{Clock: time.Now, Hosts: names})
	case "rotate":
		if len(names) == 0 {
			cur, rerr := certs.Read(certsDir)
			if rerr != nil {
				return fmt.Errorf("ca rotate: %w", rerr)
			}
			names = certs.Names(cur.ServingCert)
		}
		st, err = certs.Ensure(certsDir, certs.Options{Clock: time.Now, Hosts: names, RotateCA: !*servingOnly, RotateServing: *servingOnly})
	default:
		return fmt.Errorf("ca: unknown action %q (show, create or rotate)", action)
	}
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
	fmt.Fprintf(stdout, "CA bundle:  %s (%d CA)\nserving:    %s for %v\nvalid to:   %s\n",
		st.CABundleFile, len(st.CABundle), st.ServingCertFile, certs.Names(st.ServingCert), st.ServingCert.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// sameNames reports whether two name lists hold the same names.
func sameNames(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(slices.Compact(x), slices.Compact(y))
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
		if len(hosts) == 0 {
			hosts = certs.Names(snap.Serving)
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
		certs.Names(snap.Serving),
		snap.Serving.NotAfter.UTC().Format(time.RFC3339), map[bool]string{true: "nodeproof", false: "not nodeproof (served as found)"}[snap.Owned])
	return nil
}
