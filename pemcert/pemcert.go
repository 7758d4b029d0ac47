// Package pemcert parses PEM certificate bundles strictly, one rule for
// every bundle nodeproof reads (CA bundles, AWS region certificates,
// serving certificates): CERTIFICATE blocks only, each a valid X.509
// certificate, at least one, and nothing but whitespace after the last —
// a truncated bundle is an error, not a shorter bundle, and so is a block
// pem.Decode would skip (an indented one), not a missing certificate.
package pemcert

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// Parse returns the certificates of a PEM bundle, in order.
func Parse(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	notPEM := errors.New("data that is not a PEM certificate (truncated, or indented?)")
	for rest := b; len(bytes.TrimSpace(rest)) > 0; {
		// pem.Decode skips whatever precedes a block, even a block it
		// does not recognise (an indented one): only whitespace may come
		// before a block here, and the block must start a line.
		i := bytes.Index(rest, []byte("-----BEGIN"))
		if i < 0 || len(bytes.TrimSpace(rest[:i])) != 0 || (i > 0 && rest[i-1] != '\n') {
			return nil, notPEM
		}
		block, next := pem.Decode(rest)
		if block == nil {
			return nil, notPEM
		}
		rest = next
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("a PEM %q block where only certificates belong", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}
