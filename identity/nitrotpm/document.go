package nitrotpm

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	_ "embed"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/veraison/go-cose"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/pemcert"
)

// rootG1 is the AWS Nitro Enclaves Root G1 certificate (certs/README.md).
//
//go:embed certs/aws-nitro-enclaves-root-g1.pem
var rootG1 []byte

// RootG1 returns the AWS Nitro Attestation PKI's root, "aws.nitro-enclaves"
// (G1), which signs NitroTPM documents as it signs Nitro Enclaves ones.
// Each call parses it afresh; there is no package state.
func RootG1() (*x509.Certificate, error) {
	certs, err := pemcert.Parse(rootG1)
	if err != nil || len(certs) != 1 {
		return nil, fmt.Errorf("nitrotpm: shipped root: %v", err)
	}
	return certs[0], nil
}

// Bounds of a document, from AWS's validation rules for attestation
// documents ("Validate a NitroTPM attestation document"), checked before
// and while parsing.
const (
	// MaxDocumentSize bounds the COSE_Sign1. AWS's are about 5 KiB with no
	// optional field; NitroTPM-Tools' message buffer is 8 KiB.
	MaxDocumentSize = 16 << 10
	// maxCertSize bounds the certificate and each CA bundle entry (AWS:
	// 1 to 1024 bytes).
	maxCertSize = 1024
	// maxBundle bounds the CA bundle's entries (AWS's have 4).
	maxBundle = 8
	// maxField bounds public_key (AWS: 1 to 1024 bytes) and user_data and
	// nonce (AWS: 0 to 512; NitroTPM-Tools: 1 KiB).
	maxPublicKey = 1024
	maxUserData  = 1024
	maxNonce     = 1024
	// PCRs: 1 to 32 entries, index 0-31, SHA-384 values.
	maxPCRs  = 32
	pcrBytes = 48
)

// Document is a NitroTPM attestation document's payload, parsed and
// checked for shape (not yet for its signature or chain).
type Document struct {
	// ModuleID names the NitroTPM: "i-<instance id>-tpm<16 hex digits>" in
	// every document seen (AWS does not document its format).
	ModuleID string
	// Timestamp is when the hypervisor made the document.
	Timestamp time.Time
	// PCRs are the SHA-384 PCR values (nitrotpm_pcrs), by index.
	PCRs map[int][]byte
	// Certificate signed the document; CABundle leads from the root
	// (first) to the certificate's issuer (last).
	Certificate *x509.Certificate
	CABundle    []*x509.Certificate
	// PublicKey, UserData and Nonce are what the requester asked the
	// document to carry (nil when absent).
	PublicKey, UserData, Nonce []byte

	msg *cose.UntaggedSign1Message
}

// decMode decodes the payload strictly: no duplicate keys, no tags,
// bounded nesting and sizes. Indefinite lengths are allowed: the Nitro
// hypervisor writes the payload as an indefinite-length map.
var decMode = func() cbor.DecMode {
	m, err := cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		IndefLength:      cbor.IndefLengthAllowed,
		TagsMd:           cbor.TagsForbidden,
		MaxNestedLevels:  4,
		MaxArrayElements: 64,
		MaxMapPairs:      64,
	}.DecMode()
	if err != nil {
		panic(err)
	}
	return m
}()

func malformed(format string, args ...any) error {
	return attest.Deny(attest.ReasonNitroDocMalformed, format, args...)
}

// CBOR major types, read from a raw item's first byte.
const (
	majorUint  = 0
	majorBytes = 2
	majorText  = 3
	majorArray = 4
	majorMap   = 5
	null       = 0xf6
)

func major(raw cbor.RawMessage) int { return int(raw[0] >> 5) }

func isNull(raw cbor.RawMessage) bool { return len(raw) == 1 && raw[0] == null }

// bytesField decodes a byte string of lo to hi bytes.
func bytesField(raw cbor.RawMessage, name string, lo, hi int) ([]byte, error) {
	var b []byte
	if major(raw) != majorBytes || decMode.Unmarshal(raw, &b) != nil {
		return nil, malformed("%s is not a byte string", name)
	}
	if len(b) < lo || len(b) > hi {
		return nil, malformed("%s has %d bytes; want %d to %d", name, len(b), lo, hi)
	}
	return b, nil
}

// ParseDocument reads a NitroTPM attestation document: an untagged
// COSE_Sign1 (RFC 9052) whose protected header names ES384 and whose
// payload is the CBOR map AWS documents, each field checked for type and
// size (NitroDocumentMalformed):
//   - module_id: a non-empty text string (at most 256 bytes);
//   - digest: "SHA384";
//   - timestamp: milliseconds since the epoch, not zero;
//   - nitrotpm_pcrs: 1 to 32 entries, index 0-31, 48-byte values (a
//     document with an enclave's "pcrs" instead is not a NitroTPM one);
//   - certificate: 1 to 1024 bytes of X.509 DER; cabundle: 1 to 8 of them;
//   - public_key (1 to 1024 bytes), user_data and nonce (up to 1024):
//     byte strings or null, when present.
//
// The map must have no duplicate key or tag; unknown keys are ignored (AWS
// may add fields). It does not verify anything.
func ParseDocument(b []byte) (*Document, error) {
	if len(b) == 0 || len(b) > MaxDocumentSize {
		return nil, malformed("document of %d bytes; want 1 to %d", len(b), MaxDocumentSize)
	}
	msg := new(cose.UntaggedSign1Message)
	if err := msg.UnmarshalCBOR(b); err != nil {
		return nil, malformed("not an untagged COSE_Sign1: %v", err)
	}
	alg, err := msg.Headers.Protected.Algorithm()
	if err != nil || alg != cose.AlgorithmES384 {
		return nil, malformed("the protected header does not name ES384")
	}
	if len(msg.Payload) == 0 {
		return nil, malformed("no payload")
	}
	var fields map[string]cbor.RawMessage
	if err := decMode.Unmarshal(msg.Payload, &fields); err != nil {
		return nil, malformed("the payload is not one CBOR map of text keys: %v", err)
	}
	for _, k := range []string{"module_id", "digest", "timestamp", "nitrotpm_pcrs", "certificate", "cabundle"} {
		if raw, ok := fields[k]; !ok || len(raw) == 0 || isNull(raw) {
			if _, enclave := fields["pcrs"]; k == "nitrotpm_pcrs" && enclave {
				return nil, malformed("a Nitro Enclaves document (pcrs), not a NitroTPM one (nitrotpm_pcrs)")
			}
			return nil, malformed("%s is missing", k)
		}
	}
	d := &Document{msg: msg}
	var digest string
	if major(fields["module_id"]) != majorText || decMode.Unmarshal(fields["module_id"], &d.ModuleID) != nil || d.ModuleID == "" || len(d.ModuleID) > 256 {
		return nil, malformed("module_id is not a text string of 1 to 256 bytes")
	}
	if major(fields["digest"]) != majorText || decMode.Unmarshal(fields["digest"], &digest) != nil || digest != "SHA384" {
		return nil, malformed("digest is not SHA384")
	}
	var ms uint64
	if major(fields["timestamp"]) != majorUint || decMode.Unmarshal(fields["timestamp"], &ms) != nil || ms == 0 || ms > 1<<53 {
		return nil, malformed("timestamp is not a positive integer of milliseconds")
	}
	d.Timestamp = time.UnixMilli(int64(ms)).UTC()
	var pcrs map[uint64]cbor.RawMessage
	if major(fields["nitrotpm_pcrs"]) != majorMap || decMode.Unmarshal(fields["nitrotpm_pcrs"], &pcrs) != nil || len(pcrs) == 0 || len(pcrs) > maxPCRs {
		return nil, malformed("nitrotpm_pcrs is not a map of 1 to %d PCRs", maxPCRs)
	}
	d.PCRs = make(map[int][]byte, len(pcrs))
	for i, raw := range pcrs {
		if i >= maxPCRs {
			return nil, malformed("nitrotpm_pcrs has PCR %d", i)
		}
		v, err := bytesField(raw, fmt.Sprintf("PCR %d", i), pcrBytes, pcrBytes)
		if err != nil {
			return nil, err
		}
		d.PCRs[int(i)] = v
	}
	der, err := bytesField(fields["certificate"], "certificate", 1, maxCertSize)
	if err != nil {
		return nil, err
	}
	if d.Certificate, err = x509.ParseCertificate(der); err != nil {
		return nil, malformed("certificate is not X.509 DER")
	}
	var bundle []cbor.RawMessage
	if major(fields["cabundle"]) != majorArray || decMode.Unmarshal(fields["cabundle"], &bundle) != nil || len(bundle) == 0 || len(bundle) > maxBundle {
		return nil, malformed("cabundle is not an array of 1 to %d certificates", maxBundle)
	}
	for i, raw := range bundle {
		der, err := bytesField(raw, fmt.Sprintf("cabundle[%d]", i), 1, maxCertSize)
		if err != nil {
			return nil, err
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, malformed("cabundle[%d] is not X.509 DER", i)
		}
		d.CABundle = append(d.CABundle, c)
	}
	for _, f := range []struct {
		name   string
		lo, hi int
		dst    *[]byte
	}{{"public_key", 1, maxPublicKey, &d.PublicKey}, {"user_data", 0, maxUserData, &d.UserData}, {"nonce", 0, maxNonce, &d.Nonce}} {
		raw, ok := fields[f.name]
		if !ok || isNull(raw) {
			continue
		}
		if *f.dst, err = bytesField(raw, f.name, f.lo, f.hi); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Verify checks that the document is AWS's, at now:
//   - the COSE_Sign1 signature is ES384 by the certificate's key, an
//     ECDSA P-384 key (NitroDocumentSignatureInvalid);
//   - the certificate chains through the CA bundle to one of roots, every
//     certificate within its validity at now (NitroDocumentChainUntrusted;
//     outside a validity: NitroDocumentCertificateExpired). The bundle's
//     first entry, AWS's root, is not trusted for being there: only roots
//     are.
func (d *Document) Verify(roots *x509.CertPool, now time.Time) error {
	pub, ok := d.Certificate.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P384() {
		return attest.Deny(attest.ReasonNitroDocSignature, "the document's certificate has no ECDSA P-384 key")
	}
	verifier, err := cose.NewVerifier(cose.AlgorithmES384, pub)
	if err != nil {
		return attest.Deny(attest.ReasonNitroDocSignature, "no ES384 verifier: %v", err)
	}
	if err := d.msg.Verify(nil, verifier); err != nil {
		return attest.Deny(attest.ReasonNitroDocSignature, "the document's ES384 signature does not verify under its certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range d.CABundle {
		inter.AddCert(c)
	}
	_, err = d.Certificate.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		var invalid x509.CertificateInvalidError
		if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
			return attest.Deny(attest.ReasonNitroDocExpired, "a certificate of the document's chain is outside its validity at %s: %v", now.UTC().Format(time.RFC3339), err)
		}
		return attest.Deny(attest.ReasonNitroDocUntrusted, "the document's certificate does not chain to the AWS Nitro root: %v", err)
	}
	return nil
}

// PCRIndexes are the document's PCR indexes, ascending.
func (d *Document) PCRIndexes() []int {
	out := make([]int, 0, len(d.PCRs))
	for i := range d.PCRs {
		out = append(out, i)
	}
	sort.Ints(out)
	return out
}
