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

// commands is every nodeproof command: the one place their usage is built
// from (usage.go; docs/cli.md says how to add one).
func commands() []command {
	return []command{
		{name: "serve", aliases: []string{"bootstrap", "start"}, run: cmdServe,
			summary: "run the Machine Config Server",
			about: "Directory mode: --server-basedir (an MCO bootstrap directory) and --bootstrap-kubeconfig.\n" +
				"Cluster mode: --kubeconfig (or the in-cluster service account) and --apiserver-url.\n" +
				"The policy (--policy) says what each pool serves to whom: docs/policy.md."},
		{name: "approve", run: cmdApprove,
			summary: "run the CSR approver (kubelet CSRs approved with attestation evidence)"},
		{name: "release", args: "NODE", run: cmdRelease,
			summary: "free a node name from the machine that owns it, so another (or the same, reinstalled) may enrol; a ban stays"},
		{name: "revoke", args: "NODE | --identity ID", run: cmdRevoke,
			summary: "ban the machine: refused everything, under any name, until unban; its node is tainted NoExecute"},
		{name: "unban", args: "NODE | --identity ID", run: cmdUnban,
			summary: "lift a ban"},
		{name: "adopt", args: "NODE", run: cmdAdopt,
			summary: "let a pool with requested names bind the name of a Node that existed before nodeproof"},
		{name: "inspect", args: "[NODE | pool NAME]", run: cmdInspect,
			summary: "list nodes (owner, last attestation, state), one node's whole story, or what a pool serves before approval"},
		{name: "policy", summary: "check a policy, or learn one from a machine you trust", actions: []action{
			{name: "check", args: "FILE", run: cmdPolicyCheck,
				summary: "validate a policy; with --against-records, judge every node's last claims by it (exits 1 when any would fail)"},
			{name: "learn", run: cmdPolicyLearn,
				summary: "a pool policy from a trusted machine's event log (--event-log, --evidence) or an enrolled node's claims (--node); or reference values (digests, signers, SBAT) from the boot files themselves (--efi)"},
		}},
		{name: "enroll", run: cmdEnroll,
			summary: "--reset NODE: the same as release NODE (--reset KEY clears a single-use marker)"},
		{name: "ca", run: cmdCA, defaultAction: "show",
			summary: "the MCS CA and serving certificate: show them (made on first use, renewed when due) or rotate them now",
			actions: []action{
				{name: "show", summary: "print where the CA bundle and serving certificate are and until when they are valid; make what is missing, renew what is due"},
				{name: "rotate", summary: "a new CA, cross-signed by the old one (kept in the bundle), as at 80% of its life; --serving-only: a new serving certificate"},
			}},
		{name: "pointer", run: cmdPointer,
			summary: "write an Ignition pointer config for a pool"},
		{name: "token", run: cmdToken, defaultAction: "show",
			summary: "the provisioning token (the token tier)",
			actions: []action{
				{name: "show", summary: "print the current token"},
				{name: "rotate", summary: "make a new token and print it; the previous one stays valid for --grace"},
			}},
		{name: "keys", run: cmdKeys,
			summary: "the keyring that seals sessions and config tokens",
			actions: []action{
				{name: "rotate", summary: "add a new key (made with the keyring on first use) that seals from --activate-after on; older keys are kept --retain after they stopped sealing, and it prints what it kept and until when"},
			}},
		{name: "store", run: cmdStore,
			summary: "the embedded store (state.db): check it, back it up (also while the server runs), restore a backup",
			actions: []action{
				{name: "check", summary: "check the store whole (through the running server when one answers on its admin socket); --file: check a backup"},
				{name: "backup", summary: "write a consistent copy to --out (through the running server when one answers), checked before it is kept"},
				{name: "restore", summary: "with the server stopped: put the backup --from in place (checked first; the replaced file is kept) and reset the commit marker"},
			}},
		devTPMCommand(),
		{name: "version", run: cmdVersion, summary: "print the version"},
	}
}

// Run runs the command line args (without the program name) and returns
// the exit code: 0 done (and -h), 1 failed, 2 a command line that does
// not fit the usage.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 {
		topUsage(stderr, cmds)
		return 2
	}
	name, rest := args[0], args[1:]
	switch {
	case isHelp(name):
		if len(rest) == 0 {
			topUsage(stdout, cmds)
			return 0
		}
		// help CMD [ACTION]: CMD [ACTION] -h.
		name, rest = rest[0], append(rest[1:], "-h")
	}
	c := lookup(cmds, name)
	if len(rest) > 0 {
		// Two-word commands: dev tpm.
		if c2 := lookup(cmds, name+" "+rest[0]); c2 != nil {
			c, rest = c2, rest[1:]
		}
	}
	if c == nil {
		if group := groupOf(cmds, name); len(group) > 0 {
			w, code := stderr, 2
			if len(rest) > 0 && isHelp(rest[0]) {
				w, code = stdout, 0
			}
			fmt.Fprintf(w, "nodeproof %s: one of:\n", name)
			topUsage(w, group)
			return code
		}
		fmt.Fprintf(stderr, "nodeproof: unknown command %q\n\n", name)
		topUsage(stderr, cmds)
		return 2
	}
	err := runCommand(ctx, c, rest, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.Is(err, errFailed):
		return 1 // the command has said why
	}
	fmt.Fprintf(stderr, "nodeproof %v\n", err) // runCommand prefixed what ran
	return 1
}

// errFailed is a command's failure it has already reported (exit 1).
var errFailed = errors.New("failed")

func cmdVersion(_ context.Context, in *invocation) error {
	if _, err := in.exactly(0); err != nil {
		return err
	}
	fmt.Fprintln(in.stdout, "nodeproof", Version)
	return nil
}

func cmdServe(ctx context.Context, in *invocation) error {
	var c ServeConfig
	fs := in.flags()
	finish := serveFlags(fs, &c)
	logFormat := fs.String("log-format", "json", "json or text")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	finish()
	var h slog.Handler = slog.NewJSONHandler(in.stderr, nil)
	if *logFormat == "text" {
		h = slog.NewTextHandler(in.stderr, nil)
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
		if ca, tok, err = pointerFromCluster(kubeconfig, certsNS, tokenNS, *caFile, *stateToken, ServeConfig{Reload: reload}.settle()); err != nil {
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

func cmdToken(_ context.Context, in *invocation) error {
	stdout := in.stdout
	fs := in.flags()
	var dir, kubeconfig, ns string
	stateDirFlag(fs, &dir)
	grace := fs.Duration("grace", 24*time.Hour, "how long the previous token stays valid after a rotation (serve's --token-grace)")
	kubeconfigFlag(fs, &kubeconfig)
	tokenNamespaceFlag(fs, &ns)
	if _, err := in.exactly(0); err != nil {
		return err
	}
	action := in.action
	var p *tokens.Provisioning
	if kubeconfig != "" {
		cfg, err := restConfig(kubeconfig)
		if err != nil {
			return err
		}
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		if p, err = tokens.Open(context.Background(), &cluster.TokenSecret{Client: kc, Namespace: ns}, *grace, time.Now, true); err != nil {
			return fmt.Errorf("%w (is the server's --token-secret-namespace another? deploy/base keeps the token in nodeproof)", err)
		}
	} else {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		var err error
		if p, err = tokens.LoadProvisioning(filepath.Join(dir, "tokens.json"), *grace, time.Now); err != nil {
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

func cmdKeys(_ context.Context, in *invocation) error {
	fs := in.flags()
	var dir string
	stateDirFlag(fs, &dir)
	var keysFile string
	keysFileFlag(fs, &keysFile)
	retain := fs.Duration("retain", seal.DefaultRetain, "keep an older key this long after it stopped sealing (after the new key took over); must exceed the longest config token and session life")
	activate := fs.Duration("activate-after", seal.DefaultActivateAfter, "the new key seals only after this delay (every replica must have reloaded the file by then); 0 for a single server")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	if *retain < 0 || *activate < 0 {
		return in.usageError("--retain and --activate-after cannot be negative")
	}
	return rotateKeys(in.stdout, orDefault(keysFile, filepath.Join(dir, "keys.json")), *retain, *activate, time.Now)
}

// rotateKeys rotates the keyring at path and says what it kept, until
// when, and what it dropped.
func rotateKeys(stdout io.Writer, path string, retain, activate time.Duration, clock func() time.Time) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	k, err := seal.LoadOrCreate(path, clock)
	if err != nil {
		return err
	}
	rot, err := k.Rotate(retain, activate)
	if err != nil {
		return err
	}
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	fmt.Fprintf(stdout, "rotated %s; the new key %s seals from %s\n", path, rot.New.ID, ts(rot.New.SealsFrom))
	for _, st := range rot.Kept {
		fmt.Fprintf(stdout, "kept key %s (made %s): it seals until %s and opens what it sealed until %s\n",
			st.ID, ts(st.Created), ts(st.SealsUntil), ts(st.KeptUntil))
	}
	for _, st := range rot.Dropped {
		fmt.Fprintf(stdout, "dropped key %s (made %s): it stopped sealing at %s, more than --retain %s ago\n",
			st.ID, ts(st.Created), ts(st.SealsUntil), retain)
	}
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
