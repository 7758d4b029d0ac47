package gcp

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/nodeproof/nodeproof/attest"
)

// Issuer is the only iss a token may carry. Google documents
// "https://accounts.google.com" for Compute Engine instance identity
// tokens; the scheme-less "accounts.google.com" that some Google Sign-In
// ID tokens carry is refused, so there is exactly one accepted form.
const Issuer = "https://accounts.google.com"

// DefaultMaxSkew is the clock skew allowed on exp, iat and nbf when
// Options.MaxSkew is zero, and the most that may be configured.
const DefaultMaxSkew = 60 * time.Second

// Options configure a Verifier. Each field says what it changes about
// security.
type Options struct {
	// Keys finds the key that signed a token by its key ID; required.
	// Only keys from here are ever used: a token's jku, x5u, jwk or x5c
	// header never chooses one. In production a JWKSSource on
	// GoogleJWKSURL.
	Keys KeySource
	// AudiencePrefix is this server's external URL, e.g.
	// "https://api-int.example.com:22623": https, no trailing slash, no
	// query or fragment; required. Every audience this verifier issues
	// and accepts starts with it, so a token minted for another service
	// (another audience) never passes here, nor one of ours elsewhere.
	AudiencePrefix string
	// SessionTTL bounds the time between challenge and answer. Zero means
	// five minutes.
	SessionTTL time.Duration
	// MaxSkew is the clock skew tolerated between Google and this server
	// on exp, iat and nbf. Zero means DefaultMaxSkew (60s); more than that
	// is refused by NewVerifier, so an expired token is never accepted
	// more than a minute late.
	MaxSkew time.Duration
	// Clock tells the time; required (no global clock).
	Clock func() time.Time
	// Rand is the randomness for nonces; nil means crypto/rand.
	Rand io.Reader
}

// Verifier is the server side of GCP evidence. It is safe for concurrent
// use and keeps no per-session state: what it needs between the two steps
// is in the attest.Session it returns, which the caller must seal.
type Verifier struct {
	keys   KeySource
	prefix string
	skew   time.Duration
	sess   *attest.Sessions
}

// NewVerifier returns a Verifier, or an error if an option is missing or
// unsafe.
func NewVerifier(o Options) (*Verifier, error) {
	if o.Keys == nil {
		return nil, errors.New("gcp: Options.Keys is required")
	}
	sessions, err := attest.NewSessions(attest.KindGCP, "gcp", o.SessionTTL, o.Clock, o.Rand)
	if err != nil {
		return nil, err
	}
	if err := checkAudiencePrefix(o.AudiencePrefix); err != nil {
		return nil, err
	}
	if o.MaxSkew < 0 || o.MaxSkew > DefaultMaxSkew {
		return nil, fmt.Errorf("gcp: Options.MaxSkew %s outside 0..%s", o.MaxSkew, DefaultMaxSkew)
	}
	v := &Verifier{keys: o.Keys, prefix: o.AudiencePrefix, skew: o.MaxSkew, sess: sessions}
	if v.skew == 0 {
		v.skew = DefaultMaxSkew
	}
	return v, nil
}

// checkAudiencePrefix accepts an absolute https URL without credentials,
// query, fragment or trailing slash, short enough to leave room for the
// session part of the audience.
func checkAudiencePrefix(p string) error {
	u, err := url.Parse(p)
	switch {
	case p == "":
		return errors.New("gcp: Options.AudiencePrefix is required")
	case err != nil:
		return fmt.Errorf("gcp: Options.AudiencePrefix: %v", err)
	case u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(p, "?#"):
		return fmt.Errorf("gcp: Options.AudiencePrefix %q must be an https URL without credentials, query or fragment", p)
	case strings.HasSuffix(p, "/"):
		return fmt.Errorf("gcp: Options.AudiencePrefix %q must not end in a slash", p)
	case len(p) > MaxAudienceSize/2:
		return fmt.Errorf("gcp: Options.AudiencePrefix is longer than %d bytes", MaxAudienceSize/2)
	}
	return nil
}

// audienceFor is the audience of a session: AudiencePrefix + AudiencePath
// + base64url-no-padding(BindingDigest(nonce, kubelet key hash)).
func (v *Verifier) audienceFor(nonce, kubeletKeySHA256 []byte) string {
	return v.prefix + AudiencePath + base64.RawURLEncoding.EncodeToString(attest.BindingDigest(nonce, kubeletKeySHA256))
}

// Challenge is step one: a fresh 32-byte nonce and the audience that binds
// it and the kubelet key hash. It refuses a kubelet key hash that is not 32
// bytes (MalformedEvidence). req carries nothing and may be nil.
func (v *Verifier) Challenge(pool string, kubeletKeySHA256 []byte, req *ChallengeRequest) (*Challenge, *attest.Session, error) {
	sess, err := v.sess.Open(pool, kubeletKeySHA256)
	if err != nil {
		return nil, nil, err
	}
	return &Challenge{Audience: v.audienceFor(sess.Nonce, kubeletKeySHA256)}, sess, nil
}

// Verify is step two: it checks the node's token against the session the
// caller unsealed and, only if every check passes, returns Claims. The
// audience it expects is recomputed from the session, never read from the
// evidence. One-time use of a session is the caller's to enforce (the
// store). Policy (projects, zones, instance age) is attest/policy's.
//
// Checks, in order, each with its own denial reason:
//  1. The session is a GCP session with a 32-byte nonce and kubelet key
//     hash (SessionInvalid) and has not expired at the verifier's clock
//     (SessionExpired).
//  2. The token is present, at most MaxTokenSize bytes, and parses as a
//     compact JWS (go-jose; MalformedEvidence). Its protected header
//     carries no crit or b64 (MalformedEvidence): Google sets neither, and
//     without them the signing input has one meaning.
//  3. Its alg is exactly RS256 (TokenAlgorithmNotAllowed): none, HS256
//     (including an HMAC keyed with Google's public key), RS384, RS512,
//     PS256, ES256 and everything else are refused before any key is
//     looked up.
//  4. Its kid names a key the KeySource has (TokenKeyUnknown; a source
//     that cannot learn its keys gives TrustRootsUnavailable). The key is
//     RSA of 2048 bits or more (TokenKeyUnknown). jku, x5u, jwk and x5c
//     never choose a key.
//  5. The RS256 signature verifies under that key (go-jose;
//     TokenSignatureInvalid). Nothing below is read before this passes.
//  6. The payload is a JSON object (MalformedEvidence).
//  7. iss is exactly Issuer, "https://accounts.google.com"
//     (TokenIssuerMismatch).
//  8. aud is exactly the session's audience (TokenAudienceMismatch): a
//     token minted for another session (replay) or another kubelet key
//     does not pass.
//  9. exp and iat are integers (TokenClaimsMissing); now < exp + MaxSkew
//     (TokenExpired); iat <= now + MaxSkew and, when present, nbf <= now +
//     MaxSkew (TokenIssuedInFuture).
//  10. google.compute_engine is present with project_id (project ID
//     form), project_number and instance_id (decimal), zone and
//     instance_name (RFC 1035 labels) and instance_creation_timestamp (a
//     positive integer); email, when present, is printable ASCII
//     (TokenClaimsMissing). A format=standard token has no
//     google.compute_engine and is refused here.
//
// Claims: Identity "gcp:<project_number>/<instance_id>", NodeName the
// instance_name (never anything from the request), Addresses (addresses),
// the session's kubelet key hash, VerifiedAt the verifier's clock, and the
// GCP facts.
func (v *Verifier) Verify(ctx context.Context, sess *attest.Session, ev *Evidence) (*attest.Claims, error) {
	now, err := v.sess.Check(sess)
	if err != nil {
		return nil, err
	}
	if ev == nil || ev.Token == "" {
		return nil, attest.Deny(attest.ReasonMalformed, "no token")
	}
	payload, err := v.verifySignature(ctx, ev.Token)
	if err != nil {
		return nil, err
	}
	return v.claims(payload, sess, now)
}

// claims does checks 6 to 10 on a payload whose signature verified, and
// builds the Claims.
func (v *Verifier) claims(payload []byte, sess *attest.Session, now time.Time) (*attest.Claims, error) {
	var tc tokenClaims
	if err := unmarshalObject(payload, &tc); err != nil {
		return nil, attest.Deny(attest.ReasonMalformed, "token payload: %v", err)
	}
	if iss, ok := str(tc.Iss); !ok || iss != Issuer {
		return nil, attest.Deny(attest.ReasonTokenIssuer, "issuer %.64s is not %s", tc.Iss, Issuer)
	}
	want := v.audienceFor(sess.Nonce, sess.KubeletKeySHA256)
	if aud, ok := audience(tc.Aud); !ok || !attest.Equal([]byte(aud), []byte(want)) {
		return nil, attest.Deny(attest.ReasonTokenAudience, "token was not minted for this session and kubelet key")
	}
	if err := v.checkTimes(&tc, now); err != nil {
		return nil, err
	}
	g, err := computeEngineClaims(&tc)
	if err != nil {
		return nil, err
	}
	return &attest.Claims{
		Kind:             attest.KindGCP,
		Identity:         "gcp:" + g.AccountNumber + "/" + g.Location + "/" + g.ID,
		NodeName:         g.Name,
		Addresses:        addresses(g),
		KubeletKeySHA256: append([]byte(nil), sess.KubeletKeySHA256...),
		VerifiedAt:       now,
		Instance:         g,
	}, nil
}

// addresses are the node addresses a verified token attests, for kubelet
// serving certificates: the instance name, and the instance's zonal
// internal DNS name <instance_name>.<zone>.c.<project_id>.internal (GCP's
// documented zonal DNS, the default for projects since September 2018).
// The project-wide form <instance_name>.c.<project_id>.internal is not
// included (it exists only for projects set to global DNS, which the token
// does not say), nor are IPs (the token carries none), nor any name for a
// legacy domain-scoped project ID ("example.com:p"), whose DNS form the
// token does not fix. g's fields were validated (check 10): each is an RFC
// 1035 label, so the name is a valid DNS name.
func addresses(g *attest.InstanceClaims) []string {
	addrs := []string{g.Name}
	if !strings.Contains(g.Account, ":") {
		addrs = append(addrs, g.Name+"."+g.Location+".c."+g.Account+".internal")
	}
	return addrs
}

// verifySignature does checks 2 to 5 and returns the signed payload.
func (v *Verifier) verifySignature(ctx context.Context, token string) ([]byte, error) {
	if len(token) > MaxTokenSize {
		return nil, attest.Deny(attest.ReasonMalformed, "token of %d bytes exceeds %d", len(token), MaxTokenSize)
	}
	jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		var alg *jose.ErrUnexpectedSignatureAlgorithm
		if errors.As(err, &alg) {
			return nil, attest.Deny(attest.ReasonTokenAlgorithm, "algorithm %.32q is not RS256", alg.Got)
		}
		return nil, attest.Deny(attest.ReasonMalformed, "token is not a compact JWS: %v", err)
	}
	if len(jws.Signatures) != 1 {
		return nil, attest.Deny(attest.ReasonMalformed, "token has %d signatures", len(jws.Signatures))
	}
	sig := jws.Signatures[0]
	if sig.Protected.Algorithm != string(jose.RS256) { // belt and braces: go-jose checked the merged header
		return nil, attest.Deny(attest.ReasonTokenAlgorithm, "algorithm %.32q is not RS256", sig.Protected.Algorithm)
	}
	for _, h := range []jose.HeaderKey{"crit", "b64"} {
		if _, ok := sig.Protected.ExtraHeaders[h]; ok {
			return nil, attest.Deny(attest.ReasonMalformed, "token header carries %q", h)
		}
	}
	kid := sig.Protected.KeyID
	key, err := v.keys.Key(ctx, kid)
	if err != nil {
		if r, ok := attest.ReasonOf(err); ok && (r == attest.ReasonTokenKeyUnknown || r == attest.ReasonKeysUnavailable) {
			return nil, err
		}
		return nil, attest.Deny(attest.ReasonKeysUnavailable, "key source: %v", err)
	}
	if key == nil || key.N == nil {
		return nil, attest.Deny(attest.ReasonKeysUnavailable, "key source returned no key for %.64q", kid)
	}
	if key.N.BitLen() < minRSABits {
		return nil, attest.Deny(attest.ReasonTokenKeyUnknown, "key %.64q is %d bits; at least %d required", kid, key.N.BitLen(), minRSABits)
	}
	payload, err := jws.Verify(key)
	if err != nil {
		return nil, attest.Deny(attest.ReasonTokenSignature, "signature does not verify under key %.64q", kid)
	}
	return payload, nil
}

// checkTimes does check 9.
func (v *Verifier) checkTimes(tc *tokenClaims, now time.Time) error {
	exp, ok := intClaim(tc.Exp)
	if !ok {
		return attest.Deny(attest.ReasonTokenClaims, "exp missing or not an integer")
	}
	iat, ok := intClaim(tc.Iat)
	if !ok {
		return attest.Deny(attest.ReasonTokenClaims, "iat missing or not an integer")
	}
	// Compare in whole seconds, as NumericDates are; no sum below can
	// overflow, since only now is offset.
	nowS := now.Unix()
	skew := int64(v.skew / time.Second)
	if exp <= nowS-skew {
		return attest.Deny(attest.ReasonTokenExpired, "token expired at %d, now %d", exp, nowS)
	}
	if iat > nowS+skew {
		return attest.Deny(attest.ReasonTokenNotYetValid, "token issued at %d, now %d", iat, nowS)
	}
	if present(tc.Nbf) {
		nbf, ok := intClaim(tc.Nbf)
		if !ok {
			return attest.Deny(attest.ReasonTokenClaims, "nbf not an integer")
		}
		if nbf > nowS+skew {
			return attest.Deny(attest.ReasonTokenNotYetValid, "token not valid before %d, now %d", nbf, nowS)
		}
	}
	return nil
}

// computeEngineClaims does check 10.
func computeEngineClaims(tc *tokenClaims) (*attest.InstanceClaims, error) {
	var gc googleClaims
	var ce computeEngine
	if !present(tc.Google) || unmarshalObject(tc.Google, &gc) != nil ||
		!present(gc.ComputeEngine) || unmarshalObject(gc.ComputeEngine, &ce) != nil {
		return nil, attest.Deny(attest.ReasonTokenClaims, "no google.compute_engine claims (not a format=full token)")
	}
	missing := func(name string) error {
		return attest.Deny(attest.ReasonTokenClaims, "google.compute_engine.%s missing or malformed", name)
	}
	g := &attest.InstanceClaims{Cloud: attest.CloudGCP}
	var ok bool
	if g.Account, ok = str(ce.ProjectID); !ok || !isProjectID(g.Account) {
		return nil, missing("project_id")
	}
	if g.AccountNumber, ok = decimalID(ce.ProjectNumber); !ok {
		return nil, missing("project_number")
	}
	if g.Location, ok = str(ce.Zone); !ok || !isLabel(g.Location) {
		return nil, missing("zone")
	}
	if g.ID, ok = decimalID(ce.InstanceID); !ok {
		return nil, missing("instance_id")
	}
	if g.Name, ok = str(ce.InstanceName); !ok || !isLabel(g.Name) {
		return nil, missing("instance_name")
	}
	created, ok := intClaim(ce.InstanceCreationTimestamp)
	if !ok || created <= 0 || created > 1<<40 {
		return nil, missing("instance_creation_timestamp")
	}
	g.Created = time.Unix(created, 0).UTC()
	if present(tc.Email) {
		if g.ServiceAccount, ok = str(tc.Email); !ok || !isPrintable(g.ServiceAccount) {
			return nil, attest.Deny(attest.ReasonTokenClaims, "email malformed")
		}
	}
	return g, nil
}
