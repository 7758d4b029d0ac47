package nitrotpm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"io"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/identity/aws"
)

// maxSkew is how far the hypervisor's clock and this server's may
// disagree when the document's timestamp is placed within the session.
const maxSkew = 60 * time.Second

// Options configure a Verifier. Each field says what it changes about
// security.
type Options struct {
	// Roots are the roots a document must chain to; nil means RootG1, the
	// AWS Nitro root. Tests give their own.
	Roots []*x509.Certificate
	// Identity verifies the instance identity document sent beside the
	// attestation document (account, Region, instance); required. Its
	// MaxDocumentAge does not apply here (the attestation document's nonce
	// proves freshness); its Certs and live check do.
	Identity *aws.Verifier
	// RequiredPCRs must all be covered by the quote's SHA-384 bank (and so
	// be in the document). Nil means 0-9.
	RequiredPCRs []int
	// SessionTTL bounds the time between challenge and answer. Zero means
	// five minutes; negative is refused.
	SessionTTL time.Duration
	// Clock tells the time; required (no global clock).
	Clock func() time.Time
	// Rand is the randomness for nonces; nil means crypto/rand.
	Rand io.Reader
}

// Verifier is the server side of NitroTPM evidence. It is safe for
// concurrent use and keeps no per-session state: what it needs between
// the two steps is in the attest.Session it returns, which the caller
// must seal.
type Verifier struct {
	roots    *x509.CertPool
	identity *aws.Verifier
	required []int
	sess     *attest.Sessions
}

// NewVerifier returns a Verifier. It refuses Options without Identity or
// Clock, required PCRs out of 0-23, and a negative SessionTTL.
func NewVerifier(o Options) (*Verifier, error) {
	sessions, err := attest.NewSessions(attest.KindNitroTPM, "nitrotpm", o.SessionTTL, o.Clock, o.Rand)
	if err != nil {
		return nil, err
	}
	if o.Identity == nil {
		return nil, errors.New("nitrotpm: Options.Identity is required: the attestation document names no account or Region")
	}
	if err := tpm.CheckRequiredPCRs("nitrotpm", o.RequiredPCRs); err != nil {
		return nil, err
	}
	v := &Verifier{roots: x509.NewCertPool(), identity: o.Identity, required: o.RequiredPCRs, sess: sessions}
	roots := o.Roots
	if roots == nil {
		r, err := RootG1()
		if err != nil {
			return nil, err
		}
		roots = []*x509.Certificate{r}
	}
	for _, r := range roots {
		v.roots.AddCert(r)
	}
	return v, nil
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
// single-use markers: a document carries the session's nonce, so a
// replayed one is refused only if the session cannot be answered twice);
// account and Region allow-lists, and the node name, are policy's.
//
// Checks, in order, each with its own denial reason:
//  1. The session is a NitroTPM session with a 32-byte nonce and kubelet
//     key hash (SessionInvalid) and has not expired at the verifier's
//     clock (SessionExpired); there is evidence (MalformedEvidence).
//  2. The attestation document parses (ParseDocument:
//     NitroDocumentMalformed), its ES384 signature verifies under its
//     certificate (NitroDocumentSignatureInvalid), and the certificate
//     chains through the CA bundle to the AWS Nitro root at the verifier's
//     clock (NitroDocumentChainUntrusted, NitroDocumentCertificateExpired).
//  3. Its timestamp lies within the session: not before the challenge nor
//     after now, give or take 60 s of clock skew
//     (NitroDocumentTimestamp).
//  4. Its nonce is the session's nonce, in constant time
//     (NitroDocumentNonceMismatch).
//  5. The instance identity document verifies (aws.Verifier's
//     VerifyIdentityDocument: its signature, fields and live check, each
//     with its reason; not its age), and the attestation document names
//     the same instance and Region (InstanceOf, both compared:
//     NitroDocumentInstanceMismatch).
//  6. The AK public area is an attestation key (tpm.ParseAK:
//     MalformedEvidence, AKAttributes, AKInvalid), and the document's
//     public_key is that key as PKIX DER, in constant time
//     (NitroDocumentKeyMismatch).
//  7. The quote, as attest/tpm's Verify checks one (tpm.VerifyQuote), on
//     the SHA-384 bank (SHA256BankMissing when no quote selects it),
//     covering RequiredPCRs, signed by the AK, qualifying data
//     attest.BindingDigest(session nonce, kubelet key hash), that hash the
//     session's, PCR values matching the quoted digest.
//  8. Every PCR the quote selects in the SHA-384 bank is in the document
//     with the same value (NitroPCRMismatch): the quoted values are the
//     ones AWS signed, whatever key made the quote.
//  9. The event log replays to those values and the boot state is read
//     from it as on bare metal, in the SHA-384 bank
//     (tpm.QuoteResult.ReplayBoot). The identity is proven by then: a
//     refusal here is wrapped in an *attest.Identified naming it.
//
// Claims: Kind aws-nitrotpm; Identity "aws:<account>/<region>/<instance
// id>" (identity/aws's form for the same instance); NodeName and
// Addresses as identity/aws gives them; Instance the EC2 instance; TPM the quote
// and boot (bank sha384, EKTrust "nitro-document").
func (v *Verifier) Verify(ctx context.Context, sess *attest.Session, ev *Evidence) (*attest.Claims, error) {
	now, err := v.sess.Check(sess)
	if err != nil {
		return nil, err
	}
	if ev == nil {
		return nil, attest.Deny(attest.ReasonMalformed, "no evidence")
	}
	doc, err := ParseDocument(ev.Document)
	if err != nil {
		return nil, err
	}
	if err := doc.Verify(v.roots, now); err != nil {
		return nil, err
	}
	if doc.Timestamp.Before(sess.IssuedAt.Add(-maxSkew)) || doc.Timestamp.After(now.Add(maxSkew)) {
		return nil, attest.Deny(attest.ReasonNitroDocTime, "the document was made at %s, outside this session (%s to %s)",
			doc.Timestamp.Format(time.RFC3339), sess.IssuedAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	if !attest.Equal(doc.Nonce, sess.Nonce) {
		return nil, attest.Deny(attest.ReasonNitroDocNonce, "the document's nonce is not this session's")
	}
	ac, err := v.identity.VerifyIdentityDocument(ctx, &ev.Identity)
	if err != nil {
		return nil, err
	}
	instance, region, err := InstanceOf(doc)
	if err != nil {
		return nil, err
	}
	if instance != ac.ID || region != ac.Location {
		return nil, attest.Deny(attest.ReasonNitroInstance, "the attestation document is instance %s in %s; the identity document is %s in %s", instance, region, ac.ID, ac.Location)
	}
	ak, err := tpm.ParseAK(ev.AKPublic)
	if err != nil {
		return nil, err
	}
	akDER, err := ak.PKIX()
	if err != nil {
		return nil, err
	}
	if !attest.Equal(doc.PublicKey, akDER) {
		return nil, attest.Deny(attest.ReasonNitroDocKey, "the document's public_key is not the AK (as PKIX DER)")
	}
	qr, err := tpm.VerifyQuote(ak, sess, &ev.Quote, tpm.QuoteOptions{Banks: []crypto.Hash{crypto.SHA384}, RequiredPCRs: v.required})
	if err != nil {
		return nil, err
	}
	for i, val := range qr.PCRs(crypto.SHA384) {
		signed, ok := doc.PCRs[i]
		if !ok || !attest.Equal(val, signed) {
			return nil, attest.Deny(attest.ReasonNitroPCRs, "quoted PCR %d of the SHA-384 bank differs from the attestation document's", i)
		}
	}
	identity := "aws:" + ac.Account + "/" + ac.Location + "/" + ac.ID
	tc, err := qr.IdentifiedClaims(ak, ev.Quote.EventLog, identity, "nitro-document")
	if err != nil {
		return nil, err
	}
	addrs := []string{ac.PrivateIP}
	if ac.PrivateDNSName != "" {
		addrs = append(addrs, ac.PrivateDNSName)
	}
	return &attest.Claims{
		Kind:             attest.KindNitroTPM,
		Identity:         identity,
		NodeName:         ac.PrivateDNSName,
		Addresses:        addrs,
		KubeletKeySHA256: bytes.Clone(sess.KubeletKeySHA256),
		VerifiedAt:       v.sess.Now(),
		Instance:         ac,
		TPM:              tc,
	}, nil
}
