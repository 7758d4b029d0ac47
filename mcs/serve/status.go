package serve

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"sync/atomic"
	"time"

	"github.com/nodeproof/nodeproof/mcs/certs"
)

// Status is what a running server says of itself on its admin socket, for
// `nodeproof status` (no Prometheus needed): the policy it judges by and
// the last reload it refused, the certificate it serves and the CAs
// machines are given, where it listens.
type Status struct {
	StartedAt time.Time    `json:"startedAt"`
	PID       int          `json:"pid"`
	Mode      string       `json:"mode"` // directory or cluster
	Secure    string       `json:"secure"`
	Insecure  string       `json:"insecure,omitempty"`
	Hosts     []string     `json:"hosts"` // --hosts
	Policy    PolicyStatus `json:"policy"`
	Serving   *CertStatus  `json:"serving,omitempty"`
	CAs       []CertStatus `json:"cas,omitempty"`
	// CAError says why the CA bundle could not be read.
	CAError string `json:"caError,omitempty"`
}

// CertStatus is one certificate: whom it names and until when.
type CertStatus struct {
	Subject  string    `json:"subject"`
	Names    []string  `json:"names,omitempty"`
	NotAfter time.Time `json:"notAfter"`
}

func certStatus(c *x509.Certificate) CertStatus {
	return CertStatus{Subject: c.Subject.String(), Names: certs.Names(c), NotAfter: c.NotAfter}
}

// statusBox is where Run puts the function that makes the status once the
// server runs; the admin socket, made earlier, reads through it.
type statusBox = atomic.Pointer[func() Status]

// status is the running server's Status now.
func (c Config) status(started time.Time, mode string, p *ports, served certs.Served, reloader *policyReloader) Status {
	s := Status{StartedAt: started, PID: os.Getpid(), Mode: mode, Secure: p.secure.String(), Hosts: c.Hosts, Policy: reloader.Status()}
	if p.insecure != nil {
		s.Insecure = p.insecure.String()
	}
	if s.Policy.Version == "" {
		s.Policy = PolicyStatus{Version: "default (the public tier only: --policy-none)", Since: started}
	}
	if cert := served.Certificate(); cert != nil && cert.Leaf != nil {
		cs := certStatus(cert.Leaf)
		s.Serving = &cs
	} else if cert != nil && len(cert.Certificate) > 0 {
		if leaf, err := x509.ParseCertificate(cert.Certificate[0]); err == nil {
			cs := certStatus(leaf)
			s.Serving = &cs
		}
	}
	bundle, err := c.caBundle()
	if err != nil {
		s.CAError = err.Error()
		return s
	}
	for rest := bundle; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if ca, err := x509.ParseCertificate(blk.Bytes); err == nil {
			s.CAs = append(s.CAs, certStatus(ca))
		}
	}
	return s
}
