package serve

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/nodeproof/nodeproof/attest/policy"
)

// Config is everything `nodeproof serve` needs; flags fill it.
type Config struct {
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
	// GCE vTPM evidence: GCEVTPMRoots, a PEM file of roots that replace
	// Google's two pinned ones (a test's CA; empty: Google's);
	// GCEVTPMIntermediatesDir, .pem files of intermediates added to the
	// shipped ones (refreshed by hack/gcevtpm-intermediates);
	// GCEVTPMAIAHosts, the hosts an AK certificate's issuers may be fetched
	// from over AIA, bounded in size and time (empty: never fetched).
	GCEVTPMRoots            string
	GCEVTPMIntermediatesDir string
	GCEVTPMAIAHosts         []string
	// NitroTPMRoots is a PEM file of roots that replace the AWS Nitro root
	// G1 for NitroTPM documents (a test's PKI; empty: AWS's).
	NitroTPMRoots string
	// Azure vTPM evidence: AzureVTPMRoots and AzureIMDSRoots, PEM files
	// of roots that replace the pinned Azure vTPM root (for AK
	// certificates) and the pinned IMDS roots (for the attested
	// document's signer) (a test's PKI; empty: Microsoft's, shipped);
	// AzureVTPMIntermediatesDir and AzureIMDSIntermediatesDir, .pem files
	// of intermediates added to the shipped ones (an intermediate Azure
	// started using before a release ships it).
	AzureVTPMRoots            string
	AzureVTPMIntermediatesDir string
	AzureIMDSRoots            string
	AzureIMDSIntermediatesDir string
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
	// TokenSecretNamespace, as the OpenShift enhancement mco-auth-token keeps it; TokensFile's tokens, when the file
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
	// statusNow, set by Run, makes the running server's Status for the
	// admin socket.
	statusNow *statusBox
}

// defaultPolicy, the policy of a server started without --policy, serves the public tier of every pool and nothing else: a
// server started without a policy releases no secret.
const defaultPolicy = `apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
pools:
  default: {}
`

// check validates the flags that choose the mode and reports whether this
// is cluster mode.
func (c Config) check() (clusterMode bool, err error) {
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
	case c.TokenRotateEvery > 0 && c.Grace <= c.Settle():
		return false, fmt.Errorf("serve: --token-grace %s must be longer than 3 x --reload-interval (%s): a rotated-out token must stay valid until every replica and user-data Secret has the new one", c.Grace, c.Settle())
	}
	return clusterMode, nil
}

func LoadPolicy(path string) (*policy.Policy, error) {
	if path == "" {
		return policy.Parse([]byte(defaultPolicy))
	}
	return policy.Load(path)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
