package azuretpm

import (
	"context"
	"crypto"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/nodeproof/nodeproof/attest/tpm"
)

// The node side. A Collector loads the AK Azure provisioned (persistent
// handle 0x81000003), reads its certificate (NV 0x01C101D0), quotes with
// the AK and fetches the attested document from IMDS. It never decides
// anything.

// Where Azure's vTPM keeps the AK and its certificate.
const (
	AKHandle      = 0x81000003
	AKCertNVIndex = 0x01C101D0
)

// ErrNotAzure: the TPM has no AK certificate at NV 0x01C101D0: not an
// Azure Trusted Launch vTPM.
var ErrNotAzure = errors.New("azuretpm: no AK certificate in NV 0x01C101D0: not an Azure Trusted Launch vTPM")

// ErrNoAK: the AK certificate is there but no key at 0x81000003.
var ErrNoAK = errors.New("azuretpm: no AK at persistent handle 0x81000003")

// Detect reports whether the TPM behind rw is an Azure vTPM: whether NV
// 0x01C101D0 is defined. It reads only the NV public area.
func Detect(rw io.ReadWriter) bool {
	_, err := tpm2.NVReadPublic(rw, tpmutil.Handle(AKCertNVIndex))
	return err == nil
}

// Collector produces Azure vTPM evidence on the node.
type Collector struct {
	rw   io.ReadWriteCloser
	log  func() ([]byte, error)
	ak   *client.Key
	cert []byte
	imds *IMDS
}

// CollectorOptions say how a Collector works.
type CollectorOptions struct {
	// IMDS is the metadata service; nil means Azure's at its address.
	IMDS *IMDS
}

// NewCollector opens the TPM behind ch (nil: the system TPM, /dev/tpmrm0,
// with the system event log), reads the AK certificate (ErrNotAzure when
// there is none; at most MaxCertificateSize) and loads the AK (ErrNoAK).
func NewCollector(ctx context.Context, ch tpm.Channel, o CollectorOptions) (*Collector, error) {
	c := &Collector{imds: o.IMDS}
	if c.imds == nil {
		c.imds = &IMDS{}
	}
	rw, log, err := tpm.OpenChannel(ch)
	if err != nil {
		return nil, err
	}
	c.rw, c.log = rw, log
	cert, err := readCert(c.rw)
	if err != nil {
		c.rw.Close()
		return nil, err
	}
	c.cert = cert
	ak, err := client.LoadCachedKey(c.rw, tpmutil.Handle(AKHandle), nil)
	if err != nil {
		c.rw.Close()
		return nil, fmt.Errorf("%w: %v", ErrNoAK, err)
	}
	c.ak = ak
	return c, nil
}

// readCert reads the AK certificate from NV, bounded by MaxCertificateSize,
// and cuts it to its DER length (an NV index may be larger than its
// certificate).
func readCert(rw io.ReadWriter) ([]byte, error) {
	pub, err := tpm2.NVReadPublic(rw, tpmutil.Handle(AKCertNVIndex))
	if err != nil {
		return nil, ErrNotAzure
	}
	if pub.DataSize == 0 || int(pub.DataSize) > MaxCertificateSize {
		return nil, fmt.Errorf("azuretpm: NV 0x01C101D0 holds %d bytes (at most %d)", pub.DataSize, MaxCertificateSize)
	}
	data, err := tpm2.NVReadEx(rw, tpmutil.Handle(AKCertNVIndex), tpm2.HandleOwner, "", 0)
	if err != nil {
		return nil, fmt.Errorf("azuretpm: read the AK certificate: %w", err)
	}
	var raw asn1.RawValue
	if _, err := asn1.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("azuretpm: NV 0x01C101D0 holds no DER certificate: %w", err)
	}
	return raw.FullBytes, nil
}

// Close flushes nothing (the AK is persistent) and closes the TPM.
func (c *Collector) Close() error {
	return c.rw.Close()
}

// Request returns the first message (empty: see ChallengeRequest).
func (c *Collector) Request() *ChallengeRequest { return &ChallengeRequest{} }

// Answer quotes PCRs 0-23 of the SHA-256 bank with the AK and qualifying
// data attest.BindingDigest(challenge nonce, kubeletKeySHA256), fetches
// the attested document with IMDSNonce of the same two, and sends the AK,
// its certificate, the document, the quote, the PCRs and the event log.
func (c *Collector) Answer(ch *Challenge, kubeletKeySHA256 []byte) (*Evidence, error) {
	if err := ch.Check("azuretpm"); err != nil {
		return nil, err
	}
	pub, q, err := tpm.QuoteAK(c.ak, crypto.SHA256, ch.Nonce, kubeletKeySHA256, c.log)
	if err != nil {
		return nil, err
	}
	doc, err := c.imds.AttestedDocument(context.Background(), IMDSNonce(ch.Nonce, kubeletKeySHA256))
	if err != nil {
		return nil, err
	}
	return &Evidence{AKPublic: pub, AKCertificate: c.cert, Document: doc, Quote: *q}, nil
}
