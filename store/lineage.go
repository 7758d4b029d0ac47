package store

import (
	"context"
	"crypto/subtle"
	"sort"
	"time"
)

// MaxLineageCertificates bounds a Lineage: the newest certificates are
// kept. A kubelet renews at 70–90 % of its certificate's life and then
// uses the new one, so at most two or three of its certificates are
// valid at once; 16 leaves room for renewals whose answer the kubelet
// lost, and keeps every lineage a few kilobytes.
const MaxLineageCertificates = 16

// Lineage is the kubelet client certificates issued to the enrolment that
// owns a node name now: the certificate issued for the CSR that carried
// the enrolment's bound kubelet key, then each one issued for a renewal
// that one of them authenticated. The approver approves a CSR that the
// node makes itself (requester system:node:NAME) only when the client
// certificate that authenticated it is in the lineage of the name's
// current owner (approver/decide.go). Only the approver writes lineages.
type Lineage struct {
	// NodeName is the node name.
	NodeName string `json:"nodeName"`
	// Identity, BoundAt and KubeletKeySHA256 name the enrolment the
	// certificates were issued to: the binding's identity, its CreatedAt
	// and the kubelet key it bound (Of). A binding released and made
	// again, or enrolled again with a new kubelet key, is another
	// enrolment, whose first certificate starts a new lineage.
	Identity         string    `json:"identity"`
	BoundAt          time.Time `json:"boundAt"`
	KubeletKeySHA256 []byte    `json:"kubeletKeySHA256"`
	// Certificates are newest first, at most MaxLineageCertificates.
	Certificates []IssuedCertificate `json:"certificates,omitempty"`
}

// IssuedCertificate is one kubelet client certificate of a lineage.
type IssuedCertificate struct {
	// SHA256 is the SHA-256 of the certificate's DER: what the API server
	// puts in a request's credential ID (X509SHA256=<hex>).
	SHA256 []byte `json:"sha256"`
	// CSR names the CSR it was issued for (name/UID).
	CSR string `json:"csr"`
	// NotAfter is when the certificate expires; RecordedAt when the
	// approver saw it issued.
	NotAfter   time.Time `json:"notAfter"`
	RecordedAt time.Time `json:"recordedAt"`
}

// Of reports whether l holds the certificates of b's enrolment.
func (l *Lineage) Of(b *Binding) bool {
	return l != nil && b != nil && l.NodeName == b.NodeName && l.Identity == b.Identity &&
		l.BoundAt.Equal(b.CreatedAt) && subtle.ConstantTimeCompare(l.KubeletKeySHA256, b.KubeletKeySHA256) == 1
}

// Has returns the certificate of l whose DER has SHA-256 sum, if any.
func (l *Lineage) Has(sum []byte) (*IssuedCertificate, bool) {
	if l == nil || len(sum) == 0 {
		return nil, false
	}
	for i := range l.Certificates {
		if subtle.ConstantTimeCompare(l.Certificates[i].SHA256, sum) == 1 {
			return &l.Certificates[i], true
		}
	}
	return nil, false
}

// Add puts c first in l, drops certificates that expired before now, and
// keeps the newest MaxLineageCertificates. A certificate already in l is
// not added twice; Add reports whether l changed.
func (l *Lineage) Add(c IssuedCertificate, now time.Time) bool {
	if _, ok := l.Has(c.SHA256); ok {
		return false
	}
	certs := []IssuedCertificate{c}
	for _, old := range l.Certificates {
		if now.Before(old.NotAfter) {
			certs = append(certs, old)
		}
	}
	sort.SliceStable(certs, func(i, j int) bool { return certs[i].RecordedAt.After(certs[j].RecordedAt) })
	if len(certs) > MaxLineageCertificates {
		certs = certs[:MaxLineageCertificates]
	}
	l.Certificates = certs
	return true
}

// Lineages keeps the kubelet certificate lineages of node names: in the
// cluster (store/kubestore, KubeletLineage objects, which only the
// approver's RBAC may write) or in the embedded store. Implementations are
// safe for concurrent use.
type Lineages interface {
	// Lineage returns a node name's lineage (ErrNotFound).
	Lineage(ctx context.Context, nodeName string) (*Lineage, error)
	// UpdateLineage changes nodeName's lineage with fn, which gets the
	// current one (nil when there is none) and returns the one to store,
	// or nil to store nothing; one write that cannot lose a concurrent
	// one: fn may get a lineage a moment stale (a cache), whose write then
	// fails, and fn runs again on a fresh read. It returns what is stored.
	UpdateLineage(ctx context.Context, nodeName string, fn func(*Lineage) (*Lineage, error)) (*Lineage, error)
}
