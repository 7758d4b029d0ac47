package aws

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// maxFutureSkew is how far in the future a document's pendingTime may be
// (the clocks of AWS and of this server disagree by at most this much).
const maxFutureSkew = 60 * time.Second

// Options configure a Verifier. Each field says what it changes about
// security.
type Options struct {
	// Certs are the Regions' RSA-2048 certificates; required. A document is
	// accepted only if the certificate of the Region it names signed it, so
	// this set decides which Regions can enroll at all (DefaultRegionCerts:
	// every Region AWS published a certificate for).
	Certs *RegionCerts
	// MaxDocumentAge bounds how long after an instance started (the
	// document's pendingTime) its document is accepted. The document has no
	// nonce, so this is the window in which a copied document could be
	// replayed by someone else first. Zero means one hour; negative is
	// refused.
	MaxDocumentAge time.Duration
	// Live, when set, asks the EC2 API to confirm the instance (running, in
	// the expected VPC, with the expected tags) before claims are returned,
	// and supplies the instance's private DNS name (identity/aws/ec2live).
	// Nil skips the check and claims say LiveChecked false, which policy
	// may refuse.
	Live LiveChecker
	// SessionTTL bounds the time between challenge and answer. Zero means
	// five minutes; negative is refused.
	SessionTTL time.Duration
	// Clock tells the time; required (no global clock).
	Clock func() time.Time
	// Rand is the randomness for nonces; nil means crypto/rand.
	Rand io.Reader
}

// Verifier is the server side of AWS evidence. It is safe for concurrent
// use and keeps no per-session state: what it needs between the two steps
// is in the attest.Session it returns, which the caller must seal.
type Verifier struct {
	certs  *RegionCerts
	maxAge time.Duration
	live   LiveChecker
	sess   *attest.Sessions
}

// NewVerifier returns a Verifier. It refuses Options without Certs or Clock,
// a certificate whose key is not RSA of at least 2048 bits, and negative
// durations.
func NewVerifier(o Options) (*Verifier, error) {
	sessions, err := attest.NewSessions(attest.KindAWS, "aws", o.SessionTTL, o.Clock, o.Rand)
	if err != nil {
		return nil, err
	}
	if o.Certs == nil {
		return nil, errors.New("aws: Options.Certs is required")
	}
	if err := o.Certs.check(); err != nil {
		return nil, err
	}
	if o.MaxDocumentAge < 0 {
		return nil, fmt.Errorf("aws: Options.MaxDocumentAge %v is negative", o.MaxDocumentAge)
	}
	v := &Verifier{certs: o.Certs, maxAge: o.MaxDocumentAge, live: o.Live, sess: sessions}
	if v.maxAge == 0 {
		v.maxAge = time.Hour
	}
	return v, nil
}

// Challenge is step one. It checks the kubelet key hash (MalformedEvidence)
// and returns an empty challenge and a session with a fresh 32-byte nonce.
// The nonce cannot be bound into the document; it makes the session unique
// for the caller's single-use session store.
func (v *Verifier) Challenge(pool string, kubeletKeySHA256 []byte, req *ChallengeRequest) (*Challenge, *attest.Session, error) {
	sess, err := v.sess.Open(pool, kubeletKeySHA256)
	if err != nil {
		return nil, nil, err
	}
	return &Challenge{}, sess, nil
}

// Verify is step two: it checks the node's evidence against the session the
// caller unsealed and, only if every check passes, returns Claims.
// One-time use of the session, and of the instance (OnceKey), are the
// caller's to enforce in its store; account and Region allow-lists and the
// choice of node name are policy's.
//
// Checks, in order, each with its own denial reason:
//  1. The session is an AWS session with a 32-byte nonce and kubelet key
//     hash (SessionInvalid) and has not expired at the verifier's clock
//     (SessionExpired): attest.CheckSession.
//  2. Sizes, before any parsing: PKCS7 within MaxPKCS7Size, Document
//     within MaxDocumentSize, Signature within MaxSignatureSize
//     (MalformedEvidence).
//  3. PKCS7 is base64 and parses as a PKCS#7 SignedData with exactly one
//     signer and attached content of at most MaxDocumentSize bytes that is
//     one JSON object without duplicate members (DocumentMalformed). Bytes
//     after the PKCS#7 structure are outside it and ignored by the parser;
//     they are not signed and choose nothing.
//  4. The signed document's region is a Region name (DocumentMalformed)
//     with configured certificates, and the signer is one of them, matched
//     by issuer and serial number; certificates inside the PKCS#7 are
//     discarded, never used (DocumentRegionCertMismatch).
//  5. The signature: digest SHA-256 (or 384/512), content-type attribute
//     id-data, message-digest attribute equal to the content's digest, RSA
//     signature valid under the Region's certificate
//     (DocumentSignatureInvalid).
//  6. Every field the claims use is read from the signed content and only
//     from it: accountId (12 digits), region, availabilityZone (in the
//     region), instanceId (i- and 8 to 17 hex digits), instanceType,
//     imageId (ami- and 8 to 17 hex digits), privateIp (an IP address),
//     pendingTime (RFC 3339); each present, a non-empty JSON string
//     (DocumentMalformed).
//  7. Evidence.Document, when present, is the signed document: equal to the
//     signed content apart from leading and trailing white space, which
//     JSON ignores (DocumentSubstituted). A different document there is a
//     substitution attempt; it is refused, not ignored, so that a node or
//     log that reads it is never shown another instance's document.
//  8. Freshness: pendingTime is at most MaxDocumentAge before now (not for
//     a re-attestation, sess.Reattest: an enrolled instance runs for months
//     on one document) and at most 60 s after it (DocumentTooOld).
//  9. The live check, when configured (InstanceNotRunning when the EC2 API
//     refuses the instance). An EC2 API that cannot be asked is an error
//     that is not a Denial: the caller should answer "try again" (503),
//     not refuse the node.
//
// Evidence.Signature, the legacy signature, is bounded (step 2) and
// otherwise ignored: PKCS7 proves everything it would.
func (v *Verifier) Verify(ctx context.Context, sess *attest.Session, ev *Evidence) (*attest.Claims, error) {
	now, err := v.sess.Check(sess)
	if err != nil {
		return nil, err
	}
	ac, err := v.identity(ctx, ev, now, !sess.Reattest())
	if err != nil {
		return nil, err
	}
	addrs := []string{ac.PrivateIP}
	if ac.PrivateDNSName != "" {
		addrs = append(addrs, ac.PrivateDNSName)
	}
	return &attest.Claims{
		Kind:             attest.KindAWS,
		Identity:         "aws:" + ac.Account + "/" + ac.Location + "/" + ac.ID,
		NodeName:         ac.PrivateDNSName,
		Addresses:        addrs,
		KubeletKeySHA256: bytes.Clone(sess.KubeletKeySHA256),
		VerifiedAt:       v.sess.Now(),
		Instance:         ac,
	}, nil
}

// VerifyIdentityDocument runs Verify's checks 2 to 7 and 9 on an instance
// identity document, without a session and without its age (check 8 but
// its bound on a pendingTime in the future): for
// evidence in which something else proves freshness, as a NitroTPM
// attestation document's nonce does (identity/nitrotpm). The document
// then says which instance, account and Region the other evidence is
// about; it is no proof that the presenter is that instance.
func (v *Verifier) VerifyIdentityDocument(ctx context.Context, ev *Evidence) (*attest.InstanceClaims, error) {
	return v.identity(ctx, ev, v.sess.Now(), false)
}

// identity runs Verify's checks 2 to 9 (8 only when checkAge).
func (v *Verifier) identity(ctx context.Context, ev *Evidence, now time.Time, checkAge bool) (*attest.InstanceClaims, error) {
	if ev == nil {
		return nil, attest.Deny(attest.ReasonMalformed, "no evidence")
	}
	if len(ev.PKCS7) > MaxPKCS7Size {
		return nil, attest.Deny(attest.ReasonMalformed, "pkcs7 exceeds %d bytes", MaxPKCS7Size)
	}
	if len(ev.Document) > MaxDocumentSize {
		return nil, attest.Deny(attest.ReasonMalformed, "document exceeds %d bytes", MaxDocumentSize)
	}
	if len(ev.Signature) > MaxSignatureSize {
		return nil, attest.Deny(attest.ReasonMalformed, "signature exceeds %d bytes", MaxSignatureSize)
	}

	doc, err := v.verifyDocument(ev, now)
	if err != nil {
		return nil, err
	}

	if checkAge && now.Sub(doc.PendingTime) > v.maxAge {
		return nil, attest.Deny(attest.ReasonDocTooOld, "instance started at %s, more than %v ago; a reinstalled instance keeps its document: stop and start it (EC2 signs a new one, with a new pendingTime) and attest again, and if that is refused as IdentityAlreadyEnrolled, release its node first (nodeproof release NODE)",
			doc.PendingTime.UTC().Format(time.RFC3339), v.maxAge)
	}
	if doc.PendingTime.Sub(now) > maxFutureSkew {
		return nil, attest.Deny(attest.ReasonDocTooOld, "pendingTime %s is in the future", doc.PendingTime.UTC().Format(time.RFC3339))
	}

	ac := &attest.InstanceClaims{
		Cloud: attest.CloudAWS, Account: doc.AccountID, Location: doc.Region, AvailabilityZone: doc.AvailabilityZone,
		ID: doc.InstanceID, Type: doc.InstanceType, Image: doc.ImageID,
		PrivateIP: doc.PrivateIP.String(), Created: doc.PendingTime,
	}
	if v.live != nil {
		dns, err := v.live.Check(ctx, ac)
		if err != nil {
			if _, ok := attest.ReasonOf(err); ok {
				return nil, err
			}
			return nil, fmt.Errorf("aws: live check of %s: %w", doc.InstanceID, err)
		}
		ac.LiveChecked = true
		ac.PrivateDNSName = dns
	}
	if ac.PrivateDNSName == "" {
		ac.PrivateDNSName = PrivateDNSName(doc.Region, ac.PrivateIP)
	}
	return ac, nil
}

// verifyDocument runs checks 3 to 7 of Verify.
func (v *Verifier) verifyDocument(ev *Evidence, now time.Time) (*document, error) {
	der, err := decodePKCS7(ev.PKCS7)
	if err != nil {
		return nil, err
	}
	sd, err := parseSigned(der)
	if err != nil {
		return nil, err
	}
	region, err := sd.region()
	if err != nil {
		return nil, err
	}
	certs := v.certs.m[region]
	if len(certs) == 0 {
		return nil, attest.Deny(attest.ReasonDocRegionCert, "no certificate for region %s", region)
	}
	if err := sd.verifySignature(region, certs, now); err != nil {
		return nil, err
	}
	doc, err := sd.parseDocument()
	if err != nil {
		return nil, err
	}
	if len(ev.Document) > 0 && !bytes.Equal(bytes.TrimSpace(ev.Document), bytes.TrimSpace(sd.content)) {
		return nil, attest.Deny(attest.ReasonDocSubstituted, "evidence document differs from the signed document (only the signed one is read; a different one is refused)")
	}
	return doc, nil
}

// PrivateDNSName returns the private DNS name EC2 gives an instance by IP
// name: ip-10-0-1-2.ec2.internal in us-east-1 and
// ip-10-0-1-2.<region>.compute.internal elsewhere. It is empty for an
// address that is not IPv4 (EC2 names IPv6-only instances by resource
// name, which the document does not establish).
func PrivateDNSName(region, privateIP string) string {
	ip, err := netip.ParseAddr(privateIP)
	if err != nil || !ip.Is4() || !regionRE.MatchString(region) {
		return ""
	}
	host := "ip-" + strings.ReplaceAll(ip.String(), ".", "-")
	if region == "us-east-1" {
		return host + ".ec2.internal"
	}
	return host + "." + region + ".compute.internal"
}
