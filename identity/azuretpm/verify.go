package azuretpm

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"io"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
)

// DocumentClockSkew is how far before a document's createdOn the
// verifier's clock may be (IMDS's clock and the server's differ; createdOn
// has whole seconds).
const DocumentClockSkew = 2 * time.Minute

// Options configure a Verifier. Each field says what it changes about
// security.
type Options struct {
	// Trust is what the AK certificate and the document's signer may
	// chain to; required (DefaultTrust: Azure's vTPM root and the IMDS
	// roots, pinned, and the shipped intermediates).
	Trust *Trust
	// DocumentSigners are the names the document's signer may hold. Nil
	// means DefaultDocumentSigners; an empty non-nil list is refused.
	DocumentSigners []string
	// RequiredPCRs must all be covered by the quote's SHA-256 bank. Nil
	// means 0-9.
	RequiredPCRs []int
	// SessionTTL bounds the time between challenge and answer. Zero means
	// five minutes; negative is refused.
	SessionTTL time.Duration
	// Clock tells the time; required (no global clock).
	Clock func() time.Time
	// Rand is the randomness for nonces; nil means crypto/rand.
	Rand io.Reader
}

// Verifier is the server side of Azure vTPM evidence. It is safe for
// concurrent use and keeps no per-session state: what it needs between the
// two steps is in the attest.Session it returns, which the caller must
// seal.
type Verifier struct {
	trust             *Trust
	akRoots, docRoots *x509.CertPool
	signers           []string
	required          []int
	sess              *attest.Sessions
}

// NewVerifier returns a Verifier. It refuses Options without Trust or
// Clock, an empty signer list, required PCRs out of 0-23 and a negative
// SessionTTL.
func NewVerifier(o Options) (*Verifier, error) {
	sessions, err := attest.NewSessions(attest.KindAzureVTPM, "azuretpm", o.SessionTTL, o.Clock, o.Rand)
	if err != nil {
		return nil, err
	}
	if o.Trust == nil {
		return nil, errors.New("azuretpm: Options.Trust is required (DefaultTrust)")
	}
	if err := tpm.CheckRequiredPCRs("azuretpm", o.RequiredPCRs); err != nil {
		return nil, err
	}
	signers := o.DocumentSigners
	if signers == nil {
		signers = DefaultDocumentSigners
	}
	if len(signers) == 0 {
		return nil, errors.New("azuretpm: Options.DocumentSigners is empty: no document would be accepted")
	}
	return &Verifier{
		trust: o.Trust, akRoots: o.Trust.ak.RootPool(), docRoots: o.Trust.doc.RootPool(),
		signers: append([]string(nil), signers...), required: o.RequiredPCRs, sess: sessions,
	}, nil
}

// Challenge is step one. It checks the kubelet key hash (MalformedEvidence)
// and returns the challenge, a fresh 32-byte nonce, and the session for
// the caller to seal.
func (v *Verifier) Challenge(pool string, kubeletKeySHA256 []byte, _ *ChallengeRequest) (*Challenge, *attest.Session, error) {
	sess, err := v.sess.Open(pool, kubeletKeySHA256)
	if err != nil {
		return nil, nil, err
	}
	return &Challenge{Nonce: bytes.Clone(sess.Nonce)}, sess, nil
}

// Verify is step two: it checks the node's evidence against the session
// the caller unsealed and, only if every check passes, returns Claims.
// One use of the session is the caller's to enforce (the store's
// single-use markers); subscription allow-lists and the node name are
// policy's.
//
// Checks, in order, each with its own denial reason:
//  1. The session is an Azure vTPM session with a 32-byte nonce and
//     kubelet key hash (SessionInvalid) and has not expired at the
//     verifier's clock (SessionExpired); there is evidence
//     (MalformedEvidence).
//  2. The AK public area is an attestation key (tpm.ParseAK:
//     MalformedEvidence, AKAttributes, AKInvalid).
//  3. The AK certificate (verifyCert, tpm.VerifyAKCert's checks): present
//     (AKCertificateMissing), sizes (MalformedEvidence), parses
//     (AKCertificateInvalid), an end-entity signing-key certificate
//     with no unknown critical extension (AKCertificateInvalid), valid
//     now (AKCertificateExpired), chaining to the pinned Azure vTPM root
//     through shipped or sent intermediates (AKCertificateUntrusted).
//  4. Its subject names a VM: CN=<uuid>.TrustedVM.Azure.windows.net
//     (VMIDOf: AKCertificateInvalid).
//  5. The certified key is the AK (tpm.AK.CertifiedBy): the
//     certificate's public key and the AK public area's, both as PKIX DER,
//     are equal in constant time
//     (AKCertificateKeyMismatch). The quote is verified with the AK public
//     area, so a quote by any other key fails step 7.
//  6. The attested document: within MaxDocumentSize, base64 of a PKCS#7
//     with one signer and the documented JSON (ParseDocument:
//     AzureDocumentMalformed); its signature, signer chain to a pinned
//     IMDS root and signer name (verifyDocument:
//     AzureDocumentSignatureInvalid, AzureDocumentSignerUntrusted,
//     AzureDocumentExpired); its nonce is IMDSNonce(session nonce, session
//     kubelet key hash), compared in constant time
//     (AzureDocumentNonceMismatch); its vmId is the certificate's VM ID
//     (AzureDocumentVMMismatch); the verifier's clock is within its
//     createdOn (less DocumentClockSkew) and expiresOn
//     (AzureDocumentExpired).
//  7. The quote, as attest/tpm's Verify checks one (tpm.VerifyQuote):
//     SHA-256 bank (SHA-1 accepted and marked for policy), covering
//     RequiredPCRs, signed by the AK, TPM_GENERATED, qualifying data
//     attest.BindingDigest(session nonce, kubelet key hash), that hash the
//     session's, PCR values matching the quoted digest (each with its TPM
//     reason).
//  8. The event log replays to the quoted PCRs and the boot state is read
//     from it as on bare metal (tpm.QuoteResult.ReplayBoot). The identity
//     is proven by then: a refusal here is wrapped in an
//     *attest.Identified naming it.
//
// Claims: Kind azure-vtpm; Identity "azure:<subscription id>/<vm id>"
// (Identity); no NodeName (Azure signs none); Instance the VM (Cloud
// azure, Account the subscription, ID the VM ID, Image the document's
// SKU; no Location: the document names none); TPM the quote and boot,
// with EKTrust "azure-ak-certificate" and the AK certificate's issuer and
// serial.
func (v *Verifier) Verify(_ context.Context, sess *attest.Session, ev *Evidence) (*attest.Claims, error) {
	now, err := v.sess.Check(sess)
	if err != nil {
		return nil, err
	}
	if ev == nil {
		return nil, attest.Deny(attest.ReasonMalformed, "no evidence")
	}
	ak, err := tpm.ParseAK(ev.AKPublic)
	if err != nil {
		return nil, err
	}
	cert, err := v.verifyCert(ev.AKCertificate, ev.Intermediates, now)
	if err != nil {
		return nil, err
	}
	vmID, err := VMIDOf(cert)
	if err != nil {
		return nil, err
	}
	if err := ak.CertifiedBy(cert); err != nil {
		return nil, err
	}
	doc, err := v.checkDocument(ev.Document, sess, vmID, now)
	if err != nil {
		return nil, err
	}
	qr, err := tpm.VerifyQuote(ak, sess, &ev.Quote, tpm.QuoteOptions{RequiredPCRs: v.required})
	if err != nil {
		return nil, err
	}
	identity := Identity(doc.SubscriptionID, vmID)
	tc, err := qr.IdentifiedClaims(ak, ev.Quote.EventLog, identity, "azure-ak-certificate")
	if err != nil {
		return nil, err
	}
	tc.AKCertIssuer, tc.AKCertSerial = cert.Issuer.String(), cert.SerialNumber.Text(16)
	return &attest.Claims{
		Kind:             attest.KindAzureVTPM,
		Identity:         identity,
		KubeletKeySHA256: bytes.Clone(sess.KubeletKeySHA256),
		VerifiedAt:       v.sess.Now(),
		TPM:              tc,
		Instance: &attest.InstanceClaims{
			Cloud: attest.CloudAzure, Account: doc.SubscriptionID, ID: vmID, Image: doc.SKU,
		},
	}, nil
}

// checkDocument is Verify's step 6.
func (v *Verifier) checkDocument(sig string, sess *attest.Session, vmID string, now time.Time) (*Document, error) {
	d, err := ParseDocument(sig)
	if err != nil {
		return nil, err
	}
	if err := v.verifyDocument(d, now); err != nil {
		return nil, err
	}
	if !attest.Equal([]byte(d.Nonce), []byte(IMDSNonce(sess.Nonce, sess.KubeletKeySHA256))) {
		return nil, attest.Deny(attest.ReasonAzureDocNonce, "the attested document's nonce is not this session's")
	}
	if d.VMID != vmID {
		return nil, attest.Deny(attest.ReasonAzureDocVM, "the attested document names VM %s, the AK certificate VM %s", d.VMID, vmID)
	}
	if now.Before(d.Created.Add(-DocumentClockSkew)) || !now.Before(d.Expires) {
		return nil, attest.Deny(attest.ReasonAzureDocExpired, "the attested document is valid from %s to %s", d.Created.UTC().Format(time.RFC3339), d.Expires.UTC().Format(time.RFC3339))
	}
	return d, nil
}

// Certificate runs Verify's checks 3 and 4 on an AK certificate alone:
// that it chains to a pinned root at the verifier's clock and names a VM.
// For tools that show what a certificate says; it proves nothing about
// who holds the key.
func (v *Verifier) Certificate(certDER []byte, intermediatesDER [][]byte) (*x509.Certificate, string, error) {
	cert, err := v.verifyCert(certDER, intermediatesDER, v.sess.Now())
	if err != nil {
		return nil, "", err
	}
	vmID, err := VMIDOf(cert)
	if err != nil {
		return nil, "", err
	}
	return cert, vmID, nil
}

// Document runs Verify's check 6 but for the nonce and the VM: that a
// document is well-formed, signed by an allowed IMDS signer chaining to a
// pinned root, and within its validity at the verifier's clock.
func (v *Verifier) Document(sig string) (*Document, error) {
	now := v.sess.Now()
	d, err := ParseDocument(sig)
	if err != nil {
		return nil, err
	}
	if err := v.verifyDocument(d, now); err != nil {
		return nil, err
	}
	if now.Before(d.Created.Add(-DocumentClockSkew)) || !now.Before(d.Expires) {
		return nil, attest.Deny(attest.ReasonAzureDocExpired, "the attested document is valid from %s to %s", d.Created.UTC().Format(time.RFC3339), d.Expires.UTC().Format(time.RFC3339))
	}
	return d, nil
}
