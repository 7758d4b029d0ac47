package ec2live_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/aws/ec2live"
	"github.com/nodeproof/nodeproof/internal/attacktable"
)

var (
	ctx = context.Background()
	// now is the verifier's clock in every test.
	now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
)

// region is the test us-east-1, generated once per test binary (RSA-2048
// key generation is the slow part).
var region = sync.OnceValues(func() (*awstest.Region, error) { return awstest.NewRegion("us-east-1") })

// verify runs Challenge and Verify of a verifier trusting the test
// us-east-1 and checking with live, on d signed by us-east-1.
func verify(t *testing.T, live aws.LiveChecker, d awstest.Document) (*attest.Claims, error) {
	t.Helper()
	r, err := region()
	if err != nil {
		t.Fatal(err)
	}
	v, err := aws.NewVerifier(aws.Options{
		Certs: aws.NewRegionCerts(map[string][]*x509.Certificate{"us-east-1": {r.Cert}}),
		Clock: func() time.Time { return now },
		Live:  live,
	})
	if err != nil {
		t.Fatal(err)
	}
	key := sha256.Sum256([]byte("kubelet key"))
	_, sess, err := v.Challenge("worker", key[:], &aws.ChallengeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	der, err := r.SignWith(d.JSON(), awstest.SignOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return v.Verify(ctx, sess, &aws.Evidence{Document: d.JSON(), PKCS7: awstest.Base64Lines(der)})
}

// doc is the document of every test: us-east-1, started five minutes ago.
func doc() awstest.Document { return awstest.NewDocument("us-east-1", now.Add(-5*time.Minute)) }

// TestVerifyWithLiveCheck: a running instance in an allowed VPC with the
// tags passes Verify with one signed DescribeInstances through the
// aws-sdk-go-v2 ec2 client, and takes the private DNS name EC2 reports.
func TestVerifyWithLiveCheck(t *testing.T) {
	d := doc()
	api := awstest.NewEC2(awstest.InstanceOf(d))
	defer api.Close()
	live := &ec2live.Checker{Client: api.Client("us-east-1"), VPCs: []string{"vpc-0", "vpc-1"}, Tags: map[string]string{"role": "worker"}}
	claims, err := verify(t, live, d)
	if err != nil {
		t.Fatal(err)
	}
	dns := d.InstanceID + ".ec2.internal"
	if !claims.Instance.LiveChecked || claims.Instance.PrivateDNSName != dns || claims.NodeName != dns ||
		!slices.Equal(claims.Addresses, []string{d.PrivateIP, dns}) {
		t.Fatalf("claims %+v, AWS %+v; want live-checked, named %s", claims, claims.Instance, dns)
	}
	if keys := api.AccessKeyIDs(); api.Calls() != 1 || !slices.Equal(keys, []string{"AKIDAWSTEST"}) {
		t.Fatalf("EC2 API called %d times, signed by %q; want once by the client's key", api.Calls(), keys)
	}
}

// TestLiveCheckAttacks: the EC2 API's refusals are InstanceNotRunning; an
// EC2 API that cannot be asked is an error that is not a Denial.
func TestLiveCheckAttacks(t *testing.T) {
	d := doc()
	with := func(mod func(*awstest.Instance)) awstest.Instance {
		in := awstest.InstanceOf(d)
		mod(&in)
		return in
	}
	closed := httptest.NewServer(nil)
	closed.Close()

	for _, tc := range []struct {
		name     string
		instance *awstest.Instance // nil: not known to EC2
		region   string            // of the EC2 client; "" means us-east-1
		down     bool
		url      string // overrides the fake's URL
		vpcs     []string
		tags     map[string]string
		want     attest.Reason // "" means: an error that is not a Denial
	}{
		{name: "stopped instance", instance: ptr(with(func(i *awstest.Instance) { i.State = "stopped" })), want: attest.ReasonInstanceNotLive},
		{name: "terminated instance", instance: ptr(with(func(i *awstest.Instance) { i.State = "terminated" })), want: attest.ReasonInstanceNotLive},
		{name: "pending instance", instance: ptr(with(func(i *awstest.Instance) { i.State = "pending" })), want: attest.ReasonInstanceNotLive},
		{name: "unknown instance", want: attest.ReasonInstanceNotLive},
		{name: "wrong VPC", instance: ptr(awstest.InstanceOf(d)), vpcs: []string{"vpc-2"}, want: attest.ReasonInstanceNotLive},
		{name: "instance outside any VPC", instance: ptr(with(func(i *awstest.Instance) { i.VPCID = "" })), vpcs: []string{"vpc-1"}, want: attest.ReasonInstanceNotLive},
		{name: "missing tag", instance: ptr(awstest.InstanceOf(d)), tags: map[string]string{"nodeproof/pool": "worker"}, want: attest.ReasonInstanceNotLive},
		{name: "wrong tag value", instance: ptr(awstest.InstanceOf(d)), tags: map[string]string{"role": "master"}, want: attest.ReasonInstanceNotLive},
		{name: "instance of another account", instance: ptr(with(func(i *awstest.Instance) { i.OwnerID = "999999999999" })), want: attest.ReasonInstanceNotLive},
		{name: "instance in another zone", instance: ptr(with(func(i *awstest.Instance) { i.AvailabilityZone = "us-east-1b" })), want: attest.ReasonInstanceNotLive},
		{name: "instance with another private IP", instance: ptr(with(func(i *awstest.Instance) { i.PrivateIP = "10.0.9.9" })), want: attest.ReasonInstanceNotLive},
		{name: "checker for another region", instance: ptr(awstest.InstanceOf(d)), region: "eu-west-1", want: attest.ReasonInstanceNotLive},
		{name: "EC2 API down (503)", instance: ptr(awstest.InstanceOf(d)), down: true},
		{name: "EC2 API unreachable", instance: ptr(awstest.InstanceOf(d)), url: closed.URL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := awstest.NewEC2()
			defer api.Close()
			if tc.instance != nil {
				api.Put(*tc.instance)
			}
			api.SetDown(tc.down)
			region := tc.region
			if region == "" {
				region = "us-east-1"
			}
			client := api.Client(region)
			if tc.url != "" {
				client = awstest.EC2Client(tc.url, region)
			}
			claims, err := verify(t, &ec2live.Checker{Client: client, VPCs: tc.vpcs, Tags: tc.tags}, d)
			if err == nil {
				t.Fatalf("accepted: %+v", claims.Instance)
			}
			got, isDenial := attest.ReasonOf(err)
			if tc.want == "" {
				if isDenial {
					t.Fatalf("EC2 failure became a denial %q: %v", got, err)
				}
				return
			}
			attacktable.CheckRefusal(t, "AWS live check", tc.name, tc.want, err)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestCheckerMisuse: a Checker without a client, or asked without claims,
// errs without asking EC2 and without refusing the node.
func TestCheckerMisuse(t *testing.T) {
	api := awstest.NewEC2()
	defer api.Close()
	claims := &attest.InstanceClaims{Cloud: attest.CloudAWS, Account: "123456789012", Location: "us-east-1", ID: "i-1234567890abcdef0"}
	for name, check := range map[string]func() (string, error){
		"nil Checker": func() (string, error) { return (*ec2live.Checker)(nil).Check(ctx, claims) },
		"no Client":   func() (string, error) { return (&ec2live.Checker{}).Check(ctx, claims) },
		"no claims":   func() (string, error) { return (&ec2live.Checker{Client: api.Client("us-east-1")}).Check(ctx, nil) },
	} {
		dns, err := check()
		if err == nil || dns != "" {
			t.Errorf("%s: got %q, %v; want an error", name, dns, err)
		}
		if _, isDenial := attest.ReasonOf(err); isDenial {
			t.Errorf("%s: a refusal: %v", name, err)
		}
	}
	if api.Calls() != 0 {
		t.Errorf("EC2 API called %d times", api.Calls())
	}
}

// TestNewClient: NewClient's client calls the endpoint it was given in its
// Region, signed with credentials from the SDK's default chain (here the
// environment, nothing else configured), and its region is the Checker's.
func TestNewClient(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "AKIDFROMENV", "AWS_SECRET_ACCESS_KEY": "env-secret", "AWS_SESSION_TOKEN": "",
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "no-credentials"), "AWS_CONFIG_FILE": filepath.Join(dir, "no-config"),
		"AWS_PROFILE": "", "AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "",
		"AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_EC2": "",
		"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:1",
	} {
		t.Setenv(k, v)
	}
	d := doc()
	api := awstest.NewEC2(awstest.InstanceOf(d))
	defer api.Close()
	client, err := ec2live.NewClient(ctx, "us-east-1", api.URL)
	if err != nil {
		t.Fatal(err)
	}
	if r := client.Options().Region; r != "us-east-1" {
		t.Fatalf("client region %q, want us-east-1 (the argument, not AWS_REGION)", r)
	}
	claims, err := verify(t, &ec2live.Checker{Client: client}, d)
	if err != nil {
		t.Fatal(err)
	}
	if !claims.Instance.LiveChecked {
		t.Fatalf("claims not live-checked: %+v", claims.Instance)
	}
	if keys := api.AccessKeyIDs(); len(keys) == 0 || slices.ContainsFunc(keys, func(k string) bool { return k != "AKIDFROMENV" }) {
		t.Fatalf("EC2 calls signed with %q, want the environment's key", keys)
	}
}

// TestNewClientMissingProfile: AWS_PROFILE naming a profile the shared
// files lack is NewClient's error, wrapped, not a client that would fail
// at the first live check.
func TestNewClientMissingProfile(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "config")
	if err := os.WriteFile(config, []byte("[profile other]\nregion = us-east-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_CONFIG_FILE", config)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "no-credentials"))
	t.Setenv("AWS_PROFILE", "nodeproof-missing")
	_, err := ec2live.NewClient(ctx, "us-east-1", "")
	var missing awsconfig.SharedConfigProfileNotExistError
	if !errors.As(err, &missing) || missing.Profile != "nodeproof-missing" {
		t.Fatalf("NewClient: %v; want the missing profile, wrapped", err)
	}
}
