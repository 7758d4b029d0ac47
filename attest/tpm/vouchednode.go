package tpm

import (
	"crypto"
	"fmt"
	"io"

	"github.com/google/go-tpm-tools/client"
	legacy "github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/attest"
)

// The wire shapes and the node side that the kinds of a vouched-for AK
// (identity/gcevtpm, identity/nitrotpm, identity/azuretpm) share: the AK
// travels with the quote, so the first message is empty and the challenge
// is a nonce; the
// collector drives the TPM through go-tpm (go-tpm-tools' keys) and answers
// with the AK's public area and a quote over the binding (QuoteAll).

// SystemTPM is the kernel's resource-managed TPM device.
const SystemTPM = "/dev/tpmrm0"

// EmptyRequest is the node's first message of a vouched-for AK's kind: it
// is empty, as the AK and what vouches for it travel with the quote, and
// the nonce must exist before the quote.
type EmptyRequest struct{}

// NonceChallenge is the server's answer to it: the nonce the quote binds
// (and what vouches for the AK may carry, as NitroTPM's document does).
type NonceChallenge struct {
	Nonce []byte `json:"nonce"`
}

// Check is a collector's check of the challenge before it quotes: there
// is one, with an attest.NonceSize nonce. The error names pkg, the kind's
// package.
func (c *NonceChallenge) Check(pkg string) error {
	if c == nil || len(c.Nonce) != attest.NonceSize {
		return fmt.Errorf("%s: the challenge's nonce is not %d bytes", pkg, attest.NonceSize)
	}
	return nil
}

// OpenChannel opens the TPM a collector of a vouched-for AK drives: ch,
// with its measurement log, or when ch is nil the system TPM (SystemTPM)
// with the system event log (ReadSystemEventLog).
func OpenChannel(ch Channel) (io.ReadWriteCloser, func() ([]byte, error), error) {
	if ch != nil {
		return ch, ch.MeasurementLog, nil
	}
	rw, err := legacy.OpenTPM(SystemTPM)
	if err != nil {
		return nil, nil, fmt.Errorf("open TPM: %w", err)
	}
	return rw, ReadSystemEventLog, nil
}

// QuoteAK is what a vouched-for AK's collector answers: the AK's public
// area (TPMT_PUBLIC, as Evidence.AKPublic carries it) and QuoteAll of
// bank with nonce and kubeletKeySHA256.
func QuoteAK(ak *client.Key, bank crypto.Hash, nonce, kubeletKeySHA256 []byte, log func() ([]byte, error)) ([]byte, *QuoteEvidence, error) {
	pub, err := ak.PublicArea().Encode()
	if err != nil {
		return nil, nil, fmt.Errorf("encode AK: %w", err)
	}
	q, err := QuoteAll(ak, bank, nonce, kubeletKeySHA256, log)
	if err != nil {
		return nil, nil, err
	}
	return pub, q, nil
}
