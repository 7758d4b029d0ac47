package approver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"

	certv1 "k8s.io/api/certificates/v1"

	"github.com/nodeproof/nodeproof/attest"
)

// The signers nodeproof approves for, and the identities of kubelet
// certificates (Kubernetes API values).
const (
	SignerKubeletClient  = certv1.KubeAPIServerClientKubeletSignerName // kubernetes.io/kube-apiserver-client-kubelet
	SignerKubeletServing = certv1.KubeletServingSignerName             // kubernetes.io/kubelet-serving
	NodesGroup           = "system:nodes"
	NodeUserPrefix       = "system:node:"
	BootstrapUserPrefix  = "system:bootstrap:"
	// maxCSRSize bounds spec.request before it is parsed (the API server
	// itself takes up to its request size limit).
	maxCSRSize = 16 << 10
)

// kubeletCSR is a CSR a recognizer accepted: a kubelet asking for its
// client or serving certificate, with the facts the decision needs.
type kubeletCSR struct {
	signer   string
	nodeName string
	// keySHA256 is the SHA-256 of the CSR's public key (PKIX DER), the hash
	// evidence binds.
	keySHA256 []byte
	requester string
	// dnsNames and ips are the serving CSR's SANs.
	dnsNames []string
	ips      []string
}

// recognize parses csr and checks its shape for its signer. It returns nil
// and attest.ReasonNotKubelet for a signer nodeproof does not approve for, or a
// shape reason (attest.ReasonBadCSR and kin) for a kubelet signer's CSR that is
// not what a kubelet sends. Checks, for both kubelet signers:
//   - spec.request is one PEM CERTIFICATE REQUEST (at most 16 KiB) that
//     parses and whose self-signature verifies (BadCSR);
//   - subject O is exactly [system:nodes] and CN is system:node:<name>
//     with <name> a DNS-1123 subdomain; no other subject fields matter
//     (BadSubject);
//   - the key is ECDSA P-256 or P-384, or RSA of 2048 to 8192 bits
//     (KeyNotAllowed).
//
// Client (kubernetes.io/kube-apiserver-client-kubelet): no SAN of any kind
// (SANsNotAllowed); usages exactly {digital signature, client auth}, plus
// key encipherment only for an RSA key (UsagesNotAllowed).
//
// Serving (kubernetes.io/kubelet-serving): the requester (spec.username)
// is the CN, i.e. the node's own client certificate asked (RequesterMismatch);
// at least one DNS or IP SAN and no e-mail or URI SAN (SANsNotAllowed);
// usages exactly {digital signature, server auth}, plus key encipherment
// only for RSA (UsagesNotAllowed).
//
// Both: the CSR requests no extension a kubelet does not send
// (extensionsAllowed: ExtensionNotAllowed, denied whatever
// DenyUnattested says).
func recognize(csr *certv1.CertificateSigningRequest) (*kubeletCSR, attest.Reason, string) {
	signer := csr.Spec.SignerName
	if signer != SignerKubeletClient && signer != SignerKubeletServing {
		return nil, attest.ReasonNotKubelet, "signer " + signer
	}
	if len(csr.Spec.Request) > maxCSRSize {
		return nil, attest.ReasonBadCSR, fmt.Sprintf("request exceeds %d bytes", maxCSRSize)
	}
	block, rest := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" || len(strings.TrimSpace(string(rest))) != 0 {
		return nil, attest.ReasonBadCSR, "request is not exactly one PEM CERTIFICATE REQUEST"
	}
	cr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, attest.ReasonBadCSR, fmt.Sprintf("request does not parse: %v", err)
	}
	if err := cr.CheckSignature(); err != nil {
		return nil, attest.ReasonBadCSR, fmt.Sprintf("request signature: %v", err)
	}
	if len(cr.Subject.Organization) != 1 || cr.Subject.Organization[0] != NodesGroup {
		return nil, attest.ReasonBadSubject, fmt.Sprintf("organization %q, want exactly [%s]", cr.Subject.Organization, NodesGroup)
	}
	name, ok := strings.CutPrefix(cr.Subject.CommonName, NodeUserPrefix)
	if !ok || !attest.ValidNodeName(name) {
		return nil, attest.ReasonBadSubject, fmt.Sprintf("common name %q is not system:node:<node name>", cr.Subject.CommonName)
	}
	isRSA, why := keyAllowed(cr.PublicKey)
	if why != "" {
		return nil, attest.ReasonKeyNotAllowed, why
	}
	k := &kubeletCSR{signer: signer, nodeName: name, requester: csr.Spec.Username}
	if k.keySHA256, err = attest.KeySHA256(cr.RawSubjectPublicKeyInfo); err != nil {
		return nil, attest.ReasonBadCSR, "request's public key: " + err.Error()
	}
	if len(cr.EmailAddresses) > 0 || len(cr.URIs) > 0 {
		return nil, attest.ReasonSANsNotAllowed, "e-mail or URI SANs"
	}
	var extended certv1.KeyUsage
	switch signer {
	case SignerKubeletClient:
		if len(cr.DNSNames) > 0 || len(cr.IPAddresses) > 0 {
			return nil, attest.ReasonSANsNotAllowed, "a kubelet client certificate has no SANs"
		}
		extended = certv1.UsageClientAuth
	case SignerKubeletServing:
		if csr.Spec.Username != cr.Subject.CommonName {
			return nil, attest.ReasonRequesterMismatch, fmt.Sprintf("requested by %q, not by the node %q itself", csr.Spec.Username, cr.Subject.CommonName)
		}
		if len(cr.DNSNames) == 0 && len(cr.IPAddresses) == 0 {
			return nil, attest.ReasonSANsNotAllowed, "a kubelet serving certificate needs a DNS or IP SAN"
		}
		k.dnsNames = cr.DNSNames
		for _, ip := range cr.IPAddresses {
			k.ips = append(k.ips, ip.String())
		}
		extended = certv1.UsageServerAuth
	}
	if why := extensionsAllowed(cr, signer == SignerKubeletServing, isRSA); why != "" {
		return nil, attest.ReasonExtensionNotAllowed, why
	}
	if !usagesAllowed(csr.Spec.Usages, extended, isRSA) {
		return nil, attest.ReasonUsagesNotAllowed, fmt.Sprintf("usages %v", csr.Spec.Usages)
	}
	return k, "", ""
}

// keyAllowed reports whether the key is one a kubelet makes (ECDSA P-256 is
// the kubelet's; P-384 and RSA 2048–8192 are allowed), and whether it is RSA.
func keyAllowed(pub any) (isRSA bool, why string) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return false, "ECDSA curve " + k.Curve.Params().Name + " (want P-256 or P-384)"
		}
		return false, ""
	case *rsa.PublicKey:
		if n := k.N.BitLen(); n < 2048 || n > 8192 {
			return true, fmt.Sprintf("RSA key of %d bits (want 2048 to 8192)", n)
		}
		return true, ""
	}
	return false, fmt.Sprintf("key type %T", pub)
}

// usagesAllowed: exactly digital signature and ext, plus key encipherment
// for RSA keys only; no duplicates.
func usagesAllowed(u []certv1.KeyUsage, ext certv1.KeyUsage, isRSA bool) bool {
	want := []certv1.KeyUsage{certv1.UsageDigitalSignature, ext}
	if isRSA && slices.Contains(u, certv1.UsageKeyEncipherment) {
		want = append(want, certv1.UsageKeyEncipherment)
	}
	if len(u) != len(want) {
		return false
	}
	for _, w := range want {
		if !slices.Contains(u, w) {
			return false
		}
	}
	return true
}
