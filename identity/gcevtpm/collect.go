package gcevtpm

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/nodeproof/nodeproof/attest/tpm"
)

// The node side. A Collector loads the AK GCE provisioned (go-tpm-tools'
// GceAttestationKeyECC, else GceAttestationKeyRSA: the key made under the
// endorsement hierarchy from Google's template in NV, with Google's
// certificate from NV) and quotes with it. It never decides anything.

// ErrNotGCE: the TPM has no GCE AK template in NV: not a GCE vTPM.
var ErrNotGCE = errors.New("gcevtpm: no GCE AK template in NV (0x01c10001, 0x01c10003): not a GCE vTPM")

// ErrNoCertificate: the TPM has a GCE AK template but no certificate for
// it. go-tpm-tools loads such an AK without complaint; nodeproof refuses
// to go on, as `gotpm token` does: without Google's certificate the AK
// proves nothing.
var ErrNoCertificate = errors.New("gcevtpm: the GCE AK has no certificate in NV (0x01c10000, 0x01c10002): enable the vTPM of a Shielded VM, or use another evidence kind")

// Detect reports whether the TPM behind rw is a GCE vTPM: whether one of
// Google's AK templates is in NV. It reads only NV public areas.
func Detect(rw io.ReadWriter) bool {
	for _, idx := range []uint32{client.GceAKTemplateNVIndexECC, client.GceAKTemplateNVIndexRSA} {
		if _, err := tpm2.NVReadPublic(rw, tpmutil.Handle(idx)); err == nil {
			return true
		}
	}
	return false
}

// Collector produces GCE vTPM evidence on the node.
type Collector struct {
	rw            io.ReadWriteCloser
	log           func() ([]byte, error)
	ak            *client.Key
	intermediates [][]byte
}

// CollectorOptions say how a Collector works.
type CollectorOptions struct {
	// AIA, when set, fetches the AK certificate's issuers at start (as
	// go-tpm-tools' Attest with a CertChainFetcher does) and sends them
	// with the evidence, for a server that ships none and fetches none.
	AIA *AIA
}

// NewCollector opens the TPM behind ch (nil: the system TPM, /dev/tpmrm0,
// with the system event log) and loads the GCE AK, ECC first, RSA if the
// ECC one has no certificate. ErrNotGCE when there is no GCE template;
// ErrNoCertificate when no AK has a certificate.
func NewCollector(ctx context.Context, ch tpm.Channel, o CollectorOptions) (*Collector, error) {
	rw, log, err := tpm.OpenChannel(ch)
	if err != nil {
		return nil, err
	}
	c := &Collector{rw: rw, log: log}
	if !Detect(c.rw) {
		c.rw.Close()
		return nil, ErrNotGCE
	}
	for _, load := range []func(io.ReadWriter) (*client.Key, error){client.GceAttestationKeyECC, client.GceAttestationKeyRSA} {
		k, err := load(c.rw)
		if err != nil {
			continue // that template is absent or unusable; try the other
		}
		if k.Cert() == nil {
			k.Close()
			continue
		}
		c.ak = k
		break
	}
	if c.ak == nil {
		c.rw.Close()
		return nil, ErrNoCertificate
	}
	if o.AIA != nil {
		if err := o.AIA.check(); err != nil {
			c.Close()
			return nil, err
		}
		issuers, err := o.AIA.Issuers(ctx, c.ak.Cert(), nil)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("fetch the AK certificate's issuers: %w", err)
		}
		for i, cert := range issuers {
			if i == MaxIntermediates {
				break
			}
			c.intermediates = append(c.intermediates, cert.Raw)
		}
	}
	return c, nil
}

// Close flushes the AK and closes the TPM.
func (c *Collector) Close() error {
	if c.ak != nil {
		c.ak.Close()
	}
	return c.rw.Close()
}

// Request returns the first message (empty: see ChallengeRequest).
func (c *Collector) Request() *ChallengeRequest { return &ChallengeRequest{} }

// Answer quotes PCRs 0-23 of the SHA-256 bank with the AK and qualifying
// data attest.BindingDigest(challenge nonce, kubeletKeySHA256), and sends
// the AK, its certificate, the quote, the PCRs and the event log.
func (c *Collector) Answer(ch *Challenge, kubeletKeySHA256 []byte) (*Evidence, error) {
	if err := ch.Check("gcevtpm"); err != nil {
		return nil, err
	}
	pub, q, err := tpm.QuoteAK(c.ak, crypto.SHA256, ch.Nonce, kubeletKeySHA256, c.log)
	if err != nil {
		return nil, err
	}
	ev := &Evidence{AKPublic: pub, AKCertificate: c.ak.CertDERBytes(), Intermediates: c.intermediates, Quote: *q}
	return ev, nil
}
