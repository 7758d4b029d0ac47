package approver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	certv1 "k8s.io/api/certificates/v1"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
)

// CredentialIDKey is the key of the user's extra info in which the API
// server records the credential that authenticated a request
// (k8s.io/apiserver user.CredentialIDKey, KEP-4193), copied into a CSR's
// spec.extra when the CSR is created. For an X.509 client certificate the
// value is X509SHA256=<hex SHA-256 of the certificate's DER>
// (k8s.io/apiserver/pkg/authentication/request/x509).
const (
	CredentialIDKey      = "authentication.kubernetes.io/credential-id"
	x509CredentialPrefix = "X509SHA256="
	// maxIssuedSize bounds status.certificate before it is parsed.
	maxIssuedSize = 64 << 10
)

// RequesterCertificate returns the SHA-256 of the X.509 client certificate
// that authenticated csr's requester, from its credential ID: exactly one
// value X509SHA256=<64 lower-case hex digits>. Otherwise it returns nil and
// why (no credential ID: a token, a proxy that drops it, an API server
// that records none; another kind of credential; more than one value).
func RequesterCertificate(csr *certv1.CertificateSigningRequest) ([]byte, string) {
	vals := csr.Spec.Extra[CredentialIDKey]
	switch {
	case len(vals) == 0:
		return nil, "no " + CredentialIDKey
	case len(vals) > 1:
		return nil, fmt.Sprintf("%d values of %s", len(vals), CredentialIDKey)
	}
	h, ok := strings.CutPrefix(vals[0], x509CredentialPrefix)
	if !ok {
		kind, _, _ := strings.Cut(vals[0], "=")
		return nil, fmt.Sprintf("a credential of kind %.32q, not an X.509 certificate", kind)
	}
	sum, err := hex.DecodeString(h)
	if err != nil || len(sum) != sha256.Size || h != strings.ToLower(h) {
		return nil, "a malformed " + x509CredentialPrefix + " credential ID"
	}
	return sum, ""
}

// issuedCertificate returns the certificate issued for csr (the first of
// status.certificate), or nil when there is none or it does not parse.
func issuedCertificate(csr *certv1.CertificateSigningRequest) *x509.Certificate {
	if len(csr.Status.Certificate) == 0 || len(csr.Status.Certificate) > maxIssuedSize {
		return nil
	}
	block, _ := pem.Decode(csr.Status.Certificate)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil
	}
	return c
}

// IssuedSHA256 is the SHA-256 of the DER of the certificate issued for csr
// (what the API server's credential ID names), nil if it has none.
func IssuedSHA256(csr *certv1.CertificateSigningRequest) []byte {
	c := issuedCertificate(csr)
	if c == nil {
		return nil
	}
	sum := sha256.Sum256(c.Raw)
	return sum[:]
}

// RecordIssued adds the kubelet client certificate issued for csr to the
// lineage of the enrolment that owns the node name now (store.Lineage),
// when csr was made by that enrolment's kubelet, and reports whether it
// did (false and no error: not one of the owner's, or not a kubelet client
// certificate). Checks, all of which must pass:
//   - csr is a kubelet client CSR of the shape a kubelet sends
//     (recognize), with a certificate issued (status.certificate: one PEM
//     CERTIFICATE, at most 64 KiB, that parses) whose public key is the
//     CSR's and whose common name is the CSR's;
//   - the CSR's node name is bound (store.Binding), and either the CSR
//     carries the kubelet key the binding's enrolment bound (the first
//     certificate: whoever asked for it, only that enrolment's machine
//     holds the key), or the node made it itself (requester
//     system:node:NAME) with a client certificate of that enrolment's
//     lineage (a renewal; RequesterCertificate).
//
// The first certificate of an enrolment starts its lineage, replacing a
// lineage of another enrolment (a previous owner of the name, or this
// identity before it enrolled again with a new key) once the binding, read
// again from Fresh when set, confirms the enrolment. Who approved the CSR
// does not matter: its certificate's key is held by the owner's kubelet
// either way.
func (d *Decider) RecordIssued(ctx context.Context, csr *certv1.CertificateSigningRequest) (bool, error) {
	ok, unowned, err := d.recordIssued(ctx, csr, d.Store)
	if err != nil || ok || !unowned || d.Fresh == nil {
		return ok, err
	}
	// The binding or the lineage may be a cache a moment behind (a
	// lineage created a moment ago): read both again from Fresh.
	ok, _, err = d.recordIssued(ctx, csr, d.Fresh)
	return ok, err
}

// recordIssued is RecordIssued on st; unowned reports that it wrote
// nothing because neither the lineage nor the CSR's key was the
// binding's enrolment's, which a stale read can cause.
func (d *Decider) recordIssued(ctx context.Context, csr *certv1.CertificateSigningRequest, st Store) (recorded, unowned bool, err error) {
	if csr.Spec.SignerName != SignerKubeletClient {
		return false, false, nil
	}
	k, _, _ := recognize(csr)
	cert := issuedCertificate(csr)
	if k == nil || cert == nil {
		return false, false, nil
	}
	spki := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	if !attest.Equal(spki[:], k.keySHA256) || cert.Subject.CommonName != NodeUserPrefix+k.nodeName {
		return false, false, nil
	}
	lins, err := d.lineages(st)
	if err != nil {
		return false, false, err
	}
	b, err := st.Binding(ctx, k.nodeName)
	if errors.Is(err, store.ErrNotFound) {
		return false, true, nil
	} else if err != nil {
		return false, false, fmt.Errorf("approver: binding of %s: %w", k.nodeName, err)
	}
	first := attest.Equal(k.keySHA256, b.KubeletKeySHA256)
	var cred []byte
	if k.requester == NodeUserPrefix+k.nodeName {
		cred, _ = RequesterCertificate(csr)
	}
	sum := sha256.Sum256(cert.Raw)
	now := d.Clock()
	entry := store.IssuedCertificate{SHA256: sum[:], CSR: csrRef(csr), NotAfter: cert.NotAfter, RecordedAt: now}
	_, err = lins.UpdateLineage(ctx, k.nodeName, func(cur *store.Lineage) (*store.Lineage, error) {
		recorded, unowned = false, false
		if _, has := cur.Has(cred); cur.Of(b) && (first || has) {
			next := *cur
			next.Certificates = append([]store.IssuedCertificate(nil), cur.Certificates...)
			if recorded = next.Add(entry, now); !recorded {
				return nil, nil
			}
			return &next, nil
		}
		if !first {
			unowned = true
			return nil, nil
		}
		if cur != nil && st != d.Fresh {
			// Replacing another enrolment's lineage: only on the binding
			// as the API server holds it now, not a cache a moment behind.
			if ok, err := d.confirm(ctx, b); err != nil || !ok {
				return nil, err
			}
		}
		next := &store.Lineage{NodeName: k.nodeName, Identity: b.Identity, BoundAt: b.CreatedAt,
			KubeletKeySHA256: bytes.Clone(b.KubeletKeySHA256)}
		recorded = next.Add(entry, now)
		return next, nil
	})
	if err != nil {
		return false, false, fmt.Errorf("approver: lineage of %s: %w", k.nodeName, err)
	}
	return recorded, unowned, nil
}

// confirm reports whether b is still the binding of its name on Fresh
// (true without Fresh).
func (d *Decider) confirm(ctx context.Context, b *store.Binding) (bool, error) {
	if d.Fresh == nil {
		return true, nil
	}
	now, err := d.Fresh.Binding(ctx, b.NodeName)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("approver: binding of %s: %w", b.NodeName, err)
	}
	return now.Identity == b.Identity && now.CreatedAt.Equal(b.CreatedAt) && attest.Equal(now.KubeletKeySHA256, b.KubeletKeySHA256), nil
}
