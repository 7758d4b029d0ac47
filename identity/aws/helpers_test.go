package aws_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
)

// now is the verifier's clock in every test.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func clock() time.Time { return now }

// regions are generated once per test binary: RSA-2048 key generation is
// the slow part of these tests.
var (
	regionsOnce sync.Once
	regions     struct {
		useast1, euwest1, attacker, impersonator *awstest.Region
	}
	regionsErr error
)

func testRegions(t testing.TB) (useast1, euwest1, attacker, impersonator *awstest.Region) {
	t.Helper()
	regionsOnce.Do(func() {
		r := &regions
		if r.useast1, regionsErr = awstest.NewRegion("us-east-1"); regionsErr != nil {
			return
		}
		if r.euwest1, regionsErr = awstest.NewRegion("eu-west-1"); regionsErr != nil {
			return
		}
		// The attacker has its own key and certificate, with AWS's subject.
		if r.attacker, regionsErr = awstest.NewRegion("us-east-1"); regionsErr != nil {
			return
		}
		// The impersonator's certificate copies us-east-1's issuer and
		// serial number, so the PKCS#7 names the real signer.
		r.impersonator, regionsErr = awstest.NewRegionWith("us-east-1", awstest.RegionOptions{
			Subject: r.useast1.Cert.Subject, Serial: r.useast1.Cert.SerialNumber,
		})
	})
	if regionsErr != nil {
		t.Fatal(regionsErr)
	}
	return regions.useast1, regions.euwest1, regions.attacker, regions.impersonator
}

// fixture is a verifier trusting the test us-east-1 and eu-west-1.
type fixture struct {
	t        testing.TB
	useast1  *awstest.Region
	euwest1  *awstest.Region
	attacker *awstest.Region
	imperson *awstest.Region
	certs    *aws.RegionCerts
	keyHash  []byte
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	u, e, a, i := testRegions(t)
	h := sha256.Sum256([]byte("kubelet key"))
	return &fixture{
		t: t, useast1: u, euwest1: e, attacker: a, imperson: i, keyHash: h[:],
		certs: aws.NewRegionCerts(map[string][]*x509.Certificate{
			"us-east-1": {u.Cert},
			"eu-west-1": {e.Cert},
		}),
	}
}

func (f *fixture) verifier(mod func(*aws.Options)) *aws.Verifier {
	f.t.Helper()
	o := aws.Options{Certs: f.certs, Clock: clock}
	if mod != nil {
		mod(&o)
	}
	v, err := aws.NewVerifier(o)
	if err != nil {
		f.t.Fatal(err)
	}
	return v
}

func (f *fixture) session(v *aws.Verifier) *attest.Session {
	f.t.Helper()
	_, sess, err := v.Challenge("worker", f.keyHash, &aws.ChallengeRequest{})
	if err != nil {
		f.t.Fatal(err)
	}
	return sess
}

// doc is the default document: us-east-1, started five minutes ago.
func doc() awstest.Document {
	return awstest.NewDocument("us-east-1", now.Add(-5*time.Minute))
}

// evidence signs d with r as AWS would and returns what Collect would.
func (f *fixture) evidence(r *awstest.Region, d awstest.Document, o awstest.SignOptions) *aws.Evidence {
	f.t.Helper()
	der, err := r.SignWith(d.JSON(), o)
	if err != nil {
		f.t.Fatal(err)
	}
	return &aws.Evidence{Document: d.JSON(), PKCS7: awstest.Base64Lines(der)}
}

func reasonOf(err error) attest.Reason {
	r, _ := attest.ReasonOf(err)
	return r
}

var ctx = context.Background()
