// Package anchors lists the certificates the cloud evidence kinds trust
// (the trust anchors a release ships, or an operator gives) and exports
// when each one expires, so that an alert asks for a refresh before
// verifications start to fail:
//
//   - gce-vtpm: Google's two pinned vTPM roots and the shipped
//     intermediates (identity/gcevtpm/certs; refreshed by
//     hack/gcevtpm-intermediates);
//   - aws-nitrotpm: the AWS Nitro Enclaves Root G1 (identity/nitrotpm);
//   - azure-vtpm: Azure's pinned vTPM root and the shipped vTPM
//     intermediates (roles root, intermediate), and the pinned roots and
//     shipped intermediates the IMDS attested document's signer chains to
//     (document-root, document-intermediate; identity/azuretpm/certs);
//   - aws: the per-Region certificates of the instance identity
//     document's rsa2048 signature (identity/aws/certs, or the server's
//     --aws-certs-dir), which aws-nitrotpm reads too.
//
// The gcp kind holds no certificate: its identity tokens are checked
// against Google's JWKS, fetched and cached at run time.
package anchors

import (
	"crypto/x509"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/azuretpm"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/identity/nitrotpm"
)

// Roles of an anchor, beside an AWS Region (the Region whose identity
// documents a certificate signs).
const (
	RoleRoot         = "root"
	RoleIntermediate = "intermediate"
	// RoleDocumentRoot and RoleDocumentIntermediate are what a kind's
	// signed document chains to beside its AK certificate's (azure-vtpm:
	// the IMDS attested document's signer).
	RoleDocumentRoot         = "document-root"
	RoleDocumentIntermediate = "document-intermediate"
)

// Anchor is one certificate an evidence kind's verification trusts.
type Anchor struct {
	Kind attest.Kind
	// Role is RoleRoot, RoleIntermediate, or for kind aws the Region
	// whose identity documents the certificate signs.
	Role string
	Cert *x509.Certificate
}

// Cloud lists the anchors of the cloud kinds: the shipped GCE vTPM roots
// and intermediates, the Nitro root, Azure's vTPM and IMDS roots and
// intermediates, and the AWS Region certificates
// regions holds (aws.DefaultRegionCerts, or those of --aws-certs-dir).
// Nothing is checked against a time: an anchor that has expired is listed
// (and exported) as one that has not.
func Cloud(regions *aws.RegionCerts) ([]Anchor, error) {
	roots, inter, err := gcevtpm.Shipped()
	if err != nil {
		return nil, fmt.Errorf("anchors: %w", err)
	}
	var out []Anchor
	for _, c := range roots {
		out = append(out, Anchor{Kind: attest.KindGCEVTPM, Role: RoleRoot, Cert: c})
	}
	for _, c := range inter {
		out = append(out, Anchor{Kind: attest.KindGCEVTPM, Role: RoleIntermediate, Cert: c})
	}
	g1, err := nitrotpm.RootG1()
	if err != nil {
		return nil, fmt.Errorf("anchors: %w", err)
	}
	out = append(out, Anchor{Kind: attest.KindNitroTPM, Role: RoleRoot, Cert: g1})
	az, err := azuretpm.Shipped()
	if err != nil {
		return nil, fmt.Errorf("anchors: %w", err)
	}
	for _, r := range []struct {
		role  string
		certs []*x509.Certificate
	}{{RoleRoot, az.AKRoots}, {RoleIntermediate, az.AKIntermediates}, {RoleDocumentRoot, az.DocumentRoots}, {RoleDocumentIntermediate, az.DocumentIntermediates}} {
		out = Append(out, attest.KindAzureVTPM, r.role, r.certs)
	}
	if regions != nil {
		for _, r := range regions.Regions() {
			for _, c := range regions.Certificates(r) {
				out = append(out, Anchor{Kind: attest.KindAWS, Role: r, Cert: c})
			}
		}
	}
	return out, nil
}

// Replace returns as with kind's anchors of role replaced by certs: an
// operator's roots in place of the pinned ones (--gce-vtpm-roots,
// --nitrotpm-roots, --azure-vtpm-roots, --azure-imds-roots), so the gauge shows what the server trusts.
func Replace(as []Anchor, kind attest.Kind, role string, certs []*x509.Certificate) []Anchor {
	out := make([]Anchor, 0, len(as)+len(certs))
	for _, a := range as {
		if a.Kind != kind || a.Role != role {
			out = append(out, a)
		}
	}
	return Append(out, kind, role, certs)
}

// Append returns as with certs added as kind's anchors of role: an
// operator's intermediates beside the shipped ones
// (--gce-vtpm-intermediates-dir, --azure-vtpm-intermediates-dir,
// --azure-imds-intermediates-dir).
func Append(as []Anchor, kind attest.Kind, role string, certs []*x509.Certificate) []Anchor {
	for _, c := range certs {
		as = append(as, Anchor{Kind: kind, Role: role, Cert: c})
	}
	return as
}

// MetricName is the gauge Register exports: an anchor's notAfter in Unix
// seconds, labelled kind, role, subject (RFC 2253) and serial (hex).
const MetricName = "nodeproof_trust_anchor_expiry_timestamp_seconds"

// Register exports the anchors' expiry on reg as MetricName. The list is
// fixed when the server starts (the anchors are the binary's and its
// flags'), so the gauge is set once.
func Register(reg prometheus.Registerer, anchors []Anchor) error {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricName,
		Help: "When a certificate a cloud evidence kind trusts expires (Unix seconds): gce-vtpm's pinned roots and shipped intermediates, aws-nitrotpm's Nitro root G1, azure-vtpm's vTPM and IMDS document roots and intermediates, the AWS identity document's Region certificates (role: the Region).",
	}, []string{"kind", "role", "subject", "serial"})
	for _, a := range anchors {
		g.WithLabelValues(string(a.Kind), a.Role, a.Cert.Subject.String(), fmt.Sprintf("%x", a.Cert.SerialNumber)).Set(float64(a.Cert.NotAfter.Unix()))
	}
	return reg.Register(g)
}
