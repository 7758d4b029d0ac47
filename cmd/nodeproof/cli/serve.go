package cli

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/identity/gcp"
	"github.com/nodeproof/nodeproof/mcs/proxied"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/safetext"
)

// serveFlags defines serve's flags on fs; the returned function finishes
// c after parsing.
func serveFlags(fs *flag.FlagSet, c *serve.Config) func() {
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
	fs.StringVar(&c.Policy, "policy", "", "attestation and release policy (YAML); required unless --policy-none")
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
	fs.StringVar(&c.GCEVTPMRoots, "gce-vtpm-roots", "", "GCE vTPM evidence: a PEM file of roots replacing Google's two pinned vTPM roots (a test's or private CA; default: Google's, shipped)")
	fs.StringVar(&c.GCEVTPMIntermediatesDir, "gce-vtpm-intermediates-dir", "", "GCE vTPM evidence: a directory of .pem intermediates added to the shipped ones (hack/gcevtpm-intermediates refreshes them; docs/cloud-tpm.md)")
	aiaHosts := fs.String("gce-vtpm-aia-hosts", "", "GCE vTPM evidence: comma-separated exact hosts an AK certificate's issuers may be fetched from over AIA, 64 KiB and 10 s per fetch, 3 hops, the 64 most recently used cached (Google's: pki.goog and its CA Service bucket's host, docs/cloud-tpm.md; no patterns); empty: never fetch")
	fs.StringVar(&c.NitroTPMRoots, "nitrotpm-roots", "", "NitroTPM evidence: a PEM file of roots replacing the AWS Nitro root G1 (a test's PKI; default: AWS's, shipped)")
	fs.StringVar(&c.AzureVTPMRoots, "azure-vtpm-roots", "", "Azure vTPM evidence: a PEM file of roots replacing Azure's pinned vTPM root for AK certificates, and the shipped intermediates under it (a test's or private CA; default: Microsoft's, shipped)")
	fs.StringVar(&c.AzureVTPMIntermediatesDir, "azure-vtpm-intermediates-dir", "", "Azure vTPM evidence: a directory of .pem AK certificate intermediates added to the shipped ones (one Azure started using before a release ships it; docs/cloud-tpm.md)")
	fs.StringVar(&c.AzureIMDSRoots, "azure-imds-roots", "", "Azure vTPM evidence: a PEM file of roots replacing the pinned roots the IMDS attested document's signer chains to, and the shipped intermediates under them (a test's PKI; default: DigiCert's and Microsoft's, shipped)")
	fs.StringVar(&c.AzureIMDSIntermediatesDir, "azure-imds-intermediates-dir", "", "Azure vTPM evidence: a directory of .pem intermediates of the attested document's signer added to the shipped ones (a new Azure TLS issuing CA; docs/cloud-tpm.md)")
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
		c.GCEVTPMAIAHosts = splitList(*aiaHosts)
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

func limitFlags(fs *flag.FlagSet, c *serve.LimitConfig) {
	d := serve.DefaultLimits()
	fs.StringVar(&c.AttestPerSource, "limit-attest-per-source", d.AttestPerSource, "attestation requests per second/burst from one source address (IPv6: per /64); 0: no limit")
	fs.StringVar(&c.ConfigPerSource, "limit-config-per-source", d.ConfigPerSource, "config requests per second/burst from one source address; 0: no limit")
	fs.StringVar(&c.PerIdentity, "limit-per-identity", d.PerIdentity, "attestations per second/burst of one identity (a claimed TPM EK at challenge; any verified identity before its record is written); 0: no limit")
	fs.StringVar(&c.NewConnsPerSource, "limit-new-conns-per-source", d.NewConnsPerSource, "new connections per second/burst from one source address, refused before the TLS handshake; 0: no limit")
	fs.StringVar(&c.UnauthenticatedReports, "limit-unauthenticated-reports", d.UnauthenticatedReports, "failure reports recorded as unauthenticated (anyone may send one; each is an Event), per second/burst, per source address and per node name; 0: no limit")
	fs.StringVar(&c.UnauthenticatedReportBytes, "limit-unauthenticated-report-bytes", d.UnauthenticatedReportBytes, "bytes of those reports' Events per second/burst, per source address and per node name (the burst must hold one report: at least 1024); 0: no limit")
	fs.IntVar(&c.ConnsPerSource, "limit-conns-per-source", d.ConnsPerSource, "connections one source address may hold open; 0: no limit")
	fs.IntVar(&c.InFlight, "limit-attestations-in-flight", d.InFlight, "attestation requests processed at once (each may carry a 2 MiB body); 0: no limit")
	fs.DurationVar(&c.InFlightWait, "limit-attestations-wait", d.InFlightWait, "how long an attestation request waits for a slot before it is refused Overloaded")
	fs.DurationVar(&c.ReadHeaderTimeout, "read-header-timeout", d.ReadHeaderTimeout, "time a client has to send its request headers")
}

func cmdServe(ctx context.Context, in *invocation) error {
	var c serve.Config
	fs := in.flags()
	finish := serveFlags(fs, &c)
	logFormat := fs.String("log-format", "json", "json or text")
	policyNone := fs.Bool("policy-none", false, "serve without a policy: the public tier only (no machine is attested, no secret is released); instead of --policy")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	finish()
	switch {
	case c.Policy == "" && !*policyNone:
		return errors.New("no --policy: every machine would be refused PoolNotInPolicy. Give the policy (`nodeproof policy learn` writes one; docs/policy.md), or --policy-none for a server of the public tier only")
	case c.Policy != "" && *policyNone:
		return errors.New("--policy and --policy-none: choose one")
	}
	var h slog.Handler = slog.NewJSONHandler(in.stderr, nil)
	if *logFormat == "text" {
		h = slog.NewTextHandler(in.stderr, nil)
	}
	c.Log, c.Clock = slog.New(safetext.Handler(h)), time.Now
	return serve.Run(ctx, c)
}
