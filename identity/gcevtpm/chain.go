package gcevtpm

import (
	"context"
	"crypto/x509"
	"time"

	"github.com/nodeproof/nodeproof/attest/tpm"
)

// verifyCert checks an AK certificate and returns it parsed: the checks
// of tpm.VerifyAKCert, in its order and with its reasons (presence and
// size bounds; parsing of it and of every intermediate the node sent,
// whether or not the chain needs them; an end-entity certificate of a
// signing key, digitalSignature required among its key usages, as
// Google's AK certificates have exactly that and its EK and encryption
// certificates have keyEncipherment or keyAgreement; no unhandled critical
// extension but the TCG SAN, which Google's tpm_ek_v1_cloud_host AK
// certificates mark critical; validity at now; a chain at now to the
// pinned Google roots through the trust's intermediates and the node's,
// for any extended key usage, as Google's carry the TCG EK-certificate one
// or none), and, when the chain fails for want of an issuer and an AIA is
// configured, through issuers fetched over AIA (AKCertificateUntrusted,
// also when fetching fails and fetches nothing).
//
// No revocation is checked: Google publishes CRLs for one of its two
// hierarchies only, and go-tpm-tools checks none (docs/cloud-tpm.md).
func (v *Verifier) verifyCert(ctx context.Context, certDER []byte, intermediatesDER [][]byte, now time.Time) (*x509.Certificate, error) {
	o := tpm.AKCertOptions{
		Missing:                 "the VM's vTPM has none in NV (0x01c10000/0x01c10002); GCE issues it to Shielded VMs with vTPM enabled",
		MaxCertificateSize:      MaxCertificateSize,
		MaxIntermediates:        MaxIntermediates,
		RequireDigitalSignature: true,
		Roots:                   v.roots,
		Intermediates:           v.trust.Intermediates(),
		RootName:                "Google",
	}
	if v.aia != nil {
		o.Fetch = func(cert *x509.Certificate, known []*x509.Certificate) ([]*x509.Certificate, error) {
			return v.aia.Issuers(ctx, cert, append(known, v.trust.Roots()...))
		}
	}
	return tpm.VerifyAKCert(certDER, intermediatesDER, now, o)
}
