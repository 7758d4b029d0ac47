// Package cli is the nodeproof command: flags in, library calls out.
// cmd/nodeproof is a thin main over Run.
package cli

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/nodeproof/nodeproof/mcs/seal"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/pemcert"
	"github.com/nodeproof/nodeproof/safetext"
)

// Version is set at build time with -ldflags "-X ...cli.Version=...".
var Version = "dev"

const usage = `usage: nodeproof <command> [flags]

commands:
  serve      run the Machine Config Server (also: bootstrap, start — the OpenShift MCS's verbs)
  approve    run the CSR approver (kubelet CSRs approved with attestation evidence)
  release    NODE [--reason TEXT]: free a node name from the machine that owns it, so another (or the same, reinstalled) may enrol; a ban stays
  revoke     NODE | --identity ID [--reason TEXT]: ban the machine: refused everything, under any name, until unban; its node is tainted NoExecute
  unban      NODE | --identity ID [--reason TEXT]: lift a ban
  adopt      NODE [--reason TEXT]: let a pool with requested names bind the name of a Node that existed before nodeproof
  inspect    [NODE] [-o table|json|yaml]: list nodes (owner, last attestation, state), or one node's whole story
  policy     check FILE [--against-records]: validate a policy (with --against-records, judge every node's last claims by it); learn --pool NAME --event-log FILE [--merge FILE]: a pool policy from a machine you trust
  enroll     --reset NODE: the same as release NODE (--reset KEY clears a single-use marker)
  ca         create, renew, show or rotate (ca rotate [--serving-only]) the MCS CA and serving certificate
  pointer    write an Ignition pointer config for a pool
  token      show or rotate the provisioning token (the token tier)
  keys       rotate the keyring that seals sessions and config tokens
  version    print the version

"nodeproof <command> -h" lists a command's flags.
`

// Run runs the command line args (without the program name) and returns
// the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve", "bootstrap", "start":
		err = cmdServe(ctx, args[1:], stderr)
	case "approve":
		err = cmdApprove(ctx, args[1:], stderr)
	case "enroll":
		err = cmdEnroll(ctx, args[1:], stdout, stderr)
	case "release":
		err = cmdRelease(ctx, args[1:], stdout, stderr)
	case "revoke":
		err = cmdRevoke(ctx, args[1:], stdout, stderr)
	case "unban":
		err = cmdUnban(ctx, args[1:], stdout, stderr)
	case "adopt":
		err = cmdAdopt(ctx, args[1:], stdout, stderr)
	case "inspect":
		err = cmdInspect(ctx, args[1:], stdout, stderr)
	case "policy":
		err = cmdPolicy(ctx, args[1:], stdout, stderr)
	case "ca":
		err = cmdCA(args[1:], stdout, stderr)
	case "pointer":
		err = cmdPointer(args[1:], stdout, stderr)
	case "token":
		err = cmdToken(args[1:], stdout, stderr)
	case "keys":
		err = cmdKeys(args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "nodeproof", Version)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "nodeproof: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "nodeproof %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("nodeproof "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func cmdServe(ctx context.Context, args []string, stderr io.Writer) error {
	var c ServeConfig
	fs := newFlagSet("serve", stderr)
	finish := serveFlags(fs, &c)
	logFormat := fs.String("log-format", "json", "json or text")
	if err := fs.Parse(args); err != nil {
		return err
	}
	finish()
	var h slog.Handler = slog.NewJSONHandler(stderr, nil)
	if *logFormat == "text" {
		h = slog.NewTextHandler(stderr, nil)
	}
	c.Log, c.Clock = slog.New(safetext.Handler(h)), time.Now
	return Serve(ctx, c)
}

// cmdCA: nodeproof ca [show] | ca rotate [--serving-only]. Ensure runs
// either way (creating on first use, rotating what is due); rotate forces
// a CA rotation (cross-signed, the old CA kept in the bundle) or, with
// --serving-only, a new serving certificate. A running server serves the
// new certificate at its next handshake and the new bundle in its public
// tier and user-data Secrets at its next input check.
func cmdCA(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ca", stderr)
	dir := fs.String("state-dir", "/var/lib/nodeproof", "state directory (the CA lives in <state-dir>/certs)")
	hosts := fs.String("hosts", "localhost,127.0.0.1", "names and IPs of the serving certificate, comma-separated")
	bundle := fs.Bool("print-bundle", false, "print the CA bundle (PEM) to standard output")
	servingOnly := fs.Bool("serving-only", false, "with rotate: a new serving certificate, the CA kept")
	kubeconfig := fs.String("kubeconfig", "", "the CA kept in the cluster (serve --cert-store=cluster): this kubeconfig's cluster; empty: --state-dir")
	ns := fs.String("certs-namespace", kubecerts.DefaultNamespace, "with --kubeconfig: namespace of the certificate objects")
	action, err := parseAction(fs, args, "ca")
	if err != nil {
		return err
	}
	if *kubeconfig != "" {
		var names []string // the serving certificate's own, unless --hosts is given
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "hosts" {
				names = splitList(*hosts)
			}
		})
		return caInCluster(*kubeconfig, *ns, action, names, *bundle, *servingOnly, stdout)
	}
	o := certs.Options{Clock: time.Now, Hosts: splitList(*hosts)}
	switch action {
	case "", "show":
	case "rotate":
		o.RotateCA, o.RotateServing = !*servingOnly, *servingOnly
	default:
		return fmt.Errorf("ca: unknown action %q (show or rotate)", action)
	}
	st, err := certs.Ensure(filepath.Join(*dir, "certs"), o)
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
	cfg, err := restConfig(kubeconfig)
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

func cmdPointer(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("pointer", stderr)
	pool := fs.String("pool", "worker", "pool")
	url := fs.String("url", "", "the server, e.g. https://api-int.example:22623 (the /config/<pool> path is added)")
	caFile := fs.String("ca-bundle", "", "CA bundle PEM the node must trust (default: <state-dir>/certs/current/ca-bundle.crt)")
	stateDir := fs.String("state-dir", "/var/lib/nodeproof", "state directory of the server")
	tokenFile := fs.String("token-file", "", "provisioning token file to put in the pointer config")
	stateToken := fs.Bool("token", false, "put the server's current provisioning token (from --state-dir) in the pointer config")
	inURL := fs.Bool("token-in-url", false, "pass the token as ?token= rather than an Authorization header")
	version := fs.String("spec", pointer.DefaultVersion, "Ignition spec version of the pointer config")
	timeout := fs.Duration("http-total", 0, "ignition.timeouts.httpTotal (0: Ignition's default, retry forever)")
	out := fs.String("o", "", "write here instead of standard output")
	kubeconfig := fs.String("kubeconfig", "", "the bundle and token serve keeps in the cluster (--cert-store=cluster, --token-store=cluster): this kubeconfig's cluster")
	certsNS := fs.String("certs-namespace", kubecerts.DefaultNamespace, "with --kubeconfig: namespace of ConfigMap machine-config-server-ca")
	tokenNS := fs.String("token-secret-namespace", cluster.TokenSecretNamespace, "with --kubeconfig and --token: namespace of Secret machineconfig-auth")
	reload := fs.Duration("reload-interval", 10*time.Second, "with --kubeconfig and --token: serve's --reload-interval (a token newer than 3 times it is not yet known to every replica)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" {
		return errors.New("--url is required")
	}
	var ca []byte
	var tok string
	var err error
	if *kubeconfig != "" {
		if ca, tok, err = pointerFromCluster(*kubeconfig, *certsNS, *tokenNS, *caFile, *stateToken, ServeConfig{Reload: *reload}.settle()); err != nil {
			return err
		}
		*stateToken = false
	} else {
		if *caFile == "" {
			*caFile = filepath.Join(*stateDir, "certs", "current", certs.CABundleFileName)
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
		p, err := tokens.LoadProvisioning(filepath.Join(*stateDir, "tokens.json"), 0, time.Now)
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
	cfg, err := restConfig(kubeconfig)
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

func cmdToken(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("token", stderr)
	dir := fs.String("state-dir", "/var/lib/nodeproof", "state directory")
	grace := fs.Duration("grace", 24*time.Hour, "how long the previous token stays valid after a rotation")
	kubeconfig := fs.String("kubeconfig", "", "the token kept in the cluster (Secret machineconfig-auth, as serve --token-store=cluster keeps it): this kubeconfig's cluster; empty: --state-dir's file")
	ns := fs.String("namespace", cluster.TokenSecretNamespace, "with --kubeconfig: namespace of the Secret machineconfig-auth")
	action, err := parseAction(fs, args, "token")
	if err != nil {
		return err
	}
	var p *tokens.Provisioning
	if *kubeconfig != "" {
		cfg, err := restConfig(*kubeconfig)
		if err != nil {
			return err
		}
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		if p, err = tokens.Open(context.Background(), &cluster.TokenSecret{Client: kc, Namespace: *ns}, *grace, time.Now, true); err != nil {
			return err
		}
	} else {
		if err := os.MkdirAll(*dir, 0o700); err != nil {
			return err
		}
		if p, err = tokens.LoadProvisioning(filepath.Join(*dir, "tokens.json"), *grace, time.Now); err != nil {
			return err
		}
	}
	switch action {
	case "", "show":
	case "rotate":
		if err := p.Rotate(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("token: unknown action %q (show or rotate)", action)
	}
	fmt.Fprintln(stdout, p.Current())
	return nil
}

// parseAction parses flags, an action word, and flags after it
// (nodeproof token rotate --state-dir D).
func parseAction(fs *flag.FlagSet, args []string, cmd string) (string, error) {
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	action := fs.Arg(0)
	if fs.NArg() > 1 {
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return "", err
		}
		if fs.NArg() > 0 {
			return "", fmt.Errorf("%s: unexpected arguments %q", cmd, fs.Args())
		}
	}
	return action, nil
}

func cmdKeys(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys", stderr)
	dir := fs.String("state-dir", "/var/lib/nodeproof", "state directory")
	file := fs.String("keys-file", "", "keyring file (default <state-dir>/keys.json)")
	retain := fs.Duration("retain", 24*time.Hour, "keep older keys this long after their creation (must exceed the longest session or config token life)")
	activate := fs.Duration("activate-after", 2*time.Minute, "the new key seals only after this delay (every replica must have reloaded the file by then); 0 for a single server")
	if len(args) == 0 || args[0] != "rotate" {
		return errors.New("keys: the only action is rotate (nodeproof keys rotate [flags])")
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	path := orDefault(*file, filepath.Join(*dir, "keys.json"))
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	k, err := seal.LoadOrCreate(path, time.Now)
	if err != nil {
		return err
	}
	if err := k.Rotate(*retain, *activate); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rotated; the new key seals from %s\n", time.Now().Add(*activate).UTC().Format(time.RFC3339))
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, h := range strings.Split(s, ",") {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}
