// Package nitrotpmtest stands in for an EC2 instance's NitroTPM in tests
// of identity/nitrotpm and of anything built on it: a copy of the AWS
// Nitro Attestation PKI's shape (a root "aws.nitro-enclaves", a regional,
// a zonal and a per-instance CA, and a leaf "<module_id>.<region>.aws",
// all ECDSA P-384 as AWS's), and an NSM that answers the NSM Attestation
// request (the CBOR bytes nitrotpm.TPMNSM carries through the vendor
// command) with a COSE_Sign1 document of the real layout, whose
// nitrotpm_pcrs are the SHA-384 PCRs of a real TPM (swtpm) at the moment
// of the request.
package nitrotpmtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"sync"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/veraison/go-cose"

	"github.com/nodeproof/nodeproof/identity/nitrotpm"
)

// PKI is a stand-in for the AWS Nitro Attestation PKI for one instance.
type PKI struct {
	Root *x509.Certificate
	// Bundle is the CA bundle as AWS sends it: the root first, then the
	// regional, zonal and instance CAs.
	Bundle  []*x509.Certificate
	leafKey *ecdsa.PrivateKey
	leaf    *x509.Certificate
	// ModuleID and Region name the instance.
	ModuleID, Region string
	// issuer and issuerKey sign the leaf (the bundle's last CA).
	issuer    *x509.Certificate
	issuerKey *ecdsa.PrivateKey
}

func awsName(cn string) pkix.Name {
	return pkix.Name{Country: []string{"US"}, Organization: []string{"Amazon"}, OrganizationalUnit: []string{"AWS"}, CommonName: cn}
}

// NewPKI makes the chain for instanceID in region, valid around now (the
// leaf for three hours, as AWS's).
func NewPKI(instanceID, region string, now time.Time) (*PKI, error) {
	p := &PKI{ModuleID: instanceID + "-tpm0000000000000000", Region: region}
	names := []string{
		"aws.nitro-enclaves",
		"0123456789abcdef." + region + ".aws.nitro-enclaves",
		"fedcba9876543210.zonal." + region + ".aws.nitro-enclaves",
		instanceID + "." + region + ".aws.nitro-enclaves",
	}
	var parent *x509.Certificate
	var parentKey *ecdsa.PrivateKey
	for i, cn := range names {
		key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		if err != nil {
			return nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 1)), Subject: awsName(cn),
			NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(0, 0, 30-7*i),
			KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
		}
		if parent == nil {
			tmpl.NotAfter = now.AddDate(30, 0, 0)
			parent, parentKey = tmpl, key
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
		if err != nil {
			return nil, err
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		p.Bundle = append(p.Bundle, c)
		parent, parentKey = c, key
	}
	p.Root = p.Bundle[0]
	p.issuer, p.issuerKey = parent, parentKey
	if err := p.issueLeaf(now); err != nil {
		return nil, err
	}
	return p, nil
}

// issueLeaf issues the document-signing certificate for p's module.
func (p *PKI) issueLeaf(now time.Time) error {
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		return err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(99), Subject: awsName(p.ModuleID + "." + p.Region + ".aws"),
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(3 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, p.issuer, key.Public(), p.issuerKey)
	if err != nil {
		return err
	}
	if p.leaf, err = x509.ParseCertificate(der); err != nil {
		return err
	}
	p.leafKey = key
	return nil
}

// ForInstance is the PKI of another instance in the same Region under the
// same root and CA bundle (as AWS's are): its own module and signing
// certificate.
func (p *PKI) ForInstance(instanceID string, now time.Time) (*PKI, error) {
	q := &PKI{Root: p.Root, Bundle: p.Bundle, ModuleID: instanceID + "-tpm0000000000000000", Region: p.Region, issuer: p.issuer, issuerKey: p.issuerKey}
	if err := q.issueLeaf(now); err != nil {
		return nil, err
	}
	return q, nil
}

// Payload is a document's payload before it is signed, for tests to
// change.
type Payload struct {
	ModuleID     string         `cbor:"module_id"`
	Digest       string         `cbor:"digest"`
	Timestamp    uint64         `cbor:"timestamp"`
	NitroTPMPCRs map[int][]byte `cbor:"nitrotpm_pcrs"`
	Certificate  []byte         `cbor:"certificate"`
	CABundle     [][]byte       `cbor:"cabundle"`
	PublicKey    []byte         `cbor:"public_key"`
	UserData     []byte         `cbor:"user_data"`
	Nonce        []byte         `cbor:"nonce"`
}

// Payload is what the hypervisor would sign now for a request.
func (p *PKI) Payload(now time.Time, pcrs map[int][]byte, userData, nonce, publicKey []byte) *Payload {
	pl := &Payload{
		ModuleID: p.ModuleID, Digest: "SHA384", Timestamp: uint64(now.UnixMilli()), NitroTPMPCRs: pcrs,
		Certificate: p.leaf.Raw, PublicKey: publicKey, UserData: userData, Nonce: nonce,
	}
	for _, c := range p.Bundle {
		pl.CABundle = append(pl.CABundle, c.Raw)
	}
	return pl
}

// Sign makes the COSE_Sign1 document of pl: untagged, protected header
// {1: -35} (ES384), empty unprotected header, signed by the leaf's key.
func (p *PKI) Sign(pl *Payload) ([]byte, error) {
	return p.SignWith(pl, p.leafKey)
}

// SignWith signs pl with another key, for attacks.
func (p *PKI) SignWith(pl *Payload, key *ecdsa.PrivateKey) ([]byte, error) {
	payload, err := cbor.Marshal(pl)
	if err != nil {
		return nil, err
	}
	return p.SignBytes(payload, key)
}

// SignBytes signs any payload bytes with key (nil: the leaf's), for
// attacks on the payload's shape.
func (p *PKI) SignBytes(payload []byte, key *ecdsa.PrivateKey) ([]byte, error) {
	if key == nil {
		key = p.leafKey
	}
	signer, err := cose.NewSigner(cose.AlgorithmES384, key)
	if err != nil {
		return nil, err
	}
	msg := cose.UntaggedSign1Message{Headers: cose.Headers{Protected: cose.ProtectedHeader{cose.HeaderLabelAlgorithm: cose.AlgorithmES384}}, Payload: payload}
	if err := msg.Sign(rand.Reader, nil, signer); err != nil {
		return nil, err
	}
	return msg.MarshalCBOR()
}

// NSM is the fake NitroTPM's Nitro Secure Module: it answers NSM
// Attestation requests with documents whose PCRs are TPM's SHA-384 bank.
// Swap, when set, changes each payload before it is signed (attacks).
type NSM struct {
	PKI   *PKI
	TPM   io.ReadWriter
	Clock func() time.Time
	Swap  func(*Payload)

	mu       sync.Mutex
	requests int
}

// Request answers one NSM request, as the hypervisor answers the vendor
// command: an Attestation request gets a document (InvalidArgument for
// anything else, InputTooLarge for a field over 1 KiB).
func (n *NSM) Request(req []byte) ([]byte, error) {
	n.mu.Lock()
	n.requests++
	n.mu.Unlock()
	userData, nonce, pub, err := nitrotpm.UnmarshalRequest(req)
	if err != nil {
		return nitrotpm.MarshalError("InvalidArgument")
	}
	pcrs, err := ReadSHA384(n.TPM)
	if err != nil {
		return nil, err
	}
	pl := n.PKI.Payload(n.Clock(), pcrs, userData, nonce, pub)
	if n.Swap != nil {
		n.Swap(pl)
	}
	doc, err := n.PKI.Sign(pl)
	if err != nil {
		return nil, err
	}
	return nitrotpm.MarshalResponse(doc)
}

// Requests counts the requests answered.
func (n *NSM) Requests() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.requests
}

// ReadSHA384 reads PCRs 0-23 of the TPM's SHA-384 bank.
func ReadSHA384(rw io.ReadWriter) (map[int][]byte, error) {
	sel := tpm2.PCRSelection{Hash: tpm2.AlgSHA384}
	for i := 0; i < 24; i++ {
		sel.PCRs = append(sel.PCRs, i)
	}
	got, err := client.ReadPCRs(rw, sel)
	if err != nil {
		return nil, fmt.Errorf("read the SHA-384 PCRs: %w", err)
	}
	out := make(map[int][]byte, 24)
	for i, d := range got.GetPcrs() {
		out[int(i)] = d
	}
	return out, nil
}
