package azuretpm

import (
	"crypto/x509"
	"regexp"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
)

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

// verifyCert checks an AK certificate and returns it parsed: the checks
// of tpm.VerifyAKCert, in its order and with its reasons (presence and
// size bounds, parsing, an end-entity certificate with digitalSignature
// among its key usages when it states any, no unhandled critical extension
// but the TCG SAN, validity at now, a chain at now to the pinned Azure
// vTPM roots through the trust's intermediates and the node's, for any
// extended key usage, as Azure's intermediates carry the TCG
// AK-certificate one), with no fetching of issuers.
//
// No revocation is checked.
func (v *Verifier) verifyCert(certDER []byte, intermediatesDER [][]byte, now time.Time) (*x509.Certificate, error) {
	return tpm.VerifyAKCert(certDER, intermediatesDER, now, tpm.AKCertOptions{
		Missing:            "a Trusted Launch VM's vTPM holds it in NV 0x01C101D0",
		MaxCertificateSize: MaxCertificateSize,
		MaxIntermediates:   MaxIntermediates,
		Roots:              v.akRoots,
		Intermediates:      v.trust.ak.Intermediates(),
		RootName:           "Azure vTPM",
	})
}
