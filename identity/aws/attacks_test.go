package aws_test

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/smallstep/pkcs7"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
)

// TestAttacks: each named attack is refused with its own reason.
func TestAttacks(t *testing.T) {
	f := newFixture(t)
	good := func() *aws.Evidence { return f.evidence(f.useast1, doc(), awstest.SignOptions{}) }
	signed := func(d awstest.Document) *aws.Evidence { return f.evidence(f.useast1, d, awstest.SignOptions{}) }
	der := func(r *awstest.Region, content []byte, o awstest.SignOptions) []byte {
		b, err := r.SignWith(content, o)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	withDoc := func(mod func(*awstest.Document)) *aws.Evidence {
		d := doc()
		mod(&d)
		return signed(d)
	}
	raw := func(content string) *aws.Evidence {
		return &aws.Evidence{PKCS7: awstest.Base64Lines(der(f.useast1, []byte(content), awstest.SignOptions{}))}
	}

	type attack struct {
		name string
		ev   func() *aws.Evidence
		sess func(*attest.Session) *attest.Session // nil: a fresh session
		want attest.Reason
	}
	attacks := []attack{
		// Substitution: the signed document is A's, the plain one B's.
		{"document substitution", func() *aws.Evidence {
			ev := good()
			b := doc()
			b.InstanceID = "i-0fedcba9876543210"
			b.AccountID = "999999999999"
			ev.Document = b.JSON()
			return ev
		}, nil, attest.ReasonDocSubstituted},
		{"document substitution, same length", func() *aws.Evidence {
			ev := good()
			ev.Document = bytes.Replace(ev.Document, []byte("10.0.1.2"), []byte("10.0.1.9"), 1)
			return ev
		}, nil, attest.ReasonDocSubstituted},
		{"document substitution, not JSON beside a valid signature", func() *aws.Evidence {
			ev := good()
			ev.Document = []byte("region=us-east-1")
			return ev
		}, nil, attest.ReasonDocSubstituted},
		{"document substitution beside a tampered signature: the signature decides", func() *aws.Evidence {
			ev := good()
			b, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(ev.PKCS7, "\n", ""))
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)-1] ^= 1
			ev.PKCS7 = awstest.Base64Lines(b)
			ev.Document = bytes.Replace(ev.Document, []byte("10.0.1.2"), []byte("10.0.1.9"), 1)
			return ev
		}, nil, attest.ReasonDocSignature},

		// Signer.
		{"signed by another key with its own certificate", func() *aws.Evidence {
			return f.evidence(f.attacker, doc(), awstest.SignOptions{})
		}, nil, attest.ReasonDocRegionCert},
		{"signed by another key, its certificate embedded", func() *aws.Evidence {
			return f.evidence(f.attacker, doc(), awstest.SignOptions{Embed: []*x509.Certificate{f.attacker.Cert}})
		}, nil, attest.ReasonDocRegionCert},
		{"signed by another key naming the region certificate", func() *aws.Evidence {
			return f.evidence(f.imperson, doc(), awstest.SignOptions{})
		}, nil, attest.ReasonDocSignature},
		{"signed by another key naming the region certificate, impostor certificate embedded", func() *aws.Evidence {
			return f.evidence(f.imperson, doc(), awstest.SignOptions{Embed: []*x509.Certificate{f.imperson.Cert}})
		}, nil, attest.ReasonDocSignature},
		{"certificate of another region", func() *aws.Evidence {
			return f.evidence(f.euwest1, doc(), awstest.SignOptions{}) // a us-east-1 document signed by eu-west-1
		}, nil, attest.ReasonDocRegionCert},
		{"unknown region", func() *aws.Evidence {
			d := awstest.NewDocument("ap-nowhere-9", now.Add(-time.Minute))
			return f.evidence(f.useast1, d, awstest.SignOptions{})
		}, nil, attest.ReasonDocRegionCert},
		{"region name not a region", func() *aws.Evidence {
			d := awstest.NewDocument("../../etc/passwd", now.Add(-time.Minute))
			d.AvailabilityZone = "../../etc/passwda"
			return f.evidence(f.useast1, d, awstest.SignOptions{})
		}, nil, attest.ReasonDocMalformed},

		// Signature.
		{"tampered signed content", func() *aws.Evidence {
			b := der(f.useast1, doc().JSON(), awstest.SignOptions{})
			b = bytes.Replace(b, []byte("i-1234567890abcdef0"), []byte("i-1234567890abcdef1"), 1)
			return &aws.Evidence{PKCS7: awstest.Base64Lines(b)}
		}, nil, attest.ReasonDocSignature},
		{"tampered signature", func() *aws.Evidence {
			b := der(f.useast1, doc().JSON(), awstest.SignOptions{})
			b[len(b)-1] ^= 1
			return &aws.Evidence{PKCS7: awstest.Base64Lines(b)}
		}, nil, attest.ReasonDocSignature},
		{"SHA-1 digest", func() *aws.Evidence {
			return f.evidence(f.useast1, doc(), awstest.SignOptions{Digest: pkcs7.OIDDigestAlgorithmSHA1})
		}, nil, attest.ReasonDocSignature},

		// PKCS#7 form.
		{"detached signature", func() *aws.Evidence {
			return f.evidence(f.useast1, doc(), awstest.SignOptions{Detached: true})
		}, nil, attest.ReasonDocMalformed},
		{"pkcs7 not base64", func() *aws.Evidence { return &aws.Evidence{PKCS7: "not base64!"} }, nil, attest.ReasonDocMalformed},
		{"pkcs7 empty", func() *aws.Evidence { return &aws.Evidence{} }, nil, attest.ReasonDocMalformed},
		{"pkcs7 garbage", func() *aws.Evidence {
			return &aws.Evidence{PKCS7: base64.StdEncoding.EncodeToString([]byte("garbage, not DER"))}
		}, nil, attest.ReasonDocMalformed},
		{"pkcs7 truncated", func() *aws.Evidence {
			b := der(f.useast1, doc().JSON(), awstest.SignOptions{})
			return &aws.Evidence{PKCS7: base64.StdEncoding.EncodeToString(b[:len(b)/2])}
		}, nil, attest.ReasonDocMalformed},
		{"pkcs7 in PEM armour", func() *aws.Evidence {
			b := der(f.useast1, doc().JSON(), awstest.SignOptions{})
			return &aws.Evidence{PKCS7: string(pem.EncodeToMemory(&pem.Block{Type: "PKCS7", Bytes: b}))}
		}, nil, attest.ReasonDocMalformed},

		// Document form (validly signed).
		{"content not JSON", func() *aws.Evidence { return raw("region=us-east-1") }, nil, attest.ReasonDocMalformed},
		{"content a JSON array", func() *aws.Evidence { return raw(`["us-east-1"]`) }, nil, attest.ReasonDocMalformed},
		{"content with trailing data", func() *aws.Evidence {
			return raw(string(doc().JSON()) + `{"region":"eu-west-1"}`)
		}, nil, attest.ReasonDocMalformed},
		{"duplicate member", func() *aws.Evidence {
			j := strings.Replace(string(doc().JSON()), "{\n", "{\n  \"instanceId\" : \"i-0000000000000000a\",\n", 1)
			return raw(j)
		}, nil, attest.ReasonDocMalformed},
		{"member name in other case", func() *aws.Evidence {
			return raw(strings.Replace(string(doc().JSON()), `"instanceId"`, `"InstanceId"`, 1))
		}, nil, attest.ReasonDocMalformed},
		{"instanceId a number", func() *aws.Evidence {
			return raw(strings.Replace(string(doc().JSON()), `"i-1234567890abcdef0"`, `1234567890`, 1))
		}, nil, attest.ReasonDocMalformed},
		{"bad instance ID: short", func() *aws.Evidence { return withDoc(func(d *awstest.Document) { d.InstanceID = "i-1234567" }) }, nil, attest.ReasonDocMalformed},
		{"bad instance ID: long", func() *aws.Evidence {
			return withDoc(func(d *awstest.Document) { d.InstanceID = "i-1234567890abcdef01" })
		}, nil, attest.ReasonDocMalformed},
		{"bad instance ID: upper case", func() *aws.Evidence {
			return withDoc(func(d *awstest.Document) { d.InstanceID = "i-1234567890ABCDEF0" })
		}, nil, attest.ReasonDocMalformed},
		{"bad instance ID: path", func() *aws.Evidence {
			return withDoc(func(d *awstest.Document) { d.InstanceID = "i-12345678/../x" })
		}, nil, attest.ReasonDocMalformed},
		{"bad account ID", func() *aws.Evidence { return withDoc(func(d *awstest.Document) { d.AccountID = "12345678901a" }) }, nil, attest.ReasonDocMalformed},
		{"bad image ID", func() *aws.Evidence { return withDoc(func(d *awstest.Document) { d.ImageID = "ami-xyz" }) }, nil, attest.ReasonDocMalformed},
		{"bad private IP", func() *aws.Evidence { return withDoc(func(d *awstest.Document) { d.PrivateIP = "10.0.1.300" }) }, nil, attest.ReasonDocMalformed},
		{"private IP with zone", func() *aws.Evidence { return withDoc(func(d *awstest.Document) { d.PrivateIP = "fe80::1%eth0" }) }, nil, attest.ReasonDocMalformed},
		{"bad pendingTime", func() *aws.Evidence {
			return withDoc(func(d *awstest.Document) { d.PendingTime = "2026-03-01 11:55:00" })
		}, nil, attest.ReasonDocMalformed},
		{"zone outside the region", func() *aws.Evidence {
			return withDoc(func(d *awstest.Document) { d.AvailabilityZone = "eu-west-1a" })
		}, nil, attest.ReasonDocMalformed},
		{"instance type with spaces", func() *aws.Evidence {
			return withDoc(func(d *awstest.Document) { d.InstanceType = "m5 large" })
		}, nil, attest.ReasonDocMalformed},
		{"oversized field", func() *aws.Evidence {
			return withDoc(func(d *awstest.Document) { d.InstanceType = strings.Repeat("m", 200) })
		}, nil, attest.ReasonDocMalformed},

		// Freshness.
		{"pendingTime too old", func() *aws.Evidence {
			return signed(awstest.NewDocument("us-east-1", now.Add(-2*time.Hour)))
		}, nil, attest.ReasonDocTooOld},
		{"pendingTime in the future", func() *aws.Evidence {
			return signed(awstest.NewDocument("us-east-1", now.Add(5*time.Minute)))
		}, nil, attest.ReasonDocTooOld},

		// Sizes.
		{"oversized pkcs7", func() *aws.Evidence {
			ev := good()
			ev.PKCS7 += strings.Repeat("A", aws.MaxPKCS7Size)
			return ev
		}, nil, attest.ReasonMalformed},
		{"oversized document", func() *aws.Evidence {
			ev := good()
			ev.Document = append(ev.Document, bytes.Repeat([]byte(" "), aws.MaxDocumentSize)...)
			return ev
		}, nil, attest.ReasonMalformed},
		{"oversized signature", func() *aws.Evidence {
			ev := good()
			ev.Signature = strings.Repeat("A", aws.MaxSignatureSize+1)
			return ev
		}, nil, attest.ReasonMalformed},
		{"oversized signed content", func() *aws.Evidence {
			d := string(doc().JSON())
			return raw(d[:len(d)-1] + `, "pad" : "` + strings.Repeat("x", aws.MaxDocumentSize) + "\"}")
		}, nil, attest.ReasonDocMalformed},
		{"nil evidence", func() *aws.Evidence { return nil }, nil, attest.ReasonMalformed},

		// Sessions.
		{"expired session", good, func(s *attest.Session) *attest.Session {
			s.Expires = now
			return s
		}, attest.ReasonSessionExpired},
		{"TPM session", good, func(s *attest.Session) *attest.Session {
			s.Kind = attest.KindTPM
			return s
		}, attest.ReasonSessionInvalid},
		{"no session", good, func(*attest.Session) *attest.Session { return nil }, attest.ReasonSessionInvalid},
		{"session without kubelet key", good, func(s *attest.Session) *attest.Session {
			s.KubeletKeySHA256 = nil
			return s
		}, attest.ReasonSessionInvalid},
	}
	// Every required field, missing and null.
	for _, field := range []string{"accountId", "region", "availabilityZone", "instanceId", "instanceType", "imageId", "privateIp", "pendingTime"} {
		attacks = append(attacks,
			attack{"missing " + field, func() *aws.Evidence { return withDoc(func(d *awstest.Document) { d.Omit = []string{field} }) }, nil, attest.ReasonDocMalformed},
			attack{"null " + field, func() *aws.Evidence {
				return raw(nullField(doc().JSON(), field))
			}, nil, attest.ReasonDocMalformed},
		)
	}

	v := f.verifier(nil)
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			sess := f.session(v)
			if a.sess != nil {
				sess = a.sess(sess)
			}
			_, err := v.Verify(ctx, sess, a.ev())
			attacktable.CheckRefusal(t, "AWS", a.name, a.want, err)
		})
	}
}

// nullField replaces a field's value with null in an EC2-formatted
// document.
func nullField(doc []byte, field string) string {
	lines := strings.Split(string(doc), "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), `"`+field+`" :`) {
			end := ""
			if strings.HasSuffix(l, ",") {
				end = ","
			}
			lines[i] = `  "` + field + `" : null` + end
		}
	}
	return strings.Join(lines, "\n")
}
