package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/ec2live"
	"github.com/nodeproof/nodeproof/identity/gcp"
)

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
func (c Config) gcpVerifier(pol *policy.Policy) (*gcp.Verifier, error) {
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

// awsVerifier builds the AWS verifier when a pool takes AWS evidence.
func (c Config) awsVerifier(ctx context.Context, pol *policy.Policy) (*aws.Verifier, error) {
	if !usesEvidence(pol, attest.KindAWS) {
		return nil, nil
	}
	certs, err := c.awsRegionCerts()
	if err != nil {
		return nil, err
	}
	o := aws.Options{Certs: certs, MaxDocumentAge: c.AWSMaxDocumentAge, Clock: c.Clock}
	if c.AWSLiveRegion != "" {
		client, err := ec2live.NewClient(ctx, c.AWSLiveRegion, c.AWSEC2Endpoint)
		if err != nil {
			return nil, fmt.Errorf("serve: AWS live check: %w", err)
		}
		o.Live = &ec2live.Checker{Client: client, VPCs: c.AWSLiveVPCs, Tags: c.AWSLiveTags}
	}
	return aws.NewVerifier(o)
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

// awsRegionCerts are the identity documents' Region certificates: those of
// --aws-certs-dir, else the shipped ones.
func (c Config) awsRegionCerts() (*aws.RegionCerts, error) {
	if c.AWSCertsDir != "" {
		return aws.LoadRegionCerts(c.AWSCertsDir)
	}
	return aws.DefaultRegionCerts()
}
