package azuretpm

import (
	"bytes"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/smallstep/pkcs7"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
)

// TimestampLayout is the layout of the document's timeStamp fields
// ("11/28/26 00:16:17 -0000").
const TimestampLayout = "01/02/06 15:04:05 -0700"

// DefaultDocumentSigners are the names a document's signer may hold: the
// IMDS endpoints of Azure's clouds (public, US Government, China,
// Germany), as SPIRE's azure_imds allows.
var DefaultDocumentSigners = []string{"metadata.azure.com", "metadata.azure.us", "metadata.azure.cn", "metadata.microsoftazure.de"}

// Digest algorithms a signer may use; SHA-1 and MD5 are refused.
var (
	oidSHA256 = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 1}
	oidSHA384 = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 2}
	oidSHA512 = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 3}
)

// maxDocumentCertificates bounds the certificates a document's PKCS#7
// may carry (IMDS's carry the signer's alone).
const maxDocumentCertificates = 4

// nonceRE is what IMDS takes as a nonce: up to 32 alphanumerics.
var nonceRE = regexp.MustCompile(`^[A-Za-z0-9]{1,32}$`)

// Document is an attested document's content after its form was checked
// (ParseDocument) — not yet its signature, unless Verify returned it.
type Document struct {
	// Nonce is the nonce the caller of IMDS asked for.
	Nonce string
	// VMID and SubscriptionID are lower-case UUIDs.
	VMID, SubscriptionID string
	// SKU is the image's SKU (may be empty).
	SKU string
	// Created and Expires are the document's timeStamp.
	Created, Expires time.Time

	p7 *pkcs7.PKCS7
}

// content is the document's JSON as IMDS writes it (plan and licenseType
// are not read).
type content struct {
	Nonce          string `json:"nonce"`
	VMID           string `json:"vmId"`
	SubscriptionID string `json:"subscriptionId"`
	SKU            string `json:"sku"`
	TimeStamp      struct {
		CreatedOn string `json:"createdOn"`
		ExpiresOn string `json:"expiresOn"`
	} `json:"timeStamp"`
}

// ParseDocument parses an attested document's signature field: base64
// (ASCII whitespace ignored; IMDS breaks its lines) of a PKCS#7 SignedData
// with exactly one signer, at most 4 certificates and attached content within MaxContentSize, a
// JSON object with the fields read and their shapes: nonce of 1-32
// alphanumerics, vmId and subscriptionId UUIDs, sku at most 256 bytes,
// createdOn before expiresOn, both in TimestampLayout. Every refusal is
// AzureDocumentMalformed. It checks form only: nothing is trusted.
func ParseDocument(sig string) (*Document, error) {
	if len(sig) > MaxDocumentSize {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document of %d bytes exceeds %d", len(sig), MaxDocumentSize)
	}
	clean := strings.Map(func(r rune) rune {
		switch r {
		case ' ', '\t', '\r', '\n':
			return -1
		}
		return r
	}, sig)
	der, err := base64.StdEncoding.Strict().DecodeString(clean)
	if err != nil {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document is not base64: %v", err)
	}
	p7, err := parsePKCS7(der)
	if err != nil {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document is not PKCS#7: %v", err)
	}
	if len(p7.Signers) != 1 {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document has %d signers (want exactly 1)", len(p7.Signers))
	}
	if len(p7.Certificates) > maxDocumentCertificates {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document carries %d certificates; at most %d", len(p7.Certificates), maxDocumentCertificates)
	}
	if len(p7.Content) == 0 || len(p7.Content) > MaxContentSize {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document content of %d bytes (want 1 to %d)", len(p7.Content), MaxContentSize)
	}
	if !utf8.Valid(p7.Content) {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document content is not UTF-8")
	}
	var c content
	dec := json.NewDecoder(bytes.NewReader(p7.Content))
	if err := dec.Decode(&c); err != nil {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document content is not its JSON: %v", err)
	}
	if dec.More() {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document content has data after its JSON")
	}
	d := &Document{Nonce: c.Nonce, VMID: strings.ToLower(c.VMID), SubscriptionID: strings.ToLower(c.SubscriptionID), SKU: c.SKU, p7: p7}
	switch {
	case !nonceRE.MatchString(d.Nonce):
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document nonce %q is not 1-32 alphanumerics", d.Nonce)
	case !uuidRE.MatchString(d.VMID):
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document vmId %q is not a UUID", c.VMID)
	case !uuidRE.MatchString(d.SubscriptionID):
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document subscriptionId %q is not a UUID", c.SubscriptionID)
	case len(d.SKU) > 256:
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document sku exceeds 256 bytes")
	}
	if d.Created, err = time.Parse(TimestampLayout, c.TimeStamp.CreatedOn); err != nil {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document createdOn %q: %v", c.TimeStamp.CreatedOn, err)
	}
	if d.Expires, err = time.Parse(TimestampLayout, c.TimeStamp.ExpiresOn); err != nil {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document expiresOn %q: %v", c.TimeStamp.ExpiresOn, err)
	}
	if !d.Created.Before(d.Expires) {
		return nil, attest.Deny(attest.ReasonAzureDocMalformed, "attested document expires (%s) before it is created (%s)", c.TimeStamp.ExpiresOn, c.TimeStamp.CreatedOn)
	}
	return d, nil
}

// parsePKCS7 is pkcs7.Parse, with a panic in the parser turned into an
// error: the input is the node's.
func parsePKCS7(der []byte) (p7 *pkcs7.PKCS7, err error) {
	defer func() {
		if r := recover(); r != nil {
			p7, err = nil, fmt.Errorf("parser panic: %v", r)
		}
	}()
	return pkcs7.Parse(der)
}

// verifyDocument checks a parsed document's signature and signer; the
// caller checks its fields against the session and the certificate.
// Checks, in order, each with its reason:
//  1. the signer's digest is SHA-256, -384 or -512, a content-type
//     attribute (when there are signed attributes) is id-data, and the
//     signature verifies under the certificate the PKCS#7 names as its
//     signer (AzureDocumentSignatureInvalid; a signing-time attribute
//     outside that certificate's validity: AzureDocumentExpired);
//  2. that certificate is within its validity at now and chains, at now,
//     to a pinned IMDS root through the trust's intermediates and the
//     other certificates of the PKCS#7 (AzureDocumentSignerUntrusted; out
//     of validity: AzureDocumentExpired);
//  3. it is a certificate for one of the allowed signer names
//     (x509 host name rules) (AzureDocumentSignerUntrusted).
func (v *Verifier) verifyDocument(d *Document, now time.Time) error {
	p7 := d.p7
	signer := p7.Signers[0]
	alg := signer.DigestAlgorithm.Algorithm
	if !alg.Equal(oidSHA256) && !alg.Equal(oidSHA384) && !alg.Equal(oidSHA512) {
		return attest.Deny(attest.ReasonAzureDocSignature, "digest algorithm %s not allowed (want SHA-256, -384 or -512)", alg)
	}
	if len(signer.AuthenticatedAttributes) > 0 {
		var ct asn1.ObjectIdentifier
		if err := p7.UnmarshalSignedAttribute(pkcs7.OIDAttributeContentType, &ct); err != nil || !ct.Equal(pkcs7.OIDData) {
			return attest.Deny(attest.ReasonAzureDocSignature, "the signed content type is not data")
		}
	}
	cert := p7.GetOnlySigner()
	if cert == nil {
		return attest.Deny(attest.ReasonAzureDocSignature, "the PKCS#7 does not carry its signer's certificate")
	}
	// A nil trust store: the signature alone; the chain is checked below
	// at the verifier's clock, with its own reasons.
	if err := p7.VerifyWithChainAtTime(nil, now); err != nil {
		var st *pkcs7.SigningTimeNotValidError
		if errors.As(err, &st) {
			return attest.Deny(attest.ReasonAzureDocExpired, "the document was signed outside its signer's validity: %v", err)
		}
		return attest.Deny(attest.ReasonAzureDocSignature, "the attested document's signature does not verify: %v", err)
	}
	if now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return attest.Deny(attest.ReasonAzureDocExpired, "the document signer's certificate is valid from %s to %s", cert.NotBefore.UTC().Format(time.RFC3339), cert.NotAfter.UTC().Format(time.RFC3339))
	}
	known := append([]*x509.Certificate(nil), v.trust.doc.Intermediates()...)
	for _, c := range p7.Certificates {
		if c != cert {
			known = append(known, c)
		}
	}
	if err := tpm.ChainAnyUsage(cert, v.docRoots, known, now); err != nil {
		var invalid x509.CertificateInvalidError
		if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
			return attest.Deny(attest.ReasonAzureDocExpired, "a certificate of the document signer's chain is outside its validity: %v", err)
		}
		return attest.Deny(attest.ReasonAzureDocUntrusted, "the document's signer %q does not chain to a pinned IMDS root: %v", cert.Subject, err)
	}
	for _, name := range v.signers {
		if cert.VerifyHostname(name) == nil {
			return nil
		}
	}
	return attest.Deny(attest.ReasonAzureDocUntrusted, "the document's signer %q is for none of %s", cert.Subject, strings.Join(v.signers, ", "))
}
