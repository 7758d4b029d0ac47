package azuretpm

import (
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"regexp"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// oidSubjectAltName: TPM key certificates may carry the TCG's critical SAN
// of TPM manufacturer fields (a directoryName), which Go's x509 leaves
// unhandled; it is the one unhandled critical extension tolerated (as for
// EK certificates, attest/tpm, and GCE's AK certificates).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// akSubjectSuffix ends the common name of every Azure AK certificate:
// CN=<vm id>.TrustedVM.Azure.windows.net.
const akSubjectSuffix = ".trustedvm.azure.windows.net"

// uuidRE is the shape of an Azure VM ID and subscription ID.
var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// VMIDOf returns the VM ID an AK certificate's subject names, lower case:
// its common name must be <uuid>.TrustedVM.Azure.windows.net (compared
// without regard to case), else AKCertificateInvalid.
func VMIDOf(cert *x509.Certificate) (string, error) {
	cn := strings.ToLower(cert.Subject.CommonName)
	id, ok := strings.CutSuffix(cn, akSubjectSuffix)
	if !ok || !uuidRE.MatchString(id) {
		return "", attest.Deny(attest.ReasonAKCertInvalid, "the AK certificate's subject %q is not <vm id>.TrustedVM.Azure.windows.net", cert.Subject.CommonName)
	}
	return id, nil
}

// verifyCert checks an AK certificate and returns it parsed. Checks, in
// order, each with its reason:
//  1. it is present (AKCertificateMissing) and within MaxCertificateSize,
//     with at most MaxIntermediates intermediates of that size each
//     (MalformedEvidence);
//  2. it and every intermediate the node sent parse as X.509 DER
//     (AKCertificateInvalid);
//  3. it is an end-entity certificate: not a CA, no certificate-signing
//     key usage, and, when it states key usages, digitalSignature among
//     them (AKCertificateInvalid);
//  4. no unhandled critical extension but the TCG SAN
//     (AKCertificateInvalid);
//  5. it is within its validity at now (AKCertificateExpired);
//  6. it chains, at now, to a pinned root through the trust's
//     intermediates and the node's, for any extended key usage (Azure's
//     intermediates carry the TCG AK-certificate one)
//     (AKCertificateUntrusted; a certificate of the chain out of its
//     validity: AKCertificateExpired).
//
// No revocation is checked.
func (v *Verifier) verifyCert(certDER []byte, intermediatesDER [][]byte, now time.Time) (*x509.Certificate, error) {
	if len(certDER) == 0 {
		return nil, attest.Deny(attest.ReasonAKCertMissing, "no AK certificate: a Trusted Launch VM's vTPM holds it in NV 0x01C101D0")
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
	known := append(append([]*x509.Certificate(nil), v.trust.ak.intermediates...), extra...)
	if err := chain(&leaf, v.akRoots, known, now); err != nil {
		var invalid x509.CertificateInvalidError
		if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
			return nil, attest.Deny(attest.ReasonAKCertExpired, "a certificate of the AK certificate's chain is outside its validity: %v", err)
		}
		return nil, attest.Deny(attest.ReasonAKCertUntrusted, "the AK certificate does not chain to a pinned Azure vTPM root: %v", err)
	}
	return cert, nil
}

// chain verifies leaf to roots through intermediates at now, for any
// extended key usage.
func chain(leaf *x509.Certificate, roots *x509.CertPool, intermediates []*x509.Certificate, now time.Time) error {
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
