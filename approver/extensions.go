package approver

import (
	"crypto/x509"
	"encoding/asn1"
	"fmt"
)

// Extensions a kubelet CSR may request, and the values they may hold.
var (
	oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidKeyUsage       = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidExtKeyUsage    = asn1.ObjectIdentifier{2, 5, 29, 37}
	oidEKUServerAuth  = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 1}
	oidEKUClientAuth  = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 2}
	// extensionNames name the extensions an attacker is likely to try.
	extensionNames = map[string]string{
		"2.5.29.19": "BasicConstraints", "2.5.29.30": "NameConstraints", "2.5.29.32": "CertificatePolicies",
		"2.5.29.14": "SubjectKeyIdentifier", "2.5.29.35": "AuthorityKeyIdentifier", "1.3.6.1.5.5.7.1.1": "AuthorityInfoAccess",
		"2.5.29.31": "CRLDistributionPoints", "2.5.29.18": "IssuerAltName", "2.5.29.9": "SubjectDirectoryAttributes",
	}
)

// SAN kinds (GeneralName's context-specific tags, RFC 5280 4.2.1.6) and
// KeyUsage bits (RFC 5280 4.2.1.3).
const (
	keyUsageDigitalSig  = 0
	keyUsageKeyEncipher = 2

	sanDNSName   = 2
	sanIPAddress = 7
)

func extensionName(oid asn1.ObjectIdentifier) string {
	if n, ok := extensionNames[oid.String()]; ok {
		return n + " (" + oid.String() + ")"
	}
	return oid.String()
}

// extensionsAllowed checks the extensions cr requests (its PKCS#10
// extensionRequest attribute) against what the kubelet sends — client-go's
// certificate manager makes the CSR with x509.CreateCertificateRequest
// from a template of subject, DNS names and IP addresses, so a serving CSR
// carries one SubjectAltName extension and a client CSR none. Checks:
//   - each extension at most once;
//   - SubjectAltName: only DNS names and IP addresses (e-mail and URI
//     SANs are refused before; otherName, directoryName, registeredID and
//     the rest, which Go's parser skips, are refused here);
//   - KeyUsage, if requested: digital signature, and key encipherment for
//     an RSA key, nothing else;
//   - ExtendedKeyUsage, if requested: exactly the signer's (server auth
//     for serving, client auth for client), nothing else;
//   - no other extension at all (BasicConstraints, NameConstraints, ...).
//
// It returns why the CSR is refused, or "".
func extensionsAllowed(cr *x509.CertificateRequest, serving, isRSA bool) string {
	seen := make(map[string]bool, len(cr.Extensions))
	for _, ext := range cr.Extensions {
		name := extensionName(ext.Id)
		if seen[ext.Id.String()] {
			return "extension " + name + " requested twice"
		}
		seen[ext.Id.String()] = true
		switch {
		case ext.Id.Equal(oidSubjectAltName):
			if why := sanKindsAllowed(ext.Value); why != "" {
				return why
			}
		case ext.Id.Equal(oidKeyUsage):
			var bits asn1.BitString
			if rest, err := asn1.Unmarshal(ext.Value, &bits); err != nil || len(rest) != 0 {
				return "a KeyUsage extension that does not parse"
			}
			for i := 0; i < bits.BitLength; i++ {
				if bits.At(i) == 1 && i != keyUsageDigitalSig && (i != keyUsageKeyEncipher || !isRSA) {
					return fmt.Sprintf("KeyUsage bit %d requested (a kubelet certificate has digital signature, and key encipherment for RSA)", i)
				}
			}
		case ext.Id.Equal(oidExtKeyUsage):
			var ekus []asn1.ObjectIdentifier
			if rest, err := asn1.Unmarshal(ext.Value, &ekus); err != nil || len(rest) != 0 {
				return "an ExtendedKeyUsage extension that does not parse"
			}
			want := oidEKUClientAuth
			if serving {
				want = oidEKUServerAuth
			}
			for _, e := range ekus {
				if !e.Equal(want) {
					return fmt.Sprintf("extended key usage %s requested (this signer's certificates have only %s)", e, want)
				}
			}
		default:
			return "extension " + name + " requested; a kubelet certificate carries none"
		}
	}
	return ""
}

// sanKindsAllowed parses a SubjectAltName extension's value (a SEQUENCE
// of GeneralName) and refuses any name that is not a DNS name or an IP
// address.
func sanKindsAllowed(der []byte) string {
	var seq asn1.RawValue
	if rest, err := asn1.Unmarshal(der, &seq); err != nil || len(rest) != 0 || seq.Class != asn1.ClassUniversal || seq.Tag != asn1.TagSequence || !seq.IsCompound {
		return "a SubjectAltName extension that does not parse"
	}
	for rest := seq.Bytes; len(rest) > 0; {
		var gn asn1.RawValue
		var err error
		if rest, err = asn1.Unmarshal(rest, &gn); err != nil {
			return "a SubjectAltName extension that does not parse"
		}
		if gn.Class != asn1.ClassContextSpecific || (gn.Tag != sanDNSName && gn.Tag != sanIPAddress) {
			return fmt.Sprintf("a SAN of kind [%d] (class %d); a kubelet asks only for DNS names and IP addresses", gn.Tag, gn.Class)
		}
	}
	return ""
}
