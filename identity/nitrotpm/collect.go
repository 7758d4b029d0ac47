package nitrotpm

import (
	"crypto"
	"crypto/x509"
	"fmt"
	"io"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/identity/aws"
)

// The node side. A Collector makes an attestation key (go-tpm-tools'
// ECC AK template, a primary key of the owner hierarchy: the same key at
// every boot, nothing persisted), asks the NSM for a document carrying
// the server's nonce and that key, and quotes the SHA-384 bank with it.
// It never decides anything.

// Collector produces NitroTPM evidence on the node.
type Collector struct {
	rw  io.ReadWriteCloser
	nsm NSM
	log func() ([]byte, error)
	ak  *client.Key
}

// NewCollector opens the TPM behind ch (nil: the system TPM, /dev/tpmrm0,
// with the system event log) and makes the AK. nsm is the NSM's channel;
// nil means TPMNSM on the same TPM, the real NitroTPM's.
func NewCollector(ch tpm.Channel, nsm NSM) (*Collector, error) {
	rw, log, err := tpm.OpenChannel(ch)
	if err != nil {
		return nil, err
	}
	c := &Collector{rw: rw, log: log, nsm: nsm}
	if c.nsm == nil {
		c.nsm = TPMNSM{RW: c.rw}
	}
	ak, err := client.NewKey(c.rw, tpm2.HandleOwner, client.AKTemplateECC())
	if err != nil {
		c.rw.Close()
		return nil, fmt.Errorf("create attestation key: %w", err)
	}
	c.ak = ak
	return c, nil
}

// Close flushes the AK and closes the TPM.
func (c *Collector) Close() error {
	c.ak.Close()
	return c.rw.Close()
}

// Request returns the first message (empty).
func (c *Collector) Request() *ChallengeRequest { return &ChallengeRequest{} }

// Answer asks the NSM for a document with nonce = the challenge's nonce
// and public_key = the AK as PKIX DER, then quotes PCRs 0-23 of the
// SHA-384 bank with the AK and qualifying data
// attest.BindingDigest(nonce, kubeletKeySHA256), and sends both with
// identity, the instance identity document (identity/aws's Collect).
func (c *Collector) Answer(ch *Challenge, kubeletKeySHA256 []byte, identity aws.Evidence) (*Evidence, error) {
	if err := ch.Check("nitrotpm"); err != nil {
		return nil, err
	}
	pkix, err := x509.MarshalPKIXPublicKey(c.ak.PublicKey())
	if err != nil {
		return nil, fmt.Errorf("encode AK: %w", err)
	}
	doc, err := Attest(c.nsm, ch.Nonce, pkix)
	if err != nil {
		return nil, err
	}
	pub, q, err := tpm.QuoteAK(c.ak, crypto.SHA384, ch.Nonce, kubeletKeySHA256, c.log)
	if err != nil {
		return nil, err
	}
	ev := &Evidence{Document: doc, AKPublic: pub, Identity: identity, Quote: *q}
	return ev, nil
}
