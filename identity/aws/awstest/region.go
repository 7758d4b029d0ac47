// Package awstest stands in for AWS in tests, speaking the real protocols:
// a Region's RSA-2048 signing key and self-signed certificate that sign
// instance identity documents as AWS's rsa2048 PKCS#7, a loopback instance
// metadata service speaking IMDSv2 (IMDS), and a loopback EC2 Query API that
// answers DescribeInstances with the XML EC2 returns (EC2), so that the
// aws-sdk-go-v2 imds and ec2 clients run against it unchanged.
package awstest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/smallstep/pkcs7"
)

// Region is a test Region: an RSA-2048 key and the self-signed certificate
// a verifier trusts for it, as AWS publishes one per Region.
type Region struct {
	Name string
	Key  *rsa.PrivateKey
	Cert *x509.Certificate
}

// RegionOptions shape a test Region's certificate.
type RegionOptions struct {
	// Key is the signing key; nil generates an RSA-2048 key.
	Key *rsa.PrivateKey
	// Subject is the certificate's subject and issuer; zero means AWS's
	// (C=US, ST=Washington State, L=Seattle, O=Amazon Web Services LLC).
	Subject pkix.Name
	// Serial is the certificate's serial number; nil picks a random one.
	// Giving another Region's subject and serial makes a certificate that
	// claims to be that Region's, with a different key.
	Serial *big.Int
}

// AWSSubject is the subject (and issuer) of AWS's Region certificates.
var AWSSubject = pkix.Name{
	Country:      []string{"US"},
	Province:     []string{"Washington State"},
	Locality:     []string{"Seattle"},
	Organization: []string{"Amazon Web Services LLC"},
}

// NewRegion returns a Region with a fresh key and random serial.
func NewRegion(name string) (*Region, error) {
	return NewRegionWith(name, RegionOptions{})
}

// NewRegionWith returns a Region shaped by o.
func NewRegionWith(name string, o RegionOptions) (*Region, error) {
	key := o.Key
	if key == nil {
		var err error
		if key, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			return nil, err
		}
	}
	subject := o.Subject
	if len(subject.Organization) == 0 && subject.CommonName == "" {
		subject = AWSSubject
	}
	serial := o.Serial
	if serial == nil {
		var err error
		if serial, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64)); err != nil {
			return nil, err
		}
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject,
		NotBefore:             time.Date(2015, 8, 14, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2195, 1, 17, 0, 0, 0, 0, time.UTC),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Region{Name: name, Key: key, Cert: cert}, nil
}

// SignOptions vary a signature from AWS's, for attacks.
type SignOptions struct {
	// Embed are certificates to put in the PKCS#7. AWS embeds none.
	Embed []*x509.Certificate
	// Digest is the digest algorithm; nil means SHA-256, as AWS.
	Digest asn1.ObjectIdentifier
	// Detached leaves the content out of the PKCS#7.
	Detached bool
}

// Sign signs content as AWS signs an instance identity document for the
// rsa2048 endpoint: PKCS#7 SignedData, content attached, SHA-256 with RSA,
// signed attributes (content type, signing time, message digest), no
// certificates. It returns the DER.
func (r *Region) Sign(content []byte) ([]byte, error) {
	return r.SignWith(content, SignOptions{})
}

// SignWith is Sign varied by o.
func (r *Region) SignWith(content []byte, o SignOptions) ([]byte, error) {
	sd, err := pkcs7.NewSignedData(content)
	if err != nil {
		return nil, err
	}
	if o.Digest != nil {
		sd.SetDigestAlgorithm(o.Digest)
	} else {
		sd.SetDigestAlgorithm(pkcs7.OIDDigestAlgorithmSHA256)
	}
	if err := sd.AddSigner(r.Cert, r.Key, pkcs7.SignerInfoConfig{}); err != nil {
		return nil, err
	}
	if o.Detached {
		sd.Detach()
	}
	// AddSigner lists the signer's certificate; AWS's blob has none, so
	// the SignedData is marshalled here with only the ones asked for.
	inner := sd.GetSignedData()
	inner.Certificates.Raw = nil
	if len(o.Embed) > 0 {
		var raw []byte
		for _, c := range o.Embed {
			raw = append(raw, c.Raw...)
		}
		b, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: raw})
		if err != nil {
			return nil, err
		}
		inner.Certificates.Raw = b
	}
	innerDER, err := asn1.Marshal(*inner)
	if err != nil {
		return nil, err
	}
	return asn1.Marshal(contentInfo{
		ContentType: pkcs7.OIDSignedData,
		Content:     asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, Bytes: innerDER, IsCompound: true},
	})
}

type contentInfo struct {
	ContentType asn1.ObjectIdentifier
	Content     asn1.RawValue `asn1:"explicit,optional,tag:0"`
}

// LegacySignature is what /latest/dynamic/instance-identity/signature
// serves: base64 of an RSA PKCS#1 v1.5 SHA-256 signature over the document
// (AWS signs it with a separate key; the test Region's serves here).
func (r *Region) LegacySignature(doc []byte) (string, error) {
	h := sha256.Sum256(doc)
	sig, err := rsa.SignPKCS1v15(rand.Reader, r.Key, crypto.SHA256, h[:])
	if err != nil {
		return "", err
	}
	return Base64Lines(sig), nil
}

// Base64Lines encodes b as IMDS serves its signatures: standard base64 in
// lines of 64 characters, no PEM armour, no trailing newline.
func Base64Lines(b []byte) string {
	s := base64.StdEncoding.EncodeToString(b)
	var sb strings.Builder
	for len(s) > 64 {
		sb.WriteString(s[:64])
		sb.WriteByte('\n')
		s = s[64:]
	}
	sb.WriteString(s)
	return sb.String()
}

// Document is an instance identity document. JSON writes it as EC2 does
// (pretty-printed, `"name" : value`). An empty field is written as null;
// a field named in Omit is not written at all.
type Document struct {
	AccountID        string
	Architecture     string
	AvailabilityZone string
	ImageID          string
	InstanceID       string
	InstanceType     string
	PendingTime      string
	PrivateIP        string
	Region           string
	Version          string
	Omit             []string
}

// NewDocument returns a plausible document for region, started at pending.
func NewDocument(region string, pending time.Time) Document {
	return Document{
		AccountID:        "123456789012",
		Architecture:     "x86_64",
		AvailabilityZone: region + "a",
		ImageID:          "ami-0abcdef1234567890",
		InstanceID:       "i-1234567890abcdef0",
		InstanceType:     "m5.xlarge",
		PendingTime:      pending.UTC().Format(time.RFC3339),
		PrivateIP:        "10.0.1.2",
		Region:           region,
		Version:          "2017-09-30",
	}
}

// JSON returns the document as EC2 writes it.
func (d Document) JSON() []byte {
	fields := []struct{ name, value string }{
		{"accountId", d.AccountID},
		{"architecture", d.Architecture},
		{"availabilityZone", d.AvailabilityZone},
		{"billingProducts", ""},
		{"devpayProductCodes", ""},
		{"marketplaceProductCodes", ""},
		{"imageId", d.ImageID},
		{"instanceId", d.InstanceID},
		{"instanceType", d.InstanceType},
		{"kernelId", ""},
		{"pendingTime", d.PendingTime},
		{"privateIp", d.PrivateIP},
		{"ramdiskId", ""},
		{"region", d.Region},
		{"version", d.Version},
	}
	var lines []string
	for _, f := range fields {
		if omitted(d.Omit, f.name) {
			continue
		}
		v := "null"
		if f.value != "" {
			v = fmt.Sprintf("%q", f.value)
		}
		lines = append(lines, fmt.Sprintf("  %q : %s", f.name, v))
	}
	return []byte("{\n" + strings.Join(lines, ",\n") + "\n}")
}

func omitted(list []string, name string) bool {
	for _, n := range list {
		if n == name {
			return true
		}
	}
	return false
}

// Files are what IMDS serves under /latest/dynamic/instance-identity/.
type Files struct {
	Document  []byte
	RSA2048   string
	Signature string
}

// Files signs d and returns what IMDS would serve for it.
func (r *Region) Files(d Document) (Files, error) {
	doc := d.JSON()
	der, err := r.Sign(doc)
	if err != nil {
		return Files{}, err
	}
	sig, err := r.LegacySignature(doc)
	if err != nil {
		return Files{}, err
	}
	return Files{Document: doc, RSA2048: Base64Lines(der), Signature: sig}, nil
}
