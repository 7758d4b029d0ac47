package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// awsVerifier builds the AWS verifier when a pool takes AWS evidence.
func (c ServeConfig) awsVerifier(pol *policy.Policy) (*aws.Verifier, error) {
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
		o.Live = &aws.EC2LiveChecker{Client: ec2Client(c.AWSLiveRegion, c.AWSEC2Endpoint), VPCs: c.AWSLiveVPCs, Tags: c.AWSLiveTags}
	}
	return aws.NewVerifier(o)
}

// ec2Client calls EC2 with the credentials of the environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), read per
// call so a rotated session token is picked up.
func ec2Client(region, endpoint string) *ec2.Client {
	o := ec2.Options{
		Region: region,
		Credentials: awssdk.CredentialsProviderFunc(func(context.Context) (awssdk.Credentials, error) {
			id, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
			if id == "" || secret == "" {
				return awssdk.Credentials{}, errors.New("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set")
			}
			return awssdk.Credentials{AccessKeyID: id, SecretAccessKey: secret, SessionToken: os.Getenv("AWS_SESSION_TOKEN"), Source: "environment"}, nil
		}),
	}
	if endpoint != "" {
		o.BaseEndpoint = awssdk.String(endpoint)
	}
	return ec2.New(o)
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
