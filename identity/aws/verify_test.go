package aws_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
)

// TestRoundTrip runs the whole protocol: Challenge, Collect from a loopback
// IMDSv2 through the aws-sdk-go-v2 imds client, the evidence through JSON
// as on the wire, Verify; without and with a live check (Options.Live; the
// EC2 one is identity/aws/ec2live's, tested there), which is asked about
// the signed document's instance and names the node.
func TestRoundTrip(t *testing.T) {
	f := newFixture(t)
	d := doc()
	files, err := f.useast1.Files(d)
	if err != nil {
		t.Fatal(err)
	}
	md := awstest.NewIMDS(files)
	defer md.Close()
	var asked []attest.InstanceClaims
	live := liveFunc(func(_ context.Context, c *attest.InstanceClaims) (string, error) {
		asked = append(asked, *c)
		return c.ID + ".ec2.internal", nil
	})

	for _, tc := range []struct {
		name    string
		live    aws.LiveChecker
		wantDNS string
	}{
		{"no live check", nil, "ip-10-0-1-2.ec2.internal"},
		{"live check", live, d.InstanceID + ".ec2.internal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := f.verifier(func(o *aws.Options) { o.Live = tc.live })
			ch, sess, err := v.Challenge("worker", f.keyHash, &aws.ChallengeRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if ch == nil || sess.Kind != attest.KindAWS || len(sess.Nonce) != attest.NonceSize || sess.Pool != "worker" ||
				!bytes.Equal(sess.KubeletKeySHA256, f.keyHash) || !sess.Expires.Equal(now.Add(5*time.Minute)) {
				t.Fatalf("session %+v", sess)
			}
			ev, err := aws.Collect(ctx, md.Client())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(ev.Document, files.Document) || ev.PKCS7 != files.RSA2048 || ev.Signature != files.Signature {
				t.Fatalf("Collect returned %+v", ev)
			}
			wire, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			var got aws.Evidence
			if err := json.Unmarshal(wire, &got); err != nil {
				t.Fatal(err)
			}
			claims, err := v.Verify(ctx, sess, &got)
			if err != nil {
				t.Fatal(err)
			}
			want := &attest.InstanceClaims{
				Cloud: attest.CloudAWS, Account: "123456789012", Location: "us-east-1", AvailabilityZone: "us-east-1a",
				ID: "i-1234567890abcdef0", Type: "m5.xlarge", Image: "ami-0abcdef1234567890",
				PrivateIP: "10.0.1.2", Created: now.Add(-5 * time.Minute), PrivateDNSName: tc.wantDNS,
				LiveChecked: tc.live != nil,
			}
			if *claims.Instance != *want {
				t.Errorf("AWS claims\n got %+v\nwant %+v", *claims.Instance, *want)
			}
			if claims.Kind != attest.KindAWS || claims.Identity != "aws:123456789012/"+claims.Instance.Location+"/i-1234567890abcdef0" ||
				claims.NodeName != tc.wantDNS || !slices.Equal(claims.Addresses, []string{"10.0.1.2", tc.wantDNS}) ||
				!bytes.Equal(claims.KubeletKeySHA256, f.keyHash) || !claims.VerifiedAt.Equal(now) {
				t.Errorf("claims %+v", claims)
			}
		})
	}
	if len(asked) != 1 || asked[0].ID != d.InstanceID || asked[0].Account != d.AccountID || asked[0].Location != d.Region ||
		asked[0].AvailabilityZone != d.AvailabilityZone || asked[0].PrivateIP != d.PrivateIP || asked[0].LiveChecked {
		t.Errorf("live check asked about %+v, want once about the document's instance", asked)
	}
}

// liveFunc is an aws.LiveChecker answering with a function.
type liveFunc func(ctx context.Context, c *attest.InstanceClaims) (string, error)

func (f liveFunc) Check(ctx context.Context, c *attest.InstanceClaims) (string, error) {
	return f(ctx, c)
}

// TestLiveCheckOutcomes: a live check's refusal is Verify's, with its
// reason; any other live check error is returned wrapped and is not a
// refusal (the node retries).
func TestLiveCheckOutcomes(t *testing.T) {
	f := newFixture(t)
	apiDown := errors.New("EC2 API unreachable")
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"refusal", attest.Deny(attest.ReasonInstanceNotLive, "instance is stopped")},
		{"API error", apiDown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := f.verifier(func(o *aws.Options) {
				o.Live = liveFunc(func(context.Context, *attest.InstanceClaims) (string, error) { return "", tc.err })
			})
			claims, err := v.Verify(ctx, f.session(v), f.evidence(f.useast1, doc(), awstest.SignOptions{}))
			if err == nil {
				t.Fatalf("accepted: %+v", claims.Instance)
			}
			reason, isDenial := attest.ReasonOf(err)
			if tc.err == apiDown {
				if isDenial || !errors.Is(err, apiDown) {
					t.Fatalf("API error became %v (denial %v, reason %q)", err, isDenial, reason)
				}
				return
			}
			if reason != attest.ReasonInstanceNotLive {
				t.Fatalf("refusal became %v", err)
			}
		})
	}
}

// TestCollectErrors: no client, or an IMDS without the document, is an
// error.
func TestCollectErrors(t *testing.T) {
	if _, err := aws.Collect(ctx, nil); err == nil {
		t.Fatal("Collect(nil) succeeded")
	}
	md := awstest.NewIMDS(awstest.Files{}) // serves nothing: 404s
	defer md.Close()
	if _, err := aws.Collect(ctx, md.Client()); err == nil {
		t.Fatal("Collect succeeded against an IMDS without a document")
	}
}

// TestClaimsComeFromSignedContent: the node's Document is never read. With
// no Document, or with the signed one re-spaced, claims are the signed
// document's; a different Document is refused (see TestAttacks).
func TestClaimsComeFromSignedContent(t *testing.T) {
	f := newFixture(t)
	v := f.verifier(nil)
	signed := doc()
	for _, tc := range []struct {
		name     string
		document []byte
	}{
		{"no document", nil},
		{"document with trailing newline", append(signed.JSON(), '\n')},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := f.evidence(f.useast1, signed, awstest.SignOptions{})
			ev.Document = tc.document
			claims, err := v.Verify(ctx, f.session(v), ev)
			if err != nil {
				t.Fatal(err)
			}
			if claims.Instance.ID != signed.InstanceID || claims.Instance.Account != signed.AccountID {
				t.Fatalf("claims %+v", claims.Instance)
			}
		})
	}
}

// TestFreshnessEdges: pendingTime exactly MaxDocumentAge ago and 59 s in
// the future pass; a configured MaxDocumentAge is honoured.
func TestFreshnessEdges(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name    string
		maxAge  time.Duration
		pending time.Time
		want    attest.Reason
	}{
		{"exactly default max age", 0, now.Add(-time.Hour), ""},
		{"just over default max age", 0, now.Add(-time.Hour - time.Second), attest.ReasonDocTooOld},
		{"59s in the future", 0, now.Add(59 * time.Second), ""},
		{"61s in the future", 0, now.Add(61 * time.Second), attest.ReasonDocTooOld},
		{"10m max age, 9m old", 10 * time.Minute, now.Add(-9 * time.Minute), ""},
		{"10m max age, 11m old", 10 * time.Minute, now.Add(-11 * time.Minute), attest.ReasonDocTooOld},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := f.verifier(func(o *aws.Options) { o.MaxDocumentAge = tc.maxAge })
			d := awstest.NewDocument("us-east-1", tc.pending)
			_, err := v.Verify(ctx, f.session(v), f.evidence(f.useast1, d, awstest.SignOptions{}))
			if got := reasonOf(err); got != tc.want || (tc.want == "" && err != nil) {
				t.Fatalf("err = %v, want reason %q", err, tc.want)
			}
		})
	}
}

// TestNodeNameDerivation: without a live check the node name is derived
// the way EC2 names instances.
func TestNodeNameDerivation(t *testing.T) {
	for _, tc := range []struct{ region, ip, want string }{
		{"us-east-1", "10.0.1.2", "ip-10-0-1-2.ec2.internal"},
		{"eu-west-1", "172.31.16.5", "ip-172-31-16-5.eu-west-1.compute.internal"},
		{"cn-north-1", "10.1.2.3", "ip-10-1-2-3.cn-north-1.compute.internal"},
		{"us-east-1", "2001:db8::1", ""},
		{"us-east-1", "not-an-ip", ""},
		{"../etc", "10.0.0.1", ""},
	} {
		if got := aws.PrivateDNSName(tc.region, tc.ip); got != tc.want {
			t.Errorf("PrivateDNSName(%q, %q) = %q, want %q", tc.region, tc.ip, got, tc.want)
		}
	}
	f := newFixture(t)
	v := f.verifier(nil)
	d := awstest.NewDocument("eu-west-1", now.Add(-time.Minute))
	d.PrivateIP = "2001:db8::7"
	claims, err := v.Verify(ctx, f.session(v), f.evidence(f.euwest1, d, awstest.SignOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	if claims.NodeName != "" || !slices.Equal(claims.Addresses, []string{"2001:db8::7"}) {
		t.Fatalf("IPv6 document: node name %q, addresses %v", claims.NodeName, claims.Addresses)
	}
}

// TestRealAWSDocument verifies a document AWS itself signed
// (testdata/README.md) with the shipped certificates.
func TestRealAWSDocument(t *testing.T) {
	docBytes, err := os.ReadFile("testdata/real/ap-southeast-2.document")
	if err != nil {
		t.Fatal(err)
	}
	p7, err := os.ReadFile("testdata/real/ap-southeast-2.rsa2048")
	if err != nil {
		t.Fatal(err)
	}
	certs, err := aws.DefaultRegionCerts()
	if err != nil {
		t.Fatal(err)
	}
	pending := time.Date(2026, 2, 16, 0, 38, 27, 0, time.UTC)
	v, err := aws.NewVerifier(aws.Options{Certs: certs, Clock: func() time.Time { return pending.Add(10 * time.Minute) }})
	if err != nil {
		t.Fatal(err)
	}
	_, sess, err := v.Challenge("worker", make([]byte, 32), nil)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := v.Verify(ctx, sess, &aws.Evidence{Document: docBytes, PKCS7: string(p7)})
	if err != nil {
		t.Fatal(err)
	}
	want := attest.InstanceClaims{
		Cloud: attest.CloudAWS, Account: "189292791360", Location: "ap-southeast-2", AvailabilityZone: "ap-southeast-2a",
		ID: "i-0c5541936caf78c12", Type: "t4g.small", Image: "ami-0cbde744623b7506b",
		PrivateIP: "10.0.1.242", Created: pending, PrivateDNSName: "ip-10-0-1-242.ap-southeast-2.compute.internal",
	}
	if *claims.Instance != want {
		t.Fatalf("claims\n got %+v\nwant %+v", *claims.Instance, want)
	}

	// The same blob, one certificate off: us-east-1's does not verify it
	// even when configured for ap-southeast-2.
	other := aws.NewRegionCerts(map[string][]*x509.Certificate{"ap-southeast-2": certs.Certificates("us-east-1")})
	v2, err := aws.NewVerifier(aws.Options{Certs: other, Clock: func() time.Time { return pending }})
	if err != nil {
		t.Fatal(err)
	}
	_, err = v2.Verify(ctx, sess, &aws.Evidence{PKCS7: string(p7)})
	if reasonOf(err) != attest.ReasonDocRegionCert {
		t.Fatalf("real document against the wrong certificate: %v", err)
	}
}

// TestOptions: NewVerifier refuses what would weaken it.
func TestOptions(t *testing.T) {
	f := newFixture(t)
	for name, o := range map[string]aws.Options{
		"no clock":            {Certs: f.certs},
		"no certs":            {Clock: clock},
		"empty certs":         {Certs: aws.NewRegionCerts(nil), Clock: clock},
		"negative max age":    {Certs: f.certs, Clock: clock, MaxDocumentAge: -time.Second},
		"negative ttl":        {Certs: f.certs, Clock: clock, SessionTTL: -time.Second},
		"bad region name":     {Certs: aws.NewRegionCerts(map[string][]*x509.Certificate{"US-EAST-1": {f.useast1.Cert}}), Clock: clock},
		"region with no cert": {Certs: aws.NewRegionCerts(map[string][]*x509.Certificate{"us-east-1": nil}), Clock: clock},
	} {
		if _, err := aws.NewVerifier(o); err == nil {
			t.Errorf("%s: NewVerifier succeeded", name)
		}
	}
	v := f.verifier(nil)
	if _, _, err := v.Challenge("worker", []byte("short"), nil); reasonOf(err) != attest.ReasonMalformed {
		t.Errorf("Challenge with a short key hash: %v", err)
	}
}
