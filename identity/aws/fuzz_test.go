package aws_test

import (
	"bytes"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/smallstep/pkcs7"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite testdata/fuzz seed corpora")

// fuzzRegion is us-east-1 with the fixed key of testdata/fuzz, so that the
// seed corpus holds signatures that verify.
func fuzzRegion(t testing.TB) *awstest.Region {
	t.Helper()
	b, err := os.ReadFile("testdata/fuzz/region-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatal("testdata/fuzz/region-key.pem: no PEM")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	r, err := awstest.NewRegionWith("us-east-1", awstest.RegionOptions{Key: k.(*rsa.PrivateKey), Serial: big.NewInt(1)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func fuzzVerifier(t testing.TB, r *awstest.Region) (*aws.Verifier, *attest.Session) {
	t.Helper()
	v, err := aws.NewVerifier(aws.Options{
		Certs: aws.NewRegionCerts(map[string][]*x509.Certificate{"us-east-1": {r.Cert}}),
		Clock: clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, sess, err := v.Challenge("worker", make([]byte, 32), nil)
	if err != nil {
		t.Fatal(err)
	}
	return v, sess
}

// fuzzSeeds are the seeds of FuzzVerify: (PKCS#7 DER, plain document).
func fuzzSeeds(t testing.TB, r *awstest.Region) map[string][2][]byte {
	t.Helper()
	sign := func(content []byte, o awstest.SignOptions) []byte {
		b, err := r.SignWith(content, o)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	d := doc().JSON()
	other := doc()
	other.InstanceID = "i-0fedcba9876543210"
	real, err := os.ReadFile("testdata/real/ap-southeast-2.rsa2048")
	if err != nil {
		t.Fatal(err)
	}
	realDER, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(string(real), "\n", ""))
	if err != nil {
		t.Fatal(err)
	}
	return map[string][2][]byte{
		"valid":                {sign(d, awstest.SignOptions{}), d},
		"valid-no-document":    {sign(d, awstest.SignOptions{}), nil},
		"substituted-document": {sign(d, awstest.SignOptions{}), other.JSON()},
		"valid-embedded-cert":  {sign(d, awstest.SignOptions{Embed: []*x509.Certificate{r.Cert}}), d},
		"sha1":                 {sign(d, awstest.SignOptions{Digest: pkcs7.OIDDigestAlgorithmSHA1}), nil},
		"detached":             {sign(d, awstest.SignOptions{Detached: true}), d},
		"not-json":             {sign([]byte("not json"), awstest.SignOptions{}), nil},
		"duplicate-member":     {sign([]byte(`{"region":"us-east-1","region":"us-east-1"}`), awstest.SignOptions{}), nil},
		"real-aws-ber":         {realDER, nil},
		"empty":                {nil, nil},
	}
}

// TestFuzzSeeds checks the checked-in seed corpus: the "valid" seed passes
// every check (so the fuzzer starts on the accepting path) and each other
// seed is refused. With -update-seeds it rewrites the corpus first.
func TestFuzzSeeds(t *testing.T) {
	r := fuzzRegion(t)
	dir := filepath.Join("testdata", "fuzz", "FuzzVerify")
	if *updateSeeds {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, s := range fuzzSeeds(t, r) {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n[]byte(%s)\n", strconv.Quote(string(s[0])), strconv.Quote(string(s[1])))
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	v, sess := fuzzVerifier(t, r)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 5 {
		t.Fatalf("%d seeds in %s", len(entries), dir)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 3 || lines[0] != "go test fuzz v1" {
			t.Fatalf("%s: not a corpus file", e.Name())
		}
		var args [2][]byte
		for i, l := range lines[1:] {
			s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(l, "[]byte("), ")"))
			if err != nil {
				t.Fatalf("%s: %v", e.Name(), err)
			}
			args[i] = []byte(s)
		}
		_, err = v.Verify(ctx, sess, &aws.Evidence{PKCS7: base64.StdEncoding.EncodeToString(args[0]), Document: args[1]})
		accept := strings.HasPrefix(e.Name(), "valid")
		if accept && err != nil {
			t.Errorf("seed %s refused: %v", e.Name(), err)
		}
		if !accept && err == nil {
			t.Errorf("seed %s accepted", e.Name())
		}
	}
}

// FuzzVerify feeds arbitrary PKCS#7 DER and plain documents to Verify. It
// must never panic, every refusal must be a Denial (there is no live
// check, so nothing else can fail), and what it accepts must be the signed
// document of the trusted key: a us-east-1 claim whose plain document, if
// any, is the signed one.
func FuzzVerify(f *testing.F) {
	r := fuzzRegion(f)
	v, sess := fuzzVerifier(f, r)
	f.Fuzz(func(t *testing.T, der, document []byte) {
		ev := &aws.Evidence{PKCS7: base64.StdEncoding.EncodeToString(der), Document: document}
		claims, err := v.Verify(ctx, sess, ev)
		if err != nil {
			if _, ok := attest.ReasonOf(err); !ok {
				t.Fatalf("refusal is not a Denial: %v", err)
			}
			return
		}
		if claims.Instance.Location != "us-east-1" || claims.Identity != "aws:"+claims.Instance.Account+"/us-east-1/"+claims.Instance.ID {
			t.Fatalf("accepted odd claims %+v", claims)
		}
		p7, err := pkcs7.Parse(der)
		if err != nil {
			t.Fatalf("accepted a PKCS#7 that does not parse: %v", err)
		}
		if len(document) > 0 && !bytes.Equal(bytes.TrimSpace(document), bytes.TrimSpace(p7.Content)) {
			t.Fatalf("accepted a plain document that is not the signed one")
		}
		if !bytes.Contains(p7.Content, []byte(claims.Instance.ID)) {
			t.Fatalf("instance ID %q is not in the signed content", claims.Instance.ID)
		}
	})
}

// FuzzSignedDocument signs arbitrary content with the trusted key, so the
// fuzzer reaches the document parser with valid signatures: it must never
// panic, refuse only with Denials, and accept only documents whose every
// required field is well formed.
func FuzzSignedDocument(f *testing.F) {
	r := fuzzRegion(f)
	v, sess := fuzzVerifier(f, r)
	f.Add(doc().JSON())
	f.Add([]byte(`{"accountId":"123456789012","region":"us-east-1","availabilityZone":"us-east-1a","instanceId":"i-12345678","instanceType":"t3.micro","imageId":"ami-12345678","privateIp":"10.0.0.1","pendingTime":"2026-03-01T11:59:00Z"}`))
	f.Add([]byte(`{"region":"us-east-1","region":"eu-west-1"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, content []byte) {
		if len(content) == 0 || len(content) > aws.MaxDocumentSize {
			return
		}
		der, err := r.Sign(content)
		if err != nil {
			return
		}
		claims, err := v.Verify(ctx, sess, &aws.Evidence{PKCS7: base64.StdEncoding.EncodeToString(der)})
		if err != nil {
			if _, ok := attest.ReasonOf(err); !ok {
				t.Fatalf("refusal is not a Denial: %v", err)
			}
			return
		}
		a := claims.Instance
		if len(a.Account) != 12 || !strings.HasPrefix(a.ID, "i-") || !strings.HasPrefix(a.Image, "ami-") ||
			!strings.HasPrefix(a.AvailabilityZone, a.Location) || a.PrivateIP == "" || a.Type == "" {
			t.Fatalf("accepted malformed document %q: %+v", content, a)
		}
		if now.Sub(a.Created) > time.Hour || a.Created.Sub(now) > time.Minute {
			t.Fatalf("accepted stale document %q", content)
		}
	})
}
