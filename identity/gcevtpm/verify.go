package gcevtpm

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
)

// Options configure a Verifier. Each field says what it changes about
// security.
type Options struct {
	// Trust is what an AK certificate may chain to; required
	// (DefaultTrust: Google's two roots, pinned, and the shipped
	// intermediates).
	Trust *Trust
	// AIA, when set, fetches an AK certificate's issuers that are neither
	// shipped nor sent by the node, within its bounds (see AIA). Nil never
	// fetches: a certificate from an intermediate this build does not ship
	// is refused AKCertificateUntrusted until the node sends the
	// intermediate or an operator adds it (Trust.WithIntermediates).
	AIA *AIA
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

// Verifier is the server side of GCE vTPM evidence. It is safe for
// concurrent use and keeps no per-session state: what it needs between the
// two steps is in the attest.Session it returns, which the caller must
// seal.
type Verifier struct {
	trust    *Trust
	roots    *x509.CertPool
	aia      *AIA
	required []int
	sess     *attest.Sessions
}

// NewVerifier returns a Verifier. It refuses Options without Trust or
// Clock, an AIA without allowed hosts, required PCRs out of 0-23, and a
// negative SessionTTL.
func NewVerifier(o Options) (*Verifier, error) {
	sessions, err := attest.NewSessions(attest.KindGCEVTPM, "gcevtpm", o.SessionTTL, o.Clock, o.Rand)
	if err != nil {
		return nil, err
	}
	if o.Trust == nil {
		return nil, errors.New("gcevtpm: Options.Trust is required (DefaultTrust)")
	}
	if o.AIA != nil {
		if err := o.AIA.check(); err != nil {
			return nil, err
		}
	}
	if err := tpm.CheckRequiredPCRs("gcevtpm", o.RequiredPCRs); err != nil {
		return nil, err
	}
	return &Verifier{trust: o.Trust, roots: o.Trust.set.RootPool(), aia: o.AIA, required: o.RequiredPCRs, sess: sessions}, nil
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
// single-use markers); project and zone allow-lists, and the node name,
// are policy's.
//
// Checks, in order, each with its own denial reason:
//  1. The session is a GCE vTPM session with a 32-byte nonce and kubelet
//     key hash (SessionInvalid) and has not expired at the verifier's
//     clock (SessionExpired); there is evidence (MalformedEvidence).
//  2. The AK public area is an attestation key (tpm.ParseAK:
//     MalformedEvidence, AKAttributes, AKInvalid).
//  3. The AK certificate (verifyCert, tpm.VerifyAKCert's checks): present
//     (AKCertificateMissing), sizes (MalformedEvidence), parses
//     (AKCertificateInvalid), an end-entity signing-key certificate
//     with no unknown critical extension (AKCertificateInvalid), valid
//     now (AKCertificateExpired), chaining to one of the pinned Google
//     roots through shipped, sent or (if allowed) AIA-fetched
//     intermediates (AKCertificateUntrusted).
//  4. The certified key is the AK (tpm.AK.CertifiedBy): the
//     certificate's public key and the AK public area's, both as PKIX DER,
//     are equal in constant time
//     (AKCertificateKeyMismatch). The quote is verified with the AK public
//     area, so a quote by any other key fails step 6.
//  5. The instance extension (InstanceFromCertificate): present
//     (GCEInstanceInfoMissing), once, well-formed, with GCE's shapes of
//     names (GCEInstanceInfoMalformed), isProduction true
//     (GCEInstanceNotProduction).
//  6. The quote, as attest/tpm's Verify checks one (tpm.VerifyQuote):
//     SHA-256 bank (SHA-1 accepted and marked for policy), covering
//     RequiredPCRs, signed by the AK, TPM_GENERATED, qualifying data
//     attest.BindingDigest(session nonce, kubelet key hash), that hash the
//     session's, PCR values matching the quoted digest (each with its TPM
//     reason).
//  7. The event log replays to the quoted PCRs and the boot state is read
//     from it as on bare metal (tpm.QuoteResult.ReplayBoot). The identity
//     is proven by then: a refusal here is wrapped in an
//     *attest.Identified naming it.
//
// Claims: Kind gce-vtpm; Identity "gcp:<project number>/<zone>/<instance
// id>" (identity/gcp's form for the same instance); NodeName the instance
// name; Instance the GCP instance (Created unknown: zero); TPM the quote
// and boot, with EKTrust "gce-ak-certificate" and the AK certificate's
// issuer and serial.
func (v *Verifier) Verify(ctx context.Context, sess *attest.Session, ev *Evidence) (*attest.Claims, error) {
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
	cert, err := v.verifyCert(ctx, ev.AKCertificate, ev.Intermediates, now)
	if err != nil {
		return nil, err
	}
	if err := ak.CertifiedBy(cert); err != nil {
		return nil, err
	}
	info, err := InstanceFromCertificate(cert)
	if err != nil {
		return nil, err
	}
	qr, err := tpm.VerifyQuote(ak, sess, &ev.Quote, tpm.QuoteOptions{RequiredPCRs: v.required})
	if err != nil {
		return nil, err
	}
	identity := info.Identity()
	tc, err := qr.IdentifiedClaims(ak, ev.Quote.EventLog, identity, "gce-ak-certificate")
	if err != nil {
		return nil, err
	}
	tc.AKCertIssuer, tc.AKCertSerial = cert.Issuer.String(), cert.SerialNumber.Text(16)
	return &attest.Claims{
		Kind:             attest.KindGCEVTPM,
		Identity:         identity,
		NodeName:         info.InstanceName,
		KubeletKeySHA256: bytes.Clone(sess.KubeletKeySHA256),
		VerifiedAt:       v.sess.Now(),
		Instance: &attest.InstanceClaims{
			Cloud: attest.CloudGCP, Account: info.ProjectID, AccountNumber: strconv.FormatUint(info.ProjectNumber, 10),
			Location: info.Zone, ID: strconv.FormatUint(info.InstanceID, 10), Name: info.InstanceName,
		},
		TPM: tc,
	}, nil
}

// Certificate runs Verify's checks 3 and 5 on an AK certificate alone:
// that it chains to a pinned root at the verifier's clock and names a
// production instance. For tools that show what a certificate says
// (nodeproof inspect); it proves nothing about who holds the key.
func (v *Verifier) Certificate(ctx context.Context, certDER []byte, intermediatesDER [][]byte) (*x509.Certificate, *InstanceInfo, error) {
	cert, err := v.verifyCert(ctx, certDER, intermediatesDER, v.sess.Now())
	if err != nil {
		return nil, nil, err
	}
	info, err := InstanceFromCertificate(cert)
	if err != nil {
		return nil, nil, err
	}
	return cert, info, nil
}
