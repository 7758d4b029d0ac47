package gcevtpm

import (
	"context"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// oidSubjectAltName: Google's tpm_ek_v1_cloud_host AK certificates carry
// the TCG's critical SAN of TPM manufacturer fields (a directoryName),
// which Go's x509 leaves unhandled; it is the one unhandled critical
// extension tolerated (as for EK certificates, attest/tpm).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// verifyCert checks an AK certificate and returns it parsed. Checks, in
// order, each with its reason:
//  1. it is present (AKCertificateMissing) and within MaxCertificateSize,
//     with at most MaxIntermediates intermediates of that size each
//     (MalformedEvidence);
//  2. it and every intermediate the node sent parse as X.509 DER
//     (AKCertificateInvalid), whether or not the chain needs them;
//  3. it is an end-entity certificate of a signing key: not a CA, no
//     certificate-signing key usage, digitalSignature among its key usages
//     (Google's AK certificates have exactly that; its EK and encryption
//     certificates have keyEncipherment or keyAgreement)
//     (AKCertificateInvalid);
//  4. no unhandled critical extension but the TCG SAN
//     (AKCertificateInvalid);
//  5. it is within its validity at now (AKCertificateExpired);
//  6. it chains, at now, to a pinned root through the trust's
//     intermediates and the node's (any extended key usage, as Google's
//     carry the TCG EK-certificate one or none), and, when that fails for
//     want of an issuer and an AIA is configured, through issuers fetched
//     over AIA (AKCertificateUntrusted; a certificate of the chain out of
//     its validity: AKCertificateExpired).
//
// No revocation is checked: Google publishes CRLs for one of its two
// hierarchies only, and go-tpm-tools checks none (docs/cloud-tpm.md).
func (v *Verifier) verifyCert(ctx context.Context, certDER []byte, intermediatesDER [][]byte, now time.Time) (*x509.Certificate, error) {
	if len(certDER) == 0 {
		return nil, attest.Deny(attest.ReasonAKCertMissing, "no AK certificate: the VM's vTPM has none in NV (0x01c10000/0x01c10002); GCE issues it to Shielded VMs with vTPM enabled")
	}
	if len(certDER) > MaxCertificateSize {
		return nil, attest.Deny(attest.ReasonMalformed, "AK certificate of %d bytes exceeds %d", len(certDER), MaxCertificateSize)
	}
	if len(intermediatesDER) > MaxIntermediates {
		return nil, attest.Deny(attest.ReasonMalformed, "%d intermediates; at most %d", len(intermediatesDER), MaxIntermediates)
	}
	for _, d := range intermediatesDER {
		if len(d) > MaxCertificateSize {
			return nil, attest.Deny(attest.ReasonMalformed, "an intermediate of %d bytes exceeds %d", len(d), MaxCertificateSize)
		}
	}
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, attest.Deny(attest.ReasonAKCertInvalid, "the AK certificate does not parse as X.509 DER")
	}
	extra := make([]*x509.Certificate, 0, len(intermediatesDER))
	for _, d := range intermediatesDER {
		c, err := x509.ParseCertificate(d)
		if err != nil {
			return nil, attest.Deny(attest.ReasonAKCertInvalid, "an intermediate does not parse as X.509 DER")
		}
		extra = append(extra, c)
	}
	if cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign != 0 {
		return nil, attest.Deny(attest.ReasonAKCertInvalid, "the AK certificate %q is a CA certificate", cert.Subject)
	}
	if cert.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		return nil, attest.Deny(attest.ReasonAKCertInvalid, "the certificate %q is not for a signing key (no digitalSignature key usage): an EK or encryption key certificate is no AK certificate", cert.Subject)
	}
	for _, oid := range cert.UnhandledCriticalExtensions {
		if !oid.Equal(oidSubjectAltName) {
			return nil, attest.Deny(attest.ReasonAKCertInvalid, "the AK certificate has the unhandled critical extension %s", oid)
		}
	}
	if now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return nil, attest.Deny(attest.ReasonAKCertExpired, "the AK certificate is valid from %s to %s", cert.NotBefore.UTC().Format(time.RFC3339), cert.NotAfter.UTC().Format(time.RFC3339))
	}
	leaf := *cert
	leaf.UnhandledCriticalExtensions = nil
	known := append(append([]*x509.Certificate(nil), v.trust.intermediates...), extra...)
	err = v.chain(&leaf, known, now)
	var unknown x509.UnknownAuthorityError
	if err != nil && errors.As(err, &unknown) && v.aia != nil {
		fetched, ferr := v.aia.Issuers(ctx, cert, append(known, v.trust.roots...))
		if len(fetched) > 0 {
			err = v.chain(&leaf, append(known, fetched...), now)
		} else if ferr != nil {
			return nil, attest.Deny(attest.ReasonAKCertUntrusted, "the AK certificate's issuer is not known and fetching it failed: %v", ferr)
		}
	}
	if err != nil {
		var invalid x509.CertificateInvalidError
		if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
			return nil, attest.Deny(attest.ReasonAKCertExpired, "a certificate of the AK certificate's chain is outside its validity: %v", err)
		}
		return nil, attest.Deny(attest.ReasonAKCertUntrusted, "the AK certificate does not chain to a pinned Google root: %v", err)
	}
	return cert, nil
}

func (v *Verifier) chain(leaf *x509.Certificate, intermediates []*x509.Certificate, now time.Time) error {
	pool := x509.NewCertPool()
	for _, c := range intermediates {
		pool.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots: v.roots, Intermediates: pool, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	return err
}
