package aws

import (
	"bytes"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/smallstep/pkcs7"

	"github.com/nodeproof/nodeproof/attest"
)

// Digest algorithms a signer may use. AWS uses SHA-256; SHA-1 is refused.
var (
	oidSHA256 = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 1}
	oidSHA384 = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 2}
	oidSHA512 = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 3}
)

// Shapes of the document's identifiers.
var (
	accountRE      = regexp.MustCompile(`^[0-9]{12}$`)
	instanceIDRE   = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)
	imageIDRE      = regexp.MustCompile(`^ami-[0-9a-f]{8,17}$`)
	instanceTypeRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]*$`)
	zoneSuffixRE   = regexp.MustCompile(`^[a-z0-9-]+$`)
)

// document is an instance identity document after every field we use was
// checked. Nothing in it comes from anywhere but signed content.
type document struct {
	AccountID        string
	Region           string
	AvailabilityZone string
	InstanceID       string
	InstanceType     string
	ImageID          string
	PrivateIP        netip.Addr
	PendingTime      time.Time
}

// signedDocument is what parseSigned returns: the PKCS#7 and the raw JSON
// object members of its content, not yet trusted.
type signedDocument struct {
	p7      *pkcs7.PKCS7
	content []byte
	members map[string]json.RawMessage
}

// decodePKCS7 decodes Evidence.PKCS7: base64 with optional ASCII
// whitespace (IMDS breaks its lines), no PEM armour.
func decodePKCS7(s string) ([]byte, error) {
	clean := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\r', '\n':
		default:
			clean = append(clean, c)
		}
	}
	der := make([]byte, base64.StdEncoding.DecodedLen(len(clean)))
	n, err := base64.StdEncoding.Strict().Decode(der, clean)
	if err != nil {
		return nil, attest.Deny(attest.ReasonDocMalformed, "pkcs7 is not base64: %v", err)
	}
	return der[:n], nil
}

// parseSigned parses a DER/BER PKCS#7 SignedData and its attached content
// as a JSON object. It checks form only (DocumentMalformed): exactly one
// signer, attached non-empty content within MaxDocumentSize, a JSON object
// without duplicate members. Nothing is trusted until verifySignature.
func parseSigned(der []byte) (sd *signedDocument, err error) {
	p7, err := parsePKCS7(der)
	if err != nil {
		return nil, attest.Deny(attest.ReasonDocMalformed, "pkcs7 does not parse: %v", err)
	}
	if len(p7.Signers) != 1 {
		return nil, attest.Deny(attest.ReasonDocMalformed, "pkcs7 has %d signers (want exactly 1)", len(p7.Signers))
	}
	if len(p7.Content) == 0 {
		return nil, attest.Deny(attest.ReasonDocMalformed, "pkcs7 carries no document (detached or empty content)")
	}
	if len(p7.Content) > MaxDocumentSize {
		return nil, attest.Deny(attest.ReasonDocMalformed, "signed document exceeds %d bytes", MaxDocumentSize)
	}
	members, err := jsonObject(p7.Content)
	if err != nil {
		return nil, attest.Deny(attest.ReasonDocMalformed, "signed document is not a JSON object: %v", err)
	}
	return &signedDocument{p7: p7, content: p7.Content, members: members}, nil
}

// parsePKCS7 is pkcs7.Parse, with a panic in the parser turned into an
// error: the input is attacker-controlled.
func parsePKCS7(der []byte) (p7 *pkcs7.PKCS7, err error) {
	defer func() {
		if r := recover(); r != nil {
			p7, err = nil, fmt.Errorf("parser panic: %v", r)
		}
	}()
	return pkcs7.Parse(der)
}

// jsonObject decodes b, which must be exactly one JSON object with no
// duplicate member names, into its members.
func jsonObject(b []byte) (map[string]json.RawMessage, error) {
	if !utf8.Valid(b) {
		return nil, errors.New("not UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not an object")
	}
	members := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, ok := tok.(string)
		if !ok {
			return nil, errors.New("member name is not a string")
		}
		if _, dup := members[name]; dup {
			return nil, fmt.Errorf("duplicate member %q", name)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		members[name] = v
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the object")
	}
	return members, nil
}

// str returns member name as a non-empty JSON string of at most
// maxFieldSize bytes.
func (sd *signedDocument) str(name string) (string, error) {
	raw, ok := sd.members[name]
	if !ok {
		return "", attest.Deny(attest.ReasonDocMalformed, "document has no %s", name)
	}
	if len(raw) == 0 || raw[0] != '"' {
		return "", attest.Deny(attest.ReasonDocMalformed, "document %s is not a string", name)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", attest.Deny(attest.ReasonDocMalformed, "document %s: %v", name, err)
	}
	if s == "" {
		return "", attest.Deny(attest.ReasonDocMalformed, "document %s is empty", name)
	}
	if len(s) > maxFieldSize {
		return "", attest.Deny(attest.ReasonDocMalformed, "document %s exceeds %d bytes", name, maxFieldSize)
	}
	return s, nil
}

// region returns the document's Region, the one field read before the
// signature is checked: it chooses the certificate.
func (sd *signedDocument) region() (string, error) {
	r, err := sd.str("region")
	if err != nil {
		return "", err
	}
	if !regionRE.MatchString(r) {
		return "", attest.Deny(attest.ReasonDocMalformed, "document region %q is not a region name", r)
	}
	return r, nil
}

// verifySignature checks that the only signer is one of certs (matched by
// issuer and serial number, as PKCS#7 names its signer) and that its
// signature over the content (through the signed attributes, when present)
// verifies. Certificates embedded in the PKCS#7 are discarded unread: AWS
// embeds none, and one that is there chooses nothing.
//
// DocumentRegionCertMismatch: the signer is none of certs. Document-
// SignatureInvalid: a digest other than SHA-256/384/512, a content-type
// attribute other than id-data, a message digest that does not match the
// content, or a signature that does not verify.
func (sd *signedDocument) verifySignature(region string, certs []*x509.Certificate, now time.Time) error {
	signer := sd.p7.Signers[0]
	alg := signer.DigestAlgorithm.Algorithm
	if !alg.Equal(oidSHA256) && !alg.Equal(oidSHA384) && !alg.Equal(oidSHA512) {
		return attest.Deny(attest.ReasonDocSignature, "digest algorithm %s not allowed (want SHA-256)", alg)
	}
	if len(signer.AuthenticatedAttributes) > 0 {
		var ct asn1.ObjectIdentifier
		if err := sd.p7.UnmarshalSignedAttribute(pkcs7.OIDAttributeContentType, &ct); err != nil {
			return attest.Deny(attest.ReasonDocSignature, "signed attributes lack a content type: %v", err)
		}
		if !ct.Equal(pkcs7.OIDData) {
			return attest.Deny(attest.ReasonDocSignature, "signed content type is %s, not data", ct)
		}
	}
	for _, c := range certs {
		sd.p7.Certificates = []*x509.Certificate{c}
		if sd.p7.GetOnlySigner() == nil {
			continue
		}
		// A nil trust store: the certificate is trusted because it is the
		// Region's configured certificate, not because of a chain.
		if err := sd.p7.VerifyWithChainAtTime(nil, now); err != nil {
			sd.p7.Certificates = nil
			return attest.Deny(attest.ReasonDocSignature, "signature by the %s certificate does not verify: %v", region, err)
		}
		sd.p7.Certificates = nil
		return nil
	}
	sd.p7.Certificates = nil
	return attest.Deny(attest.ReasonDocRegionCert, "signer is not the %s certificate", region)
}

// parseDocument checks every field the verifier uses (DocumentMalformed).
// Call it only on signed content whose signature verified.
func (sd *signedDocument) parseDocument() (*document, error) {
	var d document
	var err error
	get := func(name string, re *regexp.Regexp) string {
		if err != nil {
			return ""
		}
		var s string
		s, err = sd.str(name)
		if err == nil && re != nil && !re.MatchString(s) {
			err = attest.Deny(attest.ReasonDocMalformed, "document %s %q is malformed", name, s)
		}
		return s
	}
	d.AccountID = get("accountId", accountRE)
	d.Region = get("region", regionRE)
	d.AvailabilityZone = get("availabilityZone", nil)
	d.InstanceID = get("instanceId", instanceIDRE)
	d.InstanceType = get("instanceType", instanceTypeRE)
	d.ImageID = get("imageId", imageIDRE)
	ip := get("privateIp", nil)
	pending := get("pendingTime", nil)
	if err != nil {
		return nil, err
	}
	suffix, ok := strings.CutPrefix(d.AvailabilityZone, d.Region)
	if !ok || suffix == "" || !zoneSuffixRE.MatchString(suffix) {
		return nil, attest.Deny(attest.ReasonDocMalformed, "document availabilityZone %q is not in region %s", d.AvailabilityZone, d.Region)
	}
	if d.PrivateIP, err = netip.ParseAddr(ip); err != nil || d.PrivateIP.Zone() != "" {
		return nil, attest.Deny(attest.ReasonDocMalformed, "document privateIp %q is not an IP address", ip)
	}
	d.PrivateIP = d.PrivateIP.Unmap()
	if d.PendingTime, err = time.Parse(time.RFC3339, pending); err != nil {
		return nil, attest.Deny(attest.ReasonDocMalformed, "document pendingTime %q is not RFC 3339: %v", pending, err)
	}
	return &d, nil
}
