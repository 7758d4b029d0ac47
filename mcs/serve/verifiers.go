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
	"github.com/nodeproof/nodeproof/identity/anchors"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/ec2live"
	"github.com/nodeproof/nodeproof/identity/azuretpm"
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

// builder is one kind's row in builders: how serve makes its verifier
// from the policy and the server's trust settings, and what those
// settings add to the trust anchors the server exports.
type builder struct {
	kind attest.Kind
	// always: built whatever the policy takes (TPM's: the trust section's
	// roots and inventory are checked at start and at every reload);
	// otherwise only when a pool takes the kind.
	always bool
	// build makes the verifier (b: what rows share, the AWS identity
	// verifier).
	build func(c Config, b *building, pol *policy.Policy) (attest.Verifier, error)
	// anchors, when set, applies the kind's trust flags to the anchors
	// the server exports (a roots file replacing the shipped roots).
	anchors func(c Config, as []anchors.Anchor) ([]anchors.Anchor, error)
}

// builders is every kind serve can verify, a row each, in the order they
// are built. A new kind adds its row (and its flags to Config and to
// cmd/nodeproof/cli/serve.go).
var builders = []builder{
	{kind: attest.KindTPM, always: true, build: func(c Config, _ *building, pol *policy.Policy) (attest.Verifier, error) {
		v, err := tpmVerifier(pol, c.Clock)
		if err != nil {
			return nil, err
		}
		return v.Seam(), nil
	}},
	{kind: attest.KindGCP, build: func(c Config, _ *building, _ *policy.Policy) (attest.Verifier, error) {
		v, err := c.gcpVerifier()
		if err != nil {
			return nil, err
		}
		return v.Seam(), nil
	}},
	{kind: attest.KindAWS, build: func(_ Config, b *building, _ *policy.Policy) (attest.Verifier, error) {
		v, err := b.awsIdentity()
		if err != nil {
			return nil, err
		}
		return v.Seam(), nil
	}},
	{kind: attest.KindGCEVTPM, build: func(c Config, _ *building, _ *policy.Policy) (attest.Verifier, error) {
		v, err := c.gceVTPMVerifier()
		if err != nil {
			return nil, err
		}
		return v.Seam(), nil
	}, anchors: Config.gceVTPMAnchors},
	{kind: attest.KindNitroTPM, build: func(c Config, b *building, _ *policy.Policy) (attest.Verifier, error) {
		id, err := b.awsIdentity()
		if err != nil {
			return nil, err
		}
		v, err := c.nitroTPMVerifier(id)
		if err != nil {
			return nil, err
		}
		return v.Seam(), nil
	}, anchors: Config.nitroTPMAnchors},
	{kind: attest.KindAzureVTPM, build: func(c Config, _ *building, _ *policy.Policy) (attest.Verifier, error) {
		v, err := c.azureVTPMVerifier()
		if err != nil {
			return nil, err
		}
		return v.Seam(), nil
	}, anchors: Config.azureVTPMAnchors},
}

// building is what the builders of one policy share: the AWS identity
// verifier, made once for aws and aws-nitrotpm (whose instance identity
// documents it verifies).
type building struct {
	ctx context.Context
	c   Config
	aws *aws.Verifier
}

// awsIdentity is the AWS verifier, made at its first use.
func (b *building) awsIdentity() (*aws.Verifier, error) {
	if b.aws == nil {
		v, err := b.c.awsVerifier(b.ctx)
		if err != nil {
			return nil, err
		}
		b.aws = v
	}
	return b.aws, nil
}

// verifiers builds, by builders, the verifiers of the evidence kinds pol
// takes (TPM's always), one registry the server selects kinds from.
func (c Config) verifiers(ctx context.Context, pol *policy.Policy) (attest.Registry, error) {
	b := &building{ctx: ctx, c: c}
	var vs []attest.Verifier
	for _, row := range builders {
		if !row.always && !usesEvidence(pol, row.kind) {
			continue
		}
		v, err := row.build(c, b, pol)
		if err != nil {
			return nil, err
		}
		vs = append(vs, v)
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

// gcpVerifier builds the GCP verifier: the audience from --gcp-audience-url
// or the first of --hosts, Google's keys (or --gcp-jwks-url's).
func (c Config) gcpVerifier() (*gcp.Verifier, error) {
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

// awsVerifier builds the AWS verifier, for AWS evidence and NitroTPM
// evidence (whose instance identity document it verifies): the Region
// certificates, and the EC2 live check when --aws-live-check-region is
// set.
func (c Config) awsVerifier(ctx context.Context) (*aws.Verifier, error) {
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

// gceVTPMVerifier builds the GCE vTPM verifier: Google's two pinned roots (or GCEVTPMRoots'), the shipped
// intermediates and GCEVTPMIntermediatesDir's, and issuers fetched over
// AIA only from GCEVTPMAIAHosts (none: never fetched).
func (c Config) gceVTPMVerifier() (*gcevtpm.Verifier, error) {
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

// gceVTPMAnchors applies --gce-vtpm-roots (replacing the pinned roots)
// and --gce-vtpm-intermediates-dir (beside the shipped intermediates) to
// the anchors the server exports.
func (c Config) gceVTPMAnchors(as []anchors.Anchor) ([]anchors.Anchor, error) {
	if c.GCEVTPMRoots != "" {
		roots, err := readPEMFile(c.GCEVTPMRoots)
		if err != nil {
			return nil, fmt.Errorf("--gce-vtpm-roots: %w", err)
		}
		as = anchors.Replace(as, attest.KindGCEVTPM, anchors.RoleRoot, roots)
	}
	if c.GCEVTPMIntermediatesDir != "" {
		more, err := gcevtpm.ReadIntermediates(c.GCEVTPMIntermediatesDir)
		if err != nil {
			return nil, fmt.Errorf("--gce-vtpm-intermediates-dir: %w", err)
		}
		as = anchors.Append(as, attest.KindGCEVTPM, anchors.RoleIntermediate, more)
	}
	return as, nil
}

// nitroTPMAnchors applies --nitrotpm-roots (replacing the Nitro root G1)
// to the anchors the server exports.
func (c Config) nitroTPMAnchors(as []anchors.Anchor) ([]anchors.Anchor, error) {
	if c.NitroTPMRoots == "" {
		return as, nil
	}
	roots, err := readPEMFile(c.NitroTPMRoots)
	if err != nil {
		return nil, fmt.Errorf("--nitrotpm-roots: %w", err)
	}
	return anchors.Replace(as, attest.KindNitroTPM, anchors.RoleRoot, roots), nil
}

// azureVTPMVerifier builds the Azure vTPM verifier: Azure's pinned vTPM
// root (or AzureVTPMRoots') and the pinned IMDS roots (or
// AzureIMDSRoots'), the shipped intermediates (none when the roots are
// replaced: they lead to Microsoft's) and those of
// AzureVTPMIntermediatesDir and AzureIMDSIntermediatesDir.
func (c Config) azureVTPMVerifier() (*azuretpm.Verifier, error) {
	now := c.Clock()
	set, err := azuretpm.Shipped()
	if err != nil {
		return nil, err
	}
	for _, r := range []struct {
		flag, path    string
		roots, shipIn *[]*x509.Certificate
	}{
		{"--azure-vtpm-roots", c.AzureVTPMRoots, &set.AKRoots, &set.AKIntermediates},
		{"--azure-imds-roots", c.AzureIMDSRoots, &set.DocumentRoots, &set.DocumentIntermediates},
	} {
		if r.path == "" {
			continue
		}
		roots, err := readPEMFile(r.path)
		if err != nil {
			return nil, fmt.Errorf("serve: %s: %w", r.flag, err)
		}
		*r.roots, *r.shipIn = roots, nil
	}
	trust, err := azuretpm.NewTrust(set, now)
	if err != nil {
		return nil, fmt.Errorf("serve: Azure vTPM trust: %w", err)
	}
	if c.AzureVTPMIntermediatesDir != "" || c.AzureIMDSIntermediatesDir != "" {
		if trust, err = trust.WithIntermediates(c.AzureVTPMIntermediatesDir, c.AzureIMDSIntermediatesDir, now); err != nil {
			return nil, fmt.Errorf("serve: --azure-vtpm-intermediates-dir, --azure-imds-intermediates-dir: %w", err)
		}
	}
	return azuretpm.NewVerifier(azuretpm.Options{Trust: trust, Clock: c.Clock})
}

// azureVTPMAnchors applies --azure-vtpm-roots and --azure-imds-roots
// (replacing the pinned roots, and the shipped intermediates under them)
// and --azure-vtpm-intermediates-dir and --azure-imds-intermediates-dir
// (beside the shipped intermediates) to the anchors the server exports.
func (c Config) azureVTPMAnchors(as []anchors.Anchor) ([]anchors.Anchor, error) {
	for _, r := range []struct {
		flag, path, role, under string
	}{
		{"--azure-vtpm-roots", c.AzureVTPMRoots, anchors.RoleRoot, anchors.RoleIntermediate},
		{"--azure-imds-roots", c.AzureIMDSRoots, anchors.RoleDocumentRoot, anchors.RoleDocumentIntermediate},
	} {
		if r.path == "" {
			continue
		}
		roots, err := readPEMFile(r.path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.flag, err)
		}
		as = anchors.Replace(anchors.Replace(as, attest.KindAzureVTPM, r.under, nil), attest.KindAzureVTPM, r.role, roots)
	}
	for _, d := range []struct {
		flag, dir, role string
	}{
		{"--azure-vtpm-intermediates-dir", c.AzureVTPMIntermediatesDir, anchors.RoleIntermediate},
		{"--azure-imds-intermediates-dir", c.AzureIMDSIntermediatesDir, anchors.RoleDocumentIntermediate},
	} {
		if d.dir == "" {
			continue
		}
		more, err := azuretpm.ReadIntermediates(d.dir)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d.flag, err)
		}
		as = anchors.Append(as, attest.KindAzureVTPM, d.role, more)
	}
	return as, nil
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
