package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// awsVerifier builds the AWS verifier when a pool takes AWS evidence.
func (c ServeConfig) awsVerifier(ctx context.Context, pol *policy.Policy) (*aws.Verifier, error) {
	if !usesEvidence(pol, attest.KindAWS) {
		return nil, nil
	}
	var (
		certs *aws.RegionCerts
		err   error
	)
	if c.AWSCertsDir != "" {
		certs, err = aws.LoadRegionCerts(c.AWSCertsDir)
	} else {
		certs, err = aws.DefaultRegionCerts()
	}
	if err != nil {
		return nil, err
	}
	o := aws.Options{Certs: certs, MaxDocumentAge: c.AWSMaxDocumentAge, Clock: c.Clock}
	if c.AWSLiveRegion != "" {
		client, err := ec2Client(ctx, c.AWSLiveRegion, c.AWSEC2Endpoint)
		if err != nil {
			return nil, err
		}
		o.Live = &aws.EC2LiveChecker{Client: client, VPCs: c.AWSLiveVPCs, Tags: c.AWSLiveTags}
	}
	return aws.NewVerifier(o)
}

// ec2Client calls EC2 in region with the AWS SDK's default credential
// chain (config.LoadDefaultConfig), in its order: the environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), the shared
// config and credentials files (AWS_PROFILE, AWS_CONFIG_FILE,
// AWS_SHARED_CREDENTIALS_FILE), web identity (IRSA: AWS_ROLE_ARN and
// AWS_WEB_IDENTITY_TOKEN_FILE), ECS container credentials, then the EC2
// instance role. Credentials are resolved at the first live check, cached,
// and refreshed before they expire. endpoint, when set, replaces the
// region's EC2 endpoint.
func ec2Client(ctx context.Context, region, endpoint string) (*ec2.Client, error) {
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(region))
	if err != nil {
		return nil, fmt.Errorf("serve: AWS live check configuration: %w", err)
	}
	return ec2.NewFromConfig(cfg, func(o *ec2.Options) {
		if endpoint != "" {
			o.BaseEndpoint = awssdk.String(endpoint)
		}
	}), nil
}

// openStore opens the store --store names: embedded (bbolt in the state
// directory) or kubernetes (CRDs, through the cluster mode's API server
// connection, or the in-cluster/kubeconfig one).
func (c ServeConfig) openStore(clusterMode bool) (store.Store, error) {
	return c.openStoreTimeout(clusterMode, 10*time.Second)
}

// openStoreTimeout is openStore waiting at most lock for the embedded
// store's file lock.
func (c ServeConfig) openStoreTimeout(clusterMode bool, lock time.Duration) (store.Store, error) {
	kind := c.Store
	if kind == "" {
		kind = "embedded"
		if clusterMode {
			kind = "kubernetes"
		}
	}
	switch kind {
	case "embedded":
		return boltstore.Open(filepath.Join(c.StateDir, "state.db"), lock, c.Clock)
	case "kubernetes":
		ns := c.StoreNamespace
		if ns == "" {
			ns = "nodeproof"
		}
		cfg, err := restConfig(c.Kubeconfig)
		if err != nil {
			return nil, err
		}
		c.limits(cfg)
		cl, err := kubestore.NewClient(cfg)
		if err != nil {
			return nil, err
		}
		return kubestore.New(cl, ns, c.Clock)
	}
	return nil, fmt.Errorf("serve: --store %q is not embedded or kubernetes", kind)
}
