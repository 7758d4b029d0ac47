package tpm

import (
	"crypto/x509"
	"errors"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// AKCertOptions say how VerifyAKCert checks the AK certificate of a kind
// whose cloud certifies the AK (identity/gcevtpm, identity/azuretpm): what
// differs between the clouds.
type AKCertOptions struct {
	// Missing is the refusal's text when there is no certificate: where
	// the node's vTPM keeps it.
	Missing string
	// MaxCertificateSize bounds the certificate and each intermediate;
	// MaxIntermediates, how many intermediates the node may send.
	MaxCertificateSize, MaxIntermediates int
	// RequireDigitalSignature: digitalSignature must be among the key
	// usages (GCE). Otherwise it must be only when key usages are stated
	// (Azure).
	RequireDigitalSignature bool
	// Roots are the pinned roots; Intermediates the trust's known
	// intermediates, tried with those the node sent.
	Roots         *x509.CertPool
	Intermediates []*x509.Certificate
	// RootName names the roots in the untrusted refusal ("Google",
	// "Azure vTPM").
	RootName string
	// Fetch, when set, is called once when the chain fails for want of an
	// issuer, with the certificate and the intermediates known so far (the
	// trust's and the node's), and returns issuers to try the chain again
	// with (GCE's AIA fetching).
	Fetch func(cert *x509.Certificate, known []*x509.Certificate) ([]*x509.Certificate, error)
}

// VerifyAKCert checks an AK certificate and returns it parsed. Checks, in
// order, each with its reason:
//  1. it is present (AKCertificateMissing, with o.Missing) and within
//     o.MaxCertificateSize, with at most o.MaxIntermediates intermediates
//     of that size each (MalformedEvidence);
//  2. it and every intermediate the node sent parse as X.509 DER
//     (AKCertificateInvalid), whether or not the chain needs them;
//  3. it is an end-entity certificate of a signing key: not a CA, no
//     certificate-signing key usage, and digitalSignature among its key
//     usages (with o.RequireDigitalSignature) or among them when it states
//     any (without) (AKCertificateInvalid);
//  4. no unhandled critical extension but the TCG SAN
//     (AKCertificateInvalid);
//  5. it is within its validity at now (AKCertificateExpired);
//  6. it chains, at now, to o.Roots through o.Intermediates and the
//     node's, for any extended key usage (clouds' intermediates carry the
//     TCG EK- or AK-certificate one, or none), and, when that fails for
//     want of an issuer and o.Fetch is set, through the issuers it
//     fetches (AKCertificateUntrusted, also when fetching fails and
//     fetches nothing; a certificate of the chain out of its validity:
//     AKCertificateExpired).
//
// No revocation is checked.
func VerifyAKCert(certDER []byte, intermediatesDER [][]byte, now time.Time, o AKCertOptions) (*x509.Certificate, error) {
	if len(certDER) == 0 {
		return nil, attest.Deny(attest.ReasonAKCertMissing, "no AK certificate: %s", o.Missing)
	}
	if len(certDER) > o.MaxCertificateSize {
		return nil, attest.Deny(attest.ReasonMalformed, "AK certificate of %d bytes exceeds %d", len(certDER), o.MaxCertificateSize)
	}
	if len(intermediatesDER) > o.MaxIntermediates {
		return nil, attest.Deny(attest.ReasonMalformed, "%d intermediates; at most %d", len(intermediatesDER), o.MaxIntermediates)
	}
	for _, d := range intermediatesDER {
		if len(d) > o.MaxCertificateSize {
			return nil, attest.Deny(attest.ReasonMalformed, "an intermediate of %d bytes exceeds %d", len(d), o.MaxCertificateSize)
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
	if o.RequireDigitalSignature && cert.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		return nil, attest.Deny(attest.ReasonAKCertInvalid, "the certificate %q is not for a signing key (no digitalSignature key usage): an EK or encryption key certificate is no AK certificate", cert.Subject)
	}
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		return nil, attest.Deny(attest.ReasonAKCertInvalid, "the certificate %q is not for a signing key (no digitalSignature key usage)", cert.Subject)
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
	known := append(append([]*x509.Certificate(nil), o.Intermediates...), extra...)
	err = ChainAnyUsage(&leaf, o.Roots, known, now)
	var unknown x509.UnknownAuthorityError
	if err != nil && errors.As(err, &unknown) && o.Fetch != nil {
		fetched, ferr := o.Fetch(cert, known)
		if len(fetched) > 0 {
			err = ChainAnyUsage(&leaf, o.Roots, append(known, fetched...), now)
		} else if ferr != nil {
			return nil, attest.Deny(attest.ReasonAKCertUntrusted, "the AK certificate's issuer is not known and fetching it failed: %v", ferr)
		}
	}
	if err != nil {
		var invalid x509.CertificateInvalidError
		if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
			return nil, attest.Deny(attest.ReasonAKCertExpired, "a certificate of the AK certificate's chain is outside its validity: %v", err)
		}
		return nil, attest.Deny(attest.ReasonAKCertUntrusted, "the AK certificate does not chain to a pinned %s root: %v", o.RootName, err)
	}
	return cert, nil
}

// ChainAnyUsage verifies leaf to roots through intermediates at now, for
// any extended key usage: VerifyAKCert's chain, and identity/azuretpm's
// for its document's signer.
func ChainAnyUsage(leaf *x509.Certificate, roots *x509.CertPool, intermediates []*x509.Certificate, now time.Time) error {
	pool := x509.NewCertPool()
	for _, c := range intermediates {
		pool.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: pool, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	return err
}
