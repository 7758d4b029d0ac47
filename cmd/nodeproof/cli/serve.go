package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/identity/gcp"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/dirsource"
	"github.com/nodeproof/nodeproof/mcs/limit"
	"github.com/nodeproof/nodeproof/mcs/proxied"
	"github.com/nodeproof/nodeproof/mcs/seal"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/metrics"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/adminsock"
	"github.com/nodeproof/nodeproof/store/boltstore"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// ServeConfig is everything `nodeproof serve` needs; flags fill it.
type ServeConfig struct {
	// The OpenShift MCS's own flags.
	SecurePort     int
	InsecurePort   int
	CertFile       string
	KeyFile        string
	TLSMinVersion  string
	TLSCipherSuite string
	ServerBasedir  string
	BootstrapKube  string
	Kubeconfig     string
	APIServerURL   string
	// TokenDir is cluster mode's node-bootstrapper service account secret
	// (token, ca.crt), mounted where the OpenShift MCS has it.
	TokenDir string
	// UserDataURL, in cluster mode, turns on keeping the
	// <role>-user-data-managed Secrets current (mcs/userdata): the server's
	// URL as machines reach it. UserDataRoles maps roles to pools.
	UserDataURL       string
	UserDataNamespace string
	UserDataRoles     map[string]string

	// CABundleFile, with CertFile, is the CA bundle that signed it (e.g.
	// the MCO's machine-config-server-ca ConfigMap, mounted): what pointer
	// configs, the public tier and the user-data Secrets carry. It is
	// re-read on every use, so a rotated bundle is picked up.
	CABundleFile string

	// nodeproof's.
	Policy   string
	StateDir string
	// KeysFile and TokensFile hold the sealing keyring and the provisioning
	// tokens (default: in StateDir). Replicas share them (a mounted Secret);
	// changes are picked up without a restart.
	KeysFile   string
	TokensFile string
	// GCPAudienceURL starts the audience of GCP identity tokens (default
	// https://<first host>:<secure port>); GCPJWKSURL is where Google's
	// signing keys are fetched.
	GCPAudienceURL string
	GCPJWKSURL     string
	// AWS evidence: the per-region certificates (empty: the ones shipped),
	// the document age window, and the optional EC2 live check.
	AWSCertsDir       string
	AWSMaxDocumentAge time.Duration
	AWSLiveRegion     string
	AWSEC2Endpoint    string
	AWSLiveVPCs       []string
	AWSLiveTags       map[string]string
	// Store is "embedded" (bbolt in StateDir; the directory mode's
	// default) or "kubernetes" (CRDs in StoreNamespace; the cluster
	// mode's default, which lets replicas share state).
	Store          string
	StoreNamespace string
	// KubeQPS and KubeBurst bound the server's API calls (six or so per
	// machine: token, markers, record, reads at fetch). client-go's
	// defaults (5, 10) would hold a scale-up to about one machine a
	// second; the API server's own priority and fairness protects it.
	KubeQPS   float64
	KubeBurst int
	Hosts     []string
	Listen    string // address to bind, default all
	// ProxyProtocolFrom are the load balancers that put a PROXY protocol
	// header (v1 or v2) in front of each connection: only they may, and
	// they must (mcs/proxied). Empty: PROXY protocol off.
	ProxyProtocolFrom []netip.Prefix
	// DebugAddr, if set, serves Go's pprof profiles (/debug/pprof/) there:
	// bind it to loopback; it is for finding where time goes.
	DebugAddr string
	// MetricsAddr, if set, serves Prometheus metrics (/metrics) there.
	MetricsAddr string
	// CertStore is where nodeproof keeps its CA and serving certificate
	// when --cert is not given: "cluster" (the default in cluster mode:
	// the MCO's objects, mcs/certs/kubecerts, in CertsNamespace) or
	// "state-dir" (StateDir/certs, the default in directory mode).
	CertStore      string
	CertsNamespace string
	// TokenStore is where the provisioning tokens are: "cluster" (the
	// default in cluster mode: Secret machineconfig-auth in
	// TokenSecretNamespace, seed 004; TokensFile's tokens, when the file
	// exists, are also accepted) or "file" (TokensFile).
	TokenStore           string
	TokenSecretNamespace string
	// TokenRotateEvery, when not zero, has the leader rotate the
	// provisioning token kept in the cluster this often.
	TokenRotateEvery time.Duration
	// Identity and the lease timings are the server's leader election
	// (Lease nodeproof-server in the store namespace), which decides who
	// writes what cluster mode keeps in the cluster.
	Identity                                  string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	TokenTTL                                  time.Duration
	Grace                                     time.Duration
	Reload                                    time.Duration // how often inputs and certificates are checked
	// Limits bound what one source address or identity may ask.
	Limits LimitConfig
	Clock  func() time.Time
	Log    *slog.Logger
	Ready  func(secure, insecure net.Addr) // called once both ports listen

	// bundleFrom, when set, is where caBundle reads (the cluster's objects).
	bundleFrom func() ([]byte, error)
}

// defaultPolicy serves the public tier of every pool and nothing else: a
// server started without a policy releases no secret.
const defaultPolicy = `apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
pools:
  default: {}
`

// serveFlags defines serve's flags on fs; the returned function finishes
// c after parsing.
func serveFlags(fs *flag.FlagSet, c *ServeConfig) func() {
	fs.IntVar(&c.SecurePort, "secure-port", 22623, "TLS port (Ignition)")
	fs.IntVar(&c.InsecurePort, "insecure-port", 22624, "plain-HTTP port (the public tier only unless policy says otherwise); 0 disables it")
	fs.StringVar(&c.CertFile, "cert", "", "serving certificate (PEM); default: nodeproof's own, in --state-dir/certs")
	fs.StringVar(&c.KeyFile, "key", "", "serving key (PEM), with --cert")
	fs.StringVar(&c.CABundleFile, "ca-bundle", "", "with --cert: the CA bundle (PEM) that signed it, for pointer configs, the public tier and the user-data Secrets; re-read when it changes")
	fs.StringVar(&c.TLSMinVersion, "tls-min-version", "VersionTLS12", "minimum TLS version: VersionTLS12 or VersionTLS13")
	fs.StringVar(&c.TLSCipherSuite, "tls-cipher-suites", "", "comma-separated IANA cipher suite names (TLS 1.2); default: ECDHE with AEAD only")
	fs.StringVar(&c.ServerBasedir, "server-basedir", "", "directory mode: an MCO bootstrap directory (machine-pools/, machine-configs/, controller-config/)")
	fs.StringVar(&c.BootstrapKube, "bootstrap-kubeconfig", "", "directory mode: the kubeconfig the full config carries for the kubelet")
	storeFlags(fs, c)
	fs.StringVar(&c.APIServerURL, "apiserver-url", "", "cluster mode: the API server URL nodes use (goes into the kubeconfigs served)")
	fs.StringVar(&c.TokenDir, "bootstrap-token-dir", "/etc/mcs/bootstrap-token", "cluster mode: the node-bootstrapper service account secret (token, ca.crt): the shared kubeconfig of the token tier, and the CA when the kubeconfig-data ConfigMap is absent")
	fs.StringVar(&c.Policy, "policy", "", "attestation and release policy (YAML); default: public tier only, no secrets")
	keysFileFlag(fs, &c.KeysFile)
	fs.StringVar(&c.TokensFile, "tokens-file", "", "provisioning tokens shared by replicas (default <state-dir>/tokens.json; created if missing)")
	fs.StringVar(&c.UserDataURL, "user-data-url", "", "cluster mode: keep the <role>-user-data-managed Secrets' pointer configs current, naming this server URL (e.g. https://api-int.example.com:22623); empty: off")
	fs.StringVar(&c.UserDataNamespace, "user-data-namespace", "openshift-machine-api", "cluster mode: namespace of the user-data Secrets")
	roles := fs.String("user-data-roles", "master=master,worker=worker", "cluster mode: role=pool pairs of the user-data Secrets")
	fs.StringVar(&c.GCPAudienceURL, "gcp-audience-url", "", "GCP evidence: the URL that starts identity tokens' audience (default https://<first --hosts name>:<secure port>)")
	fs.StringVar(&c.GCPJWKSURL, "gcp-jwks-url", gcp.GoogleJWKSURL, "GCP evidence: Google's signing keys (JWKS)")
	fs.StringVar(&c.AWSCertsDir, "aws-certs-dir", "", "AWS evidence: directory of <region>.pem certificates (default: AWS's published RSA-2048 certificates, shipped in identity/aws/certs)")
	fs.DurationVar(&c.AWSMaxDocumentAge, "aws-max-document-age", time.Hour, "AWS evidence: accept an identity document this long after the instance started (its pendingTime); the replay window")
	fs.StringVar(&c.AWSLiveRegion, "aws-live-check-region", "", "AWS evidence: confirm instances with EC2 DescribeInstances in this region (credentials: the AWS SDK's default chain — environment, shared config/credentials files, IRSA web identity, ECS, instance role); empty: no live check")
	fs.StringVar(&c.AWSEC2Endpoint, "aws-ec2-endpoint", "", "AWS live check: EC2 endpoint URL (default: the region's)")
	vpcs := fs.String("aws-live-check-vpcs", "", "AWS live check: comma-separated VPC IDs instances must be in")
	tags := fs.String("aws-live-check-tags", "", "AWS live check: comma-separated key=value tags instances must carry")
	fs.Float64Var(&c.KubeQPS, "kube-api-qps", 500, "cluster mode: API calls per second")
	fs.IntVar(&c.KubeBurst, "kube-api-burst", 1000, "cluster mode: API call burst")
	hosts := fs.String("hosts", "localhost,127.0.0.1", "names and IPs of the serving certificate nodeproof makes")
	fs.StringVar(&c.Listen, "listen", "", "address to bind both ports to (default: all)")
	fs.Func("proxy-protocol-from", "comma-separated CIDRs of load balancers (haproxy send-proxy or send-proxy-v2) whose PROXY protocol header gives each connection's client address, on both ports; only they may send one, and they must; empty: off", func(v string) (err error) {
		if c.ProxyProtocolFrom, err = proxied.ParseCIDRs(v); err == nil && len(c.ProxyProtocolFrom) == 0 {
			err = errors.New("no CIDR given")
		}
		return err
	})
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics (/metrics) here, e.g. :9091 (deploy/ sets it); empty: off")
	fs.StringVar(&c.DebugAddr, "debug-addr", "", "serve pprof profiles (/debug/pprof/) here, e.g. 127.0.0.1:6060; empty: off")
	fs.DurationVar(&c.TokenTTL, "config-token-ttl", 10*time.Minute, "life of a config token")
	fs.DurationVar(&c.Grace, "token-grace", 24*time.Hour, "how long a rotated-out provisioning token stays valid")
	reloadFlag(fs, &c.Reload)
	fs.StringVar(&c.CertStore, "cert-store", "", "where nodeproof keeps its CA and serving certificate without --cert: cluster (default in cluster mode: ConfigMap and Secret machine-config-server-ca, Secret machine-config-server-tls) or state-dir (default otherwise)")
	certsNamespaceFlag(fs, &c.CertsNamespace)
	fs.StringVar(&c.TokenStore, "token-store", "", "where the provisioning tokens are: cluster (default in cluster mode: Secret machineconfig-auth, key token; --tokens-file is still accepted when it exists) or file (--tokens-file)")
	tokenNamespaceFlag(fs, &c.TokenSecretNamespace)
	fs.DurationVar(&c.TokenRotateEvery, "token-rotate-every", 0, "--token-store=cluster: rotate the provisioning token this often (the previous one stays valid for --token-grace); 0: only by hand")
	fs.StringVar(&c.Identity, "leader-elect-id", "", "this replica's identity in the Lease nodeproof-server (default: $POD_NAME, else the host name)")
	fs.DurationVar(&c.LeaseDuration, "leader-elect-lease-duration", 15*time.Second, "leader election: how long another replica waits after the leader's last renewal")
	fs.DurationVar(&c.RenewDeadline, "leader-elect-renew-deadline", 10*time.Second, "leader election: the leader stops writing when it could not renew for this long")
	fs.DurationVar(&c.RetryPeriod, "leader-elect-retry-period", 2*time.Second, "leader election: how often the Lease is tried")
	limitFlags(fs, &c.Limits)
	return func() {
		c.AWSLiveVPCs = splitList(*vpcs)
		c.AWSLiveTags = map[string]string{}
		for _, kv := range splitList(*tags) {
			k, v, _ := strings.Cut(kv, "=")
			c.AWSLiveTags[k] = v
		}
		c.UserDataRoles = map[string]string{}
		for _, kv := range splitList(*roles) {
			role, pool, _ := strings.Cut(kv, "=")
			c.UserDataRoles[role] = pool
		}
		for _, h := range strings.Split(*hosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				c.Hosts = append(c.Hosts, h)
			}
		}
	}
}

// Serve runs the Machine Config Server until ctx ends: it checks the
// configuration, builds the server's parts (serverOptions), its config
// source (a directory or a cluster), then listens on both ports and keeps
// inputs, keys, tokens and certificates current until ctx ends.
func Serve(ctx context.Context, c ServeConfig) error {
	clusterMode, err := c.check()
	if err != nil {
		return err
	}
	// What cluster mode keeps in the cluster (certificates, tokens) is
	// there, or made by the leader, before anything is served.
	keeper, err := c.startKeeper(ctx, clusterMode)
	if err != nil {
		return err
	}
	if keeper.KeepsCertificates() {
		c.bundleFrom = keeper.CABundle
	}
	opts, conns, closeAll, err := c.serverOptions(ctx, clusterMode, keeper.Provisioning())
	if err != nil {
		return err
	}
	defer closeAll()
	// The certificates first: nodeproof's own CA bundle, made here on
	// first start, is what the sources put in the public tier.
	tlsConf, served, err := c.tlsConfig(keeper)
	if err != nil {
		return err
	}
	var src mcs.Source
	// The policy in force: the first one until the server runs, then
	// whatever a reload made it.
	var live atomic.Pointer[mcs.Server]
	policyNow := func() *policy.Policy {
		if s := live.Load(); s != nil {
			return s.Policy()
		}
		return opts.Policy
	}
	if clusterMode {
		var cls *cluster.Source
		if cls, err = c.clusterSource(policyNow, opts.Provisioning, keeper); err != nil {
			return err
		}
		// Refuse to start without what full configs need, rather than
		// answer every fetch 503; after the start, /healthz says it (for
		// the policy in force: a reload may turn the token tier on).
		if err := cls.Check(ctx, func() bool { return sharedKubeconfig(policyNow()) }); err != nil {
			return fmt.Errorf("serve: cluster mode cannot serve full configs: %w", err)
		}
		src, opts.Health = cls, cls.Health
	} else {
		src, err = dirsource.New(dirsource.Options{Dir: c.ServerBasedir, Kubeconfig: c.BootstrapKube, CABundle: c.caBundle, Reload: c.Reload, Log: c.Log})
	}
	if err != nil {
		return err
	}
	if opts.Configs, err = src.First(); err != nil {
		return err
	}
	opts.Bootstrap = src.Bootstrap()
	reg, m, err := serverMetrics()
	if err != nil {
		return err
	}
	opts.Metrics = m
	srv, err := mcs.New(opts)
	if err != nil {
		return err
	}
	live.Store(srv)
	ports, err := c.listen(srv, tlsConf, conns)
	if err != nil {
		return err
	}
	c.Log.Info("serving", "secure", ports.secure.String(), "insecure", fmt.Sprint(ports.insecure),
		"inputs", src.String(), "pools", strings.Join(opts.Configs.Pools(), ","), "stateDir", c.StateDir, "proxyProtocolFrom", fmt.Sprint(c.ProxyProtocolFrom))
	if c.MetricsAddr != "" {
		if err := errors.Join(listenerMetrics(reg, ports), certMetrics(reg, served, c.caBundle)); err != nil {
			ports.close()
			return err
		}
		addr, stop, err := metrics.Serve(c.MetricsAddr, reg)
		if err != nil {
			ports.close()
			return fmt.Errorf("serve: %w", err)
		}
		defer stop()
		c.Log.Info("metrics", "addr", addr.String())
	}
	if c.Ready != nil {
		c.Ready(ports.secure, ports.insecure)
	}
	if c.DebugAddr != "" {
		stopDebug, err := serveDebug(c.DebugAddr)
		if err != nil {
			ports.close()
			return err
		}
		defer stopDebug()
	}
	go src.Run(ctx, srv)
	prov := opts.Provisioning
	if keeper.Provisioning() != nil {
		prov = nil // the keeper keeps it current
	}
	reloader, err := newPolicyReloader(c, srv, reg)
	if err != nil {
		ports.close()
		return err
	}
	go c.maintain(ctx, clusterMode, opts.Store, opts.Keys, prov, served, reloader)
	ports.serve(ctx, c.Log)
	return nil
}

// check validates the flags that choose the mode and reports whether this
// is cluster mode.
func (c ServeConfig) check() (clusterMode bool, err error) {
	if c.Clock == nil || c.Log == nil {
		return false, errors.New("serve: Clock and Log are required")
	}
	if c.ServerBasedir == "" && c.Kubeconfig == "" && c.APIServerURL == "" {
		return false, errors.New("serve: give --server-basedir (directory mode) or --kubeconfig/--apiserver-url (cluster mode)")
	}
	clusterMode = c.Kubeconfig != "" || c.APIServerURL != ""
	switch {
	case clusterMode && c.ServerBasedir != "":
		return false, errors.New("serve: --server-basedir (directory mode) and --kubeconfig/--apiserver-url (cluster mode) exclude each other")
	case clusterMode && c.APIServerURL == "":
		return false, errors.New("serve: cluster mode needs --apiserver-url (the API server URL the served kubeconfigs name)")
	case !clusterMode && c.BootstrapKube == "":
		return false, errors.New("serve: directory mode needs --bootstrap-kubeconfig (the full config carries it)")
	case !slices.Contains([]string{"", storeCluster, storeStateDir}, c.CertStore):
		return false, fmt.Errorf("serve: --cert-store %q: want cluster or state-dir", c.CertStore)
	case !slices.Contains([]string{"", storeCluster, storeFile}, c.TokenStore):
		return false, fmt.Errorf("serve: --token-store %q: want cluster or file", c.TokenStore)
	case c.CertFile != "" && c.CertStore != "":
		return false, errors.New("serve: --cert and --cert-store exclude each other (with --cert nodeproof keeps no certificate)")
	case c.TokenRotateEvery < 0:
		return false, errors.New("serve: --token-rotate-every is negative")
	case c.TokenRotateEvery > 0 && c.tokenStore(clusterMode) != storeCluster:
		return false, errors.New("serve: --token-rotate-every needs the provisioning tokens in the cluster (--token-store=cluster, cluster mode)")
	case c.TokenRotateEvery > 0 && c.Grace <= c.settle():
		return false, fmt.Errorf("serve: --token-grace %s must be longer than 3 x --reload-interval (%s): a rotated-out token must stay valid until every replica and user-data Secret has the new one", c.Grace, c.settle())
	}
	return clusterMode, nil
}

// judge loads --policy and makes the verifiers of the evidence kinds it
// takes, from its trust roots: at start, and at every reload.
func (c ServeConfig) judge(ctx context.Context) (mcs.Judge, error) {
	var j mcs.Judge
	var err error
	if j.Policy, err = loadPolicy(c.Policy); err != nil {
		return j, err
	}
	if j.TPM, err = tpmVerifier(j.Policy, c.Clock); err != nil {
		return j, err
	}
	if j.GCP, err = c.gcpVerifier(j.Policy); err != nil {
		return j, err
	}
	if j.AWS, err = c.awsVerifier(ctx, j.Policy); err != nil {
		return j, err
	}
	return j, nil
}

// serverOptions builds everything an mcs.Server needs but its configs:
// the policy (its insecure choices logged), the verifiers of the evidence
// kinds the policy takes, the store, Events, sealing keys, provisioning
// tokens and admission limits (and those of the listeners, returned
// apart). closeAll releases what was opened.
func (c ServeConfig) serverOptions(ctx context.Context, clusterMode bool, prov *tokens.Provisioning) (o mcs.Options, conns limit.ListenerOptions, closeAll func(), err error) {
	var closers []func()
	release := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			release() // what was opened before the failure
		}
	}()
	if err = os.MkdirAll(c.StateDir, 0o700); err != nil {
		return o, conns, nil, fmt.Errorf("state dir: %w", err)
	}
	o = mcs.Options{ConfigTokenTTL: c.TokenTTL, Clock: c.Clock, Log: c.Log}
	j, err := c.judge(ctx)
	if err != nil {
		return o, conns, nil, err
	}
	for _, w := range j.Policy.Warnings() {
		c.Log.Warn("policy: " + w)
	}
	o.Policy, o.TPM, o.GCP, o.AWS = j.Policy, j.TPM, j.GCP, j.AWS
	if o.Store, err = c.openStore(clusterMode); err != nil {
		return o, conns, nil, err
	}
	closers = append(closers, func() { o.Store.Close() })
	if bs, ok := o.Store.(*boltstore.Store); ok {
		// Operators act on the running server's store through its admin
		// socket (bbolt locks the file): revoke, release, unban, adopt.
		as, err := adminsock.Listen(adminsock.Path(c.StateDir), bs, c.Log)
		if err != nil {
			return o, conns, nil, err
		}
		go func() {
			if err := as.Serve(); err != nil {
				c.Log.Error("admin socket stopped", "err", err.Error())
			}
		}()
		closers = append(closers, func() { as.Close() })
	}
	if clusterMode && o.Policy.TakesRequestedNames() {
		// A requested name of a Node nodeproof never owned is refused
		// until adopted: the Nodes' names from a watch, not a read per
		// enrolment.
		stop, err := c.watchNodes(ctx, &o)
		if err != nil {
			return o, conns, nil, err
		}
		closers = append(closers, stop)
	}
	if ks, ok := o.Store.(*kubestore.Store); ok {
		// A fetch reads the node's binding from a watch, not a GET.
		w, stop, err := c.watchBindings(ctx, ks)
		if err != nil {
			return o, conns, nil, err
		}
		closers = append(closers, stop)
		o.Store = w
	}
	kc, err := c.kubeClient(clusterMode)
	if err != nil {
		return o, conns, nil, err
	}
	if kc != nil {
		// Reports go through a client of their own: their writes cannot
		// hold up the decisions' behind one rate limiter.
		reports, err := c.kubeClient(clusterMode)
		if err != nil {
			return o, conns, nil, err
		}
		be := kubestore.NewBindingEvents(kc, reports, c.storeNamespace(), "nodeproof-server")
		if w, ok := o.Store.(*kubestore.Watched); ok {
			be.UIDs(w.UID) // kubectl describe nodebinding shows them
		}
		closers = append(closers, be.Close)
		o.Events = be
	}
	if o.Keys, err = seal.LoadOrCreate(orDefault(c.KeysFile, filepath.Join(c.StateDir, "keys.json")), c.Clock); err != nil {
		return o, conns, nil, err
	}
	o.Keys.SetMaxLife(c.sealedLife())
	if o.Provisioning = prov; prov == nil {
		if o.Provisioning, err = tokens.LoadProvisioning(orDefault(c.TokensFile, filepath.Join(c.StateDir, "tokens.json")), c.Grace, c.Clock); err != nil {
			return o, conns, nil, err
		}
	}
	if o.Limits, conns, err = c.Limits.limits(c.Clock); err != nil {
		return o, conns, nil, err
	}
	return o, conns, release, nil
}

// ports are the server's listening ports.
type ports struct {
	secure, insecure net.Addr // insecure: nil when off
	servers          []*http.Server
	listeners        []net.Listener
	// raw are each port's listeners under TLS, outermost last: the
	// PROXY protocol's and the limits' (for their refusal counts).
	raw [][]net.Listener
}

// listen binds the secure port (TLS) and, unless off, the plain one, with
// the per-source connection limits in front of both.
func (c ServeConfig) listen(srv *mcs.Server, tlsConf *tls.Config, conns limit.ListenerOptions) (*ports, error) {
	secureLn, err := c.bind(c.SecurePort, "secure")
	if err != nil {
		return nil, err
	}
	secureLim := limitListener(secureLn, conns)
	p := &ports{
		secure:    secureLn.Addr(),
		servers:   []*http.Server{newHTTPServer(srv.Handler(mcs.Secure), c.Limits.ReadHeaderTimeout, c.Log)},
		listeners: []net.Listener{tls.NewListener(secureLim, tlsConf)},
		raw:       [][]net.Listener{{secureLn, secureLim}},
	}
	if c.InsecurePort != 0 {
		ln, err := c.bind(c.InsecurePort, "insecure")
		if err != nil {
			secureLn.Close()
			return nil, err
		}
		p.insecure = ln.Addr()
		p.servers = append(p.servers, newHTTPServer(srv.Handler(mcs.Insecure), c.Limits.ReadHeaderTimeout, c.Log))
		lim := limitListener(ln, conns)
		p.listeners = append(p.listeners, lim)
		p.raw = append(p.raw, []net.Listener{ln, lim})
	}
	return p, nil
}

// bind listens on port, behind the PROXY protocol when it is on: a
// listed balancer's header is read before the per-source limits, so they
// count each machine behind it apart; an unlisted peer's connection
// reaches them at once, before any of its bytes is read.
func (c ServeConfig) bind(port int, name string) (net.Listener, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(c.Listen, fmt.Sprint(port)))
	if err != nil || len(c.ProxyProtocolFrom) == 0 {
		return ln, err
	}
	pl, err := proxied.New(ln, proxied.Options{Trusted: c.ProxyProtocolFrom, OnRefuse: func(r proxied.Refusal) {
		c.Log.Warn("connection refused", "port", name, "remote", r.Peer.String(), "reason", r.Reason, "err", r.Err.Error())
	}})
	if err != nil {
		ln.Close()
	}
	return pl, err
}

// serve serves both ports until ctx ends or a listener fails, then shuts
// down, giving requests in flight 10 s.
func (p *ports) serve(ctx context.Context, log *slog.Logger) {
	errc := make(chan error, len(p.servers))
	for i := range p.servers {
		go func(s *http.Server, ln net.Listener) { errc <- s.Serve(ln) }(p.servers[i], p.listeners[i])
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error("listener failed", "err", err.Error())
		}
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, s := range p.servers {
		s.Shutdown(shutdown)
	}
}

// close releases the ports without serving.
func (p *ports) close() {
	for _, ln := range p.listeners {
		ln.Close()
	}
}

// newHTTPServer bounds everything a client controls: header size and the
// time to send headers (readHeader; 0: 10 s) and body; HTTP/1.1 only.
func newHTTPServer(h http.Handler, readHeader time.Duration, log *slog.Logger) *http.Server {
	if readHeader <= 0 {
		readHeader = 10 * time.Second
	}
	s := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeader,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      2 * time.Minute,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    32 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	s.Protocols = new(http.Protocols)
	s.Protocols.SetHTTP1(true)
	return s
}

// sealedLife is how long anything the server seals can stay valid: the
// longest of a config token and a session, plus the time replicas take to
// reload a rotated keyring (seal.Keyring.SetMaxLife).
func (c ServeConfig) sealedLife() time.Duration {
	return max(c.TokenTTL, mcs.DefaultConfigTokenTTL, attest.DefaultSessionTTL) + c.settle()
}

// maintain reloads an edited policy, renews certificates, picks up rotated keys and provisioning tokens and
// collects garbage in the store, until ctx ends.
func (c ServeConfig) maintain(ctx context.Context, clusterMode bool, st store.Store, keys *seal.Keyring, prov *tokens.Provisioning, served certs.Served, pol *policyReloader) {
	tick := time.NewTicker(c.Reload)
	defer tick.Stop()
	lastCerts, lastGC := c.Clock(), c.Clock()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pol.check(ctx)
		if changed, err := keys.Reload(); err != nil {
			c.Log.Error("sealing keys", "err", err.Error())
		} else if changed {
			c.Log.Info("sealing keys reloaded (rotated)")
			for _, h := range keys.Held() {
				c.Log.Warn("the keyring file dropped a key that can still open live sessions or config tokens; it is kept in memory until then",
					"key", h.ID, "until", h.KeptUntil.UTC().Format(time.RFC3339))
			}
		}
		if prov == nil {
			// kept current by the keeper (mcs/cluster.Keeper)
		} else if changed, err := prov.Reload(); err != nil {
			c.Log.Error("provisioning tokens", "err", err.Error())
		} else if changed {
			c.Log.Info("provisioning tokens reloaded (rotated)")
		}
		now := c.Clock()
		if c.certStore(clusterMode) == storeStateDir && now.Sub(lastCerts) > time.Hour {
			lastCerts = now
			if stt, err := certs.Ensure(filepath.Join(c.StateDir, "certs"), certs.Options{Clock: c.Clock, Hosts: c.Hosts}); err != nil {
				c.Log.Error("certificates", "err", err.Error())
			} else {
				for _, ch := range stt.Changes {
					c.Log.Info("certificates", "change", ch)
				}
			}
		}
		if r, ok := served.(*certs.Reloader); ok {
			if err := r.LastError(); err != nil {
				c.Log.Error("serving certificate reload", "err", err.Error())
			}
		}
		if now.Sub(lastGC) > 10*time.Minute {
			lastGC = now
			if n, err := st.GC(ctx, now); err != nil {
				c.Log.Error("store gc", "err", err.Error())
			} else if n > 0 {
				c.Log.Info("store gc", "deleted", n)
			}
		}
	}
}

// tlsConfig is the secure port's TLS configuration, with the certificate
// from --cert, the cluster's objects (the keeper's) or the state directory.
func (c ServeConfig) tlsConfig(keeper *cluster.Keeper) (*tls.Config, certs.Served, error) {
	minV, err := certs.ParseTLSMinVersion(c.TLSMinVersion)
	if err != nil {
		return nil, nil, err
	}
	var suites []uint16
	if c.TLSCipherSuite != "" {
		if suites, err = certs.ParseCipherSuites(c.TLSCipherSuite); err != nil {
			return nil, nil, err
		}
	}
	if c.CABundleFile != "" && c.CertFile == "" {
		return nil, nil, errors.New("--ca-bundle is the CA bundle of --cert; without --cert nodeproof keeps its own")
	}
	certFile, keyFile := c.CertFile, c.KeyFile
	switch {
	case c.CertFile != "":
		if keyFile == "" {
			return nil, nil, errors.New("--cert needs --key")
		}
		c.Log.Info("serving the certificate given by --cert: nodeproof rotates nothing (renew it, and its --ca-bundle, yourself; both are re-read when they change)", "cert", c.CertFile)
	case keeper.KeepsCertificates():
		return certs.TLSConfig(keeper.Serving(), minV, suites), keeper.Serving(), nil
	default:
		st, err := certs.Ensure(filepath.Join(c.StateDir, "certs"), certs.Options{Clock: c.Clock, Hosts: c.Hosts})
		if err != nil {
			return nil, nil, err
		}
		for _, ch := range st.Changes {
			c.Log.Info("certificates", "change", ch)
		}
		certFile, keyFile = st.ServingCertFile, st.ServingKeyFile
	}
	r, err := certs.NewReloader(certFile, keyFile, c.Clock)
	if err != nil {
		return nil, nil, err
	}
	return certs.TLSConfig(r, minV, suites), r, nil
}

// caBundle is the CA bundle pointer configs should carry: --ca-bundle
// with --cert (read on every call: a rotated file is picked up), none with
// --cert alone, nodeproof's own when it manages certificates.
func (c ServeConfig) caBundle() ([]byte, error) {
	if c.bundleFrom != nil {
		return c.bundleFrom()
	}
	if c.CABundleFile != "" {
		b, err := os.ReadFile(c.CABundleFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-bundle: %w", err)
		}
		return b, nil
	}
	if c.CertFile != "" {
		return nil, nil
	}
	return os.ReadFile(filepath.Join(c.StateDir, "certs", "current", certs.CABundleFileName))
}

func loadPolicy(path string) (*policy.Policy, error) {
	if path == "" {
		return policy.Parse([]byte(defaultPolicy))
	}
	return policy.Load(path)
}

// sharedKubeconfig reports whether a pool serves the full config without a
// node of its own (the token tier, fullWithoutCredentials): then cluster
// mode serves the shared node-bootstrapper kubeconfig.
func sharedKubeconfig(pol *policy.Policy) bool {
	for _, pp := range pol.Pools {
		if pp.Serve.Token || pp.Serve.FullWithoutCredentials {
			return true
		}
	}
	return false
}

// tpmVerifier builds the TPM verifier from the policy's trust section; nil
// when no pool accepts TPM evidence.
func tpmVerifier(pol *policy.Policy, clock func() time.Time) (*tpm.Verifier, error) {
	var sets []tpm.RootSet
	for _, r := range pol.Trust.EKRoots {
		s, err := tpm.LoadRootSet(r.Name, r.Dir)
		if err != nil {
			return nil, err
		}
		sets = append(sets, s)
	}
	var inv *tpm.Inventory
	if pol.Trust.EKInventory != "" {
		var err error
		if inv, err = tpm.LoadInventory(pol.Trust.EKInventory); err != nil {
			return nil, err
		}
	}
	return tpm.NewVerifier(tpm.Options{Roots: sets, Inventory: inv, Clock: clock})
}

// usesEvidence reports whether any pool takes evidence of kind k.
func usesEvidence(pol *policy.Policy, k attest.Kind) bool {
	for _, pp := range pol.Pools {
		if slices.Contains(pp.Evidence, k) {
			return true
		}
	}
	return false
}

// gcpVerifier builds the GCP verifier when a pool takes GCP evidence.
func (c ServeConfig) gcpVerifier(pol *policy.Policy) (*gcp.Verifier, error) {
	if !usesEvidence(pol, attest.KindGCP) {
		return nil, nil
	}
	aud := c.GCPAudienceURL
	if aud == "" {
		if len(c.Hosts) == 0 {
			return nil, errors.New("serve: GCP evidence needs --gcp-audience-url or --hosts")
		}
		aud = "https://" + net.JoinHostPort(c.Hosts[0], strconv.Itoa(c.SecurePort))
	}
	keys, err := gcp.NewJWKSSource(orDefault(c.GCPJWKSURL, gcp.GoogleJWKSURL), nil, c.Clock, 0)
	if err != nil {
		return nil, err
	}
	return gcp.NewVerifier(gcp.Options{Keys: keys, AudiencePrefix: aud, Clock: c.Clock})
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// serveDebug serves pprof on addr until the returned function is called.
func serveDebug(addr string) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("debug: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go s.Serve(ln)
	return func() { s.Close() }, nil
}
