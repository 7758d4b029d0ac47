package approver

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"net"
	"testing"
)

// FuzzExtensions feeds extensionsAllowed a requested extension of each
// kind with an arbitrary value. Properties: it never panics; an accepted
// KeyUsage sets no bit beyond digital signature (and key encipherment for
// RSA); an accepted ExtendedKeyUsage holds only the signer's usage; an
// accepted SubjectAltName is a sequence of DNS names and IP addresses
// only; any other extension is refused.
func FuzzExtensions(f *testing.F) {
	san, _ := asn1.Marshal([]asn1.RawValue{{Class: asn1.ClassContextSpecific, Tag: sanDNSName, Bytes: []byte("worker-1")},
		{Class: asn1.ClassContextSpecific, Tag: sanIPAddress, Bytes: net.ParseIP("10.0.0.1").To4()}})
	ku, _ := asn1.Marshal(asn1.BitString{Bytes: []byte{0xa0}, BitLength: 3})
	eku, _ := asn1.Marshal([]asn1.ObjectIdentifier{oidEKUServerAuth})
	for i, v := range [][]byte{san, ku, eku, {0x30, 0x03, 0x01, 0x01, 0xff}} {
		f.Add(uint8(i), v, true, false)
	}
	oids := []asn1.ObjectIdentifier{oidSubjectAltName, oidKeyUsage, oidExtKeyUsage, {2, 5, 29, 19}}
	f.Fuzz(func(t *testing.T, which uint8, value []byte, serving, isRSA bool) {
		oid := oids[int(which)%len(oids)]
		cr := &x509.CertificateRequest{Extensions: []pkix.Extension{{Id: oid, Value: value}}}
		if extensionsAllowed(cr, serving, isRSA) != "" {
			return
		}
		switch {
		case oid.Equal(oidKeyUsage):
			var bits asn1.BitString
			asn1.Unmarshal(value, &bits)
			for i := 0; i < bits.BitLength; i++ {
				if bits.At(i) == 1 && i != 0 && !(i == 2 && isRSA) {
					t.Fatalf("accepted KeyUsage bit %d", i)
				}
			}
		case oid.Equal(oidExtKeyUsage):
			var ekus []asn1.ObjectIdentifier
			asn1.Unmarshal(value, &ekus)
			for _, e := range ekus {
				if !e.Equal(oidEKUServerAuth) && !e.Equal(oidEKUClientAuth) || e.Equal(oidEKUServerAuth) != serving {
					t.Fatalf("accepted extended key usage %s (serving %v)", e, serving)
				}
			}
		case oid.Equal(oidSubjectAltName):
			var seq []asn1.RawValue
			if _, err := asn1.Unmarshal(value, &seq); err != nil {
				t.Fatalf("accepted a SAN that does not parse: %v", err)
			}
			for _, gn := range seq {
				if gn.Tag != sanDNSName && gn.Tag != sanIPAddress {
					t.Fatalf("accepted a SAN of kind %d", gn.Tag)
				}
			}
		default:
			t.Fatalf("accepted extension %s", oid)
		}
	})
}
