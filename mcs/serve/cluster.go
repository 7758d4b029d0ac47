package serve

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/leader"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/mcs/userdata"
)

// restConfig is the API server connection: --kubeconfig, or the
// in-cluster service account when it is empty (as the OpenShift MCS does).
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API server config: %w", err)
	}
	cfg.UserAgent = "nodeproof"
	// client-go's defaults (5 per second, bursts of 10) would hold a
	// scale-up of hundreds of machines to a few attestations a second.
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// limits applies --kube-api-qps/--kube-api-burst (zero: restConfig's).
func (c Config) limits(cfg *rest.Config) {
	if c.KubeQPS > 0 {
		cfg.QPS, cfg.Burst = float32(c.KubeQPS), max(c.KubeBurst, 1)
	}
}

// clusterSource is cluster mode's config source, with the user-data
// Secrets managed when --user-data-url is set.
func (c Config) clusterSource(pol func() *policy.Policy, prov *tokens.Provisioning, keeper *cluster.Keeper) (*cluster.Source, error) {
	cfg, err := RESTConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	c.limits(cfg)
	src, err := cluster.NewSource(cluster.SourceOptions{
		REST: cfg, APIServerURL: c.APIServerURL, TokenDir: c.TokenDir, CABundle: c.caBundle, Clock: c.Clock, Log: c.Log,
	})
	if err != nil {
		return nil, fmt.Errorf("serve: cluster mode: %w", err)
	}
	if c.UserDataURL == "" {
		return src, nil
	}
	// The user-data Secrets carry the CA bundle (nodeproof's own, or
	// --ca-bundle with --cert, re-read at every sync), and the provisioning
	// token for pools that take the token tier.
	if c.CertFile != "" && c.CABundleFile == "" {
		return nil, errors.New("serve: --user-data-url with --cert needs --ca-bundle (the CA bundle that signed --cert, which the pointer configs carry)")
	}
	u, err := userdata.New(userdata.Options{
		Client: src.Client(), Namespace: c.UserDataNamespace, URL: c.UserDataURL, Roles: c.UserDataRoles,
		CABundle: c.caBundle,
		Token: func(pool string) string {
			if pol().ServeFor(pool).Token {
				// A new token only once every replica accepts it.
				return prov.Published(c.Settle())
			}
			return ""
		},
	})
	if err != nil {
		return nil, err
	}
	var leading func() bool // nil: always (nothing kept in the cluster, no election)
	if keeper != nil {
		leading = keeper.Leading
	}
	src.ManageUserData(u, leading)
	return src, nil
}

// Where cluster mode keeps its CA and serving certificate, and its
// provisioning tokens (--cert-store, --token-store).
const (
	storeCluster  = "cluster"
	storeStateDir = "state-dir"
	storeFile     = "file"
)

// certStore is where the certificates are: the cluster's objects by
// default in cluster mode, unless --cert was given.
func (c Config) certStore(clusterMode bool) string {
	switch {
	case c.CertFile != "":
		return "cert"
	case c.CertStore != "":
		return c.CertStore
	case clusterMode:
		return storeCluster
	}
	return storeStateDir
}

// tokenStore is where the provisioning tokens are: the Secret of
// "Support a provisioning token for the Machine Config Server" by default
// in cluster mode.
func (c Config) tokenStore(clusterMode bool) string {
	switch {
	case c.TokenStore != "":
		return c.TokenStore
	case clusterMode:
		return storeCluster
	}
	return storeFile
}

// startKeeper starts the keeper of what --cert-store=cluster and
// --token-store=cluster keep in the cluster (cluster.Keeper); nil when
// neither is kept there.
func (c Config) startKeeper(ctx context.Context, clusterMode bool) (*cluster.Keeper, error) {
	certsHere, tokensHere := c.certStore(clusterMode) == storeCluster, c.tokenStore(clusterMode) == storeCluster
	if !certsHere && !tokensHere {
		return nil, nil
	}
	if !clusterMode {
		return nil, errors.New("serve: --cert-store=cluster and --token-store=cluster need cluster mode (--kubeconfig/--apiserver-url)")
	}
	cfg, err := RESTConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	c.limits(cfg)
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	id, err := leader.Identity(c.Identity)
	if err != nil {
		return nil, err
	}
	// client-go's leader election logs through klog (process-wide).
	klog.SetSlogLogger(c.Log)
	return cluster.StartKeeper(ctx, cluster.KeeperOptions{
		Client: kc, Certs: certsHere, CertsNamespace: c.CertsNamespace, Hosts: c.Hosts,
		Tokens: tokensHere, TokenSecretNamespace: c.TokenSecretNamespace, LegacyTokensFile: c.TokensFile,
		Grace: c.Grace, TokenRotateEvery: c.TokenRotateEvery, Reload: c.Reload,
		LeaseNamespace: c.storeNamespace(), Identity: id,
		LeaseDuration: c.LeaseDuration, RenewDeadline: c.RenewDeadline, RetryPeriod: c.RetryPeriod,
		Clock: c.Clock, Log: c.Log,
	})
}

// settle is how long a new provisioning token waits before the user-data
// Secrets carry it: three reloads, so every replica accepts it first.
func (c Config) Settle() time.Duration { return 3 * c.Reload }
