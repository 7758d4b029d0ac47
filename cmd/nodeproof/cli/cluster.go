package cli

import (
	"errors"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/tokens"
	"github.com/nodeproof/nodeproof/mcs/userdata"
)

// restConfig is the API server connection: --kubeconfig, or the
// in-cluster service account when it is empty (as the OpenShift MCS does).
func restConfig(kubeconfig string) (*rest.Config, error) {
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
func (c ServeConfig) limits(cfg *rest.Config) {
	if c.KubeQPS > 0 {
		cfg.QPS, cfg.Burst = float32(c.KubeQPS), max(c.KubeBurst, 1)
	}
}

// clusterSource is cluster mode's config source, with the user-data
// Secrets managed when --user-data-url is set.
func (c ServeConfig) clusterSource(pol func() *policy.Policy, prov *tokens.Provisioning, cs *clusterState) (*cluster.Source, error) {
	cfg, err := restConfig(c.Kubeconfig)
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
				return prov.Published(c.settle())
			}
			return ""
		},
	})
	if err != nil {
		return nil, err
	}
	var leading func() bool // nil: always (nothing kept in the cluster, no election)
	if cs != nil {
		leading = cs.leading.Load
	}
	src.ManageUserData(u, leading)
	return src, nil
}
