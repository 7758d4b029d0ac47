package certs

import (
	"crypto/tls"
	"fmt"
	"sync/atomic"
)

// Served is where the TLS server gets the certificate it presents: a
// [Reloader] (files) or a [Holder] (kept in memory, e.g. read from the
// cluster's objects).
type Served interface {
	// GetCertificate is for tls.Config.GetCertificate; it never fails
	// once a certificate was loaded.
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Certificate is the certificate served now.
	Certificate() *tls.Certificate
}

var (
	_ Served = (*Reloader)(nil)
	_ Served = (*Holder)(nil)
)

// Holder serves a certificate chain and key set in memory. Set replaces
// them only with a pair that loads; a pair that does not leaves the last
// good one in service. Safe for concurrent use.
type Holder struct {
	cert atomic.Pointer[tls.Certificate]
}

// Set parses chainPEM (leaf first) and keyPEM and, if they load and
// match, serves them from the next handshake on. where names their place
// for the error.
func (h *Holder) Set(chainPEM, keyPEM []byte, where string) error {
	c, err := tls.X509KeyPair(chainPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("certs: %s: %w", where, err)
	}
	h.cert.Store(&c)
	return nil
}

// GetCertificate is for tls.Config.GetCertificate.
func (h *Holder) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := h.cert.Load(); c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("certs: no serving certificate yet")
}

// Certificate returns the certificate served now (nil before the first Set).
func (h *Holder) Certificate() *tls.Certificate { return h.cert.Load() }
