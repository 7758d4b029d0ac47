package serve

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/ec2live"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/identity/gcp"
	"github.com/nodeproof/nodeproof/identity/nitrotpm"
	"github.com/nodeproof/nodeproof/pemcert"
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

// CheckTrust loads what pol's trust section points to as serve does at
// start and at every reload — each ekRoots directory (a root set that
// loads, with at least one CA) and the EK inventory — and returns what
// serve would refuse: `nodeproof policy check` runs it, so a wrong
// directory fails there, not only when the server starts.
func CheckTrust(pol *policy.Policy, clock func() time.Time) error {
	_, err := tpmVerifier(pol, clock)
	return err
}

// verifiers builds the verifiers of the evidence kinds pol takes (TPM's
// always: its trust roots are checked at start), one registry the server
// selects kinds from.
func (c Config) verifiers(ctx context.Context, pol *policy.Policy) (attest.Registry, error) {
	var vs []attest.Verifier
	tv, err := tpmVerifier(pol, c.Clock)
	if err != nil {
		return nil, err
	}
	vs = append(vs, tv.Seam())
	gv, err := c.gcpVerifier(pol)
	if err != nil {
		return nil, err
	}
	if gv != nil {
		vs = append(vs, gv.Seam())
	}
	av, err := c.awsVerifier(ctx, pol)
	if err != nil {
		return nil, err
	}
	if av != nil && usesEvidence(pol, attest.KindAWS) {
		vs = append(vs, av.Seam())
	}
	gvt, err := c.gceVTPMVerifier(pol)
	if err != nil {
		return nil, err
	}
	if gvt != nil {
		vs = append(vs, gvt.Seam())
	}
	if usesEvidence(pol, attest.KindNitroTPM) {
		nv, err := c.nitroTPMVerifier(av)
		if err != nil {
			return nil, err
		}
		vs = append(vs, nv.Seam())
	}
	return attest.NewRegistry(vs...)
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

// awsVerifier builds the AWS verifier when a pool takes AWS evidence, or
// NitroTPM evidence (whose instance identity document it verifies).
func (c Config) awsVerifier(ctx context.Context, pol *policy.Policy) (*aws.Verifier, error) {
	if !usesEvidence(pol, attest.KindAWS) && !usesEvidence(pol, attest.KindNitroTPM) {
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

// gceVTPMVerifier builds the GCE vTPM verifier when a pool takes gce-vtpm
// evidence: Google's two pinned roots (or GCEVTPMRoots'), the shipped
// intermediates and GCEVTPMIntermediatesDir's, and issuers fetched over
// AIA only from GCEVTPMAIAHosts (none: never fetched).
func (c Config) gceVTPMVerifier(pol *policy.Policy) (*gcevtpm.Verifier, error) {
	if !usesEvidence(pol, attest.KindGCEVTPM) {
		return nil, nil
	}
	now := c.Clock()
	trust, err := gcevtpm.DefaultTrust(now)
	if err != nil {
		return nil, err
	}
	if c.GCEVTPMRoots != "" {
		roots, err := readPEMFile(c.GCEVTPMRoots)
		if err != nil {
			return nil, fmt.Errorf("serve: --gce-vtpm-roots: %w", err)
		}
		if trust, err = gcevtpm.NewTrust(roots, nil, now); err != nil {
			return nil, fmt.Errorf("serve: --gce-vtpm-roots: %w", err)
		}
	}
	if c.GCEVTPMIntermediatesDir != "" {
		if trust, err = trust.WithIntermediates(c.GCEVTPMIntermediatesDir, now); err != nil {
			return nil, fmt.Errorf("serve: --gce-vtpm-intermediates-dir: %w", err)
		}
	}
	o := gcevtpm.Options{Trust: trust, Clock: c.Clock}
	if len(c.GCEVTPMAIAHosts) > 0 {
		o.AIA = &gcevtpm.AIA{AllowedHosts: c.GCEVTPMAIAHosts}
	}
	return gcevtpm.NewVerifier(o)
}

// nitroTPMVerifier builds the NitroTPM verifier on identity, the AWS
// verifier of the instance identity documents sent beside the
// attestation documents: the AWS Nitro root G1 (or NitroTPMRoots').
func (c Config) nitroTPMVerifier(identity *aws.Verifier) (*nitrotpm.Verifier, error) {
	o := nitrotpm.Options{Identity: identity, Clock: c.Clock}
	if c.NitroTPMRoots != "" {
		roots, err := readPEMFile(c.NitroTPMRoots)
		if err != nil {
			return nil, fmt.Errorf("serve: --nitrotpm-roots: %w", err)
		}
		o.Roots = roots
	}
	return nitrotpm.NewVerifier(o)
}

// readPEMFile reads a strict PEM bundle of certificates (pemcert).
func readPEMFile(path string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	certs, err := pemcert.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%s holds no certificate", path)
	}
	return certs, nil
}
