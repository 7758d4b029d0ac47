package systemtest_test

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/store/boltstore"
	"github.com/nodeproof/nodeproof/systemtest"
)

// awsSetup is what an AWS test's servers share: a test Region whose
// certificate is the only one in --aws-certs-dir, a policy whose pool
// "worker" takes AWS evidence only, and a state directory.
type awsSetup struct {
	region   *awstest.Region
	certsDir string
	policy   string
	stateDir string
}

// awsPool is the AWS requirements most tests here use: the fake's
// account, in us-east-1, the EC2 live check required if live.
func awsPool(live bool, nodeName string) func(*policy.AWSPolicy) {
	return func(a *policy.AWSPolicy) {
		a.Accounts, a.Regions, a.RequireLiveCheck, a.NodeName = []string{policytest.AWSAccount}, []string{"us-east-1"}, live, nodeName
	}
}

// newAWSSetup writes the certificate and a policy whose pool worker takes
// AWS evidence as poolAWS requires (nil: the caller writes the policy).
func newAWSSetup(t *testing.T, poolAWS func(*policy.AWSPolicy)) *awsSetup {
	t.Helper()
	dir := t.TempDir()
	s := &awsSetup{certsDir: filepath.Join(dir, "aws-certs"), policy: filepath.Join(dir, "policy.yaml"), stateDir: filepath.Join(dir, "state")}
	var err error
	if s.region, err = awstest.NewRegion("us-east-1"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(s.certsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.certsDir, "us-east-1.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.region.Cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	if poolAWS != nil {
		worker := policytest.Public().Edit(func(p *policy.Pool) {
			p.Evidence = []attest.Kind{attest.KindAWS}
			poolAWS(&p.AWS)
		})
		s.policy = writePolicy(t, dir, policytest.New().Pool("worker", worker))
	}
	return s
}

// directoryMode are serve's flags for the example MCO bootstrap directory
// (the embedded store).
var directoryMode = []string{"--server-basedir", "../deploy/examples/bootstrap", "--bootstrap-kubeconfig", "../deploy/examples/bootstrap-kubeconfig"}

// cmdServer is `nodeproof serve` run through Run, with flags, in process.
type cmdServer struct {
	url    string
	bundle []byte
	log    *testenv.LockedBuffer
	stop   func() // stops it and checks it exited cleanly; idempotent
}

// serve runs `nodeproof serve` with the setup's policy, certificates and
// state directory, the mode flags and extra flags, on a free loopback
// port; it stops when the test ends, or at stop.
func (s *awsSetup) serve(t *testing.T, mode []string, extra ...string) *cmdServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	args := append([]string{"serve",
		"--listen", "127.0.0.1", "--secure-port", strconv.Itoa(port), "--insecure-port", "0", "--hosts", "127.0.0.1",
		"--policy", s.policy, "--state-dir", s.stateDir, "--aws-certs-dir", s.certsDir, "--reload-interval", "1s",
	}, mode...)
	args = append(args, extra...)
	srv := &cmdServer{url: fmt.Sprintf("https://127.0.0.1:%d", port), log: new(testenv.LockedBuffer)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- cli.Run(ctx, args, io.Discard, srv.log) }()
	var once sync.Once
	srv.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case code := <-done:
				if code != 0 {
					t.Errorf("nodeproof serve exited %d:\n%s", code, srv.log)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("nodeproof serve did not stop")
			}
		})
	}
	t.Cleanup(srv.stop)
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(srv.log.String(), `"msg":"serving"`) {
		select {
		case code := <-done:
			done <- code // for stop
			t.Fatalf("nodeproof serve exited %d:\n%s", code, srv.log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodeproof serve did not start:\n%s", srv.log)
		}
	}
	if srv.bundle, err = os.ReadFile(filepath.Join(s.stateDir, "certs", "current", certs.CABundleFileName)); err != nil {
		t.Fatal(err)
	}
	return srv
}

// attest runs the agent's AWS attestation against the server with the
// document md serves.
func (srv *cmdServer) attest(t *testing.T, md *awstest.IMDS) (*api.VerifyResponse, error) {
	t.Helper()
	c, err := agent.NewClient(srv.url, srv.bundle)
	if err != nil {
		t.Fatal(err)
	}
	kubelet, err := agent.KubeletKey(filepath.Join(t.TempDir(), "kubelet.key"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return agent.AWSEvidence{IMDS: md.Client()}.Attest(ctx, c, "worker", "asked-for-name", kubelet)
}

// mustAttest is attest that must succeed.
func (srv *cmdServer) mustAttest(t *testing.T, md *awstest.IMDS, step string) *api.VerifyResponse {
	t.Helper()
	vr, err := srv.attest(t, md)
	if err != nil {
		t.Fatalf("%s: %v\n%s", step, err, srv.log)
	}
	return vr
}

// wantRefused fails the test unless err is the server's final refusal
// (403) with reason.
func wantRefused(t *testing.T, step string, err error, reason attest.Reason) {
	t.Helper()
	var refused *agent.Refused
	if !errors.As(err, &refused) || refused.Status != http.StatusForbidden || refused.Refusal.Reason != reason {
		t.Fatalf("%s: %v; want 403 %s", step, err, reason)
	}
}

// instanceFiles signs d with the setup's Region, as IMDS serves it.
func (s *awsSetup) instanceFiles(t *testing.T, d awstest.Document) awstest.Files {
	t.Helper()
	f, err := s.region.Files(d)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestAWSReenrolment runs the re-enrolment cycle of a reinstalled EC2
// instance through `nodeproof serve` and `nodeproof enroll --reset NODE`
// (the same as `nodeproof release NODE`), with the embedded store (the
// server stopped for the reset) and the Kubernetes store (a real API
// server; the reset while the server runs):
//   - a document swapped beside a valid signature is DocumentSubstituted,
//     and writes nothing (the instance then enrols);
//   - the same document again (the reinstalled instance, a new kubelet
//     key) is IdentityAlreadyEnrolled, and so is a new document of the
//     same instance (stopped and started: a new pendingTime);
//   - after `enroll --reset NODE` the instance enrols again, with a new
//     record, once: a further attempt is IdentityAlreadyEnrolled;
//   - a document older than the age window is DocumentTooOld; the
//     instance stopped and started (a new document, a new pendingTime)
//     enrols.
func TestAWSReenrolment(t *testing.T) {
	for _, tc := range []struct {
		name string
		// start returns serve's mode flags and enroll's store flags.
		start func(t *testing.T, s *awsSetup) (mode, enroll []string)
		// resetWhileServing: the store allows enroll --reset beside a
		// running server (otherwise the server is stopped and started).
		resetWhileServing bool
	}{
		{"embedded store", func(t *testing.T, s *awsSetup) ([]string, []string) {
			return directoryMode, []string{"--state-dir", s.stateDir}
		}, false},
		{"kubernetes store", func(t *testing.T, s *awsSetup) ([]string, []string) {
			w := systemtest.New(t, "..", systemtest.Options{Cluster: true, NoExamples: true})
			cfg, kubeconfig, tokenDir := w.Config, w.Admin, w.TokenDir
			return []string{"--kubeconfig", kubeconfig, "--apiserver-url", cfg.Host, "--bootstrap-token-dir", tokenDir, "--cert-store=state-dir", "--token-store=file",
					"--store", "kubernetes", "--store-namespace", "nodeproof"},
				[]string{"--store", "kubernetes", "--kubeconfig", kubeconfig, "--store-namespace", "nodeproof"}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newAWSSetup(t, awsPool(false, ""))
			mode, storeFlags := tc.start(t, s)
			srv := s.serve(t, mode)
			reset := func(key string) {
				t.Helper()
				if !tc.resetWhileServing {
					srv.stop()
				}
				var stdout, stderr bytes.Buffer
				if code := cli.Run(context.Background(), append(append([]string{"enroll"}, storeFlags...), "--reset", key), &stdout, &stderr); code != 0 {
					t.Fatalf("nodeproof enroll --reset %s: exit %d: %s", key, code, stderr.String())
				}
				if !tc.resetWhileServing {
					srv = s.serve(t, mode)
				}
			}

			d := awstest.NewDocument("us-east-1", time.Now().Add(-10*time.Minute))
			genuine := s.instanceFiles(t, d)
			md := awstest.NewIMDS(genuine)
			defer md.Close()

			// Another instance's document beside this one's signature.
			swapped := genuine
			other := d
			other.InstanceID, other.PrivateIP = "i-0fedcba9876543210", "10.0.9.9"
			swapped.Document = other.JSON()
			md.SetFiles(swapped)
			_, err := srv.attest(t, md)
			wantRefused(t, "swapped document", err, attest.ReasonDocSubstituted)

			md.SetFiles(genuine)
			first := srv.mustAttest(t, md, "first enrolment")
			if first.NodeName != "ip-10-0-1-2.ec2.internal" {
				t.Fatalf("node name %q, want the private DNS name", first.NodeName)
			}
			_, err = srv.attest(t, md)
			wantRefused(t, "reinstalled, same document", err, attest.ReasonIdentityEnrolled)

			// Stopped and started: EC2 signs a new document with a new
			// pendingTime, but the instance's marker still lives.
			d.PendingTime = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
			md.SetFiles(s.instanceFiles(t, d))
			_, err = srv.attest(t, md)
			wantRefused(t, "stopped and started", err, attest.ReasonIdentityEnrolled)

			reset(first.NodeName)
			again := srv.mustAttest(t, md, "after enroll --reset")
			if again.Record == first.Record || again.NodeName != first.NodeName {
				t.Fatalf("re-enrolment: record %s node %s; first: record %s node %s", again.Record, again.NodeName, first.Record, first.NodeName)
			}
			_, err = srv.attest(t, md)
			wantRefused(t, "again after the re-enrolment", err, attest.ReasonIdentityEnrolled)

			// Reinstalled after the window: the document is too old, and
			// --reset cannot change that.
			late := awstest.NewDocument("us-east-1", time.Now().Add(-2*time.Hour))
			late.InstanceID, late.PrivateIP = "i-0aaaaaaaaaaaaaaa1", "10.0.1.3"
			md.SetFiles(s.instanceFiles(t, late))
			_, err = srv.attest(t, md)
			wantRefused(t, "document past the age window", err, attest.ReasonDocTooOld)
			// Stopped and started: a new pendingTime, and it enrols.
			late.PendingTime = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
			md.SetFiles(s.instanceFiles(t, late))
			if vr := srv.mustAttest(t, md, "stopped and started after the window"); vr.NodeName != "ip-10-0-1-3.ec2.internal" {
				t.Fatalf("node name %q", vr.NodeName)
			}
		})
	}
}

// TestAWSNodeNamePolicy: the pool's aws.nodeName decides the node name an
// attested instance gets, in the verify response and in its record; the
// default is the private DNS name; the name the machine asked for is
// never used.
func TestAWSNodeNamePolicy(t *testing.T) {
	d := awstest.NewDocument("us-east-1", time.Now().Add(-5*time.Minute))
	for _, tc := range []struct {
		name     string
		nodeName string
		want     string
	}{
		{"default", "", "ip-10-0-1-2.ec2.internal"},
		{"privateDNSName", policy.AWSNodeNamePrivateDNS, "ip-10-0-1-2.ec2.internal"},
		{"instanceID", policy.AWSNodeNameInstanceID, d.InstanceID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newAWSSetup(t, func(a *policy.AWSPolicy) {
				a.Accounts, a.AnyRegion, a.NodeName = []string{policytest.AWSAccount}, true, tc.nodeName
			})
			srv := s.serve(t, directoryMode)
			md := awstest.NewIMDS(s.instanceFiles(t, d))
			defer md.Close()
			vr := srv.mustAttest(t, md, "attest")
			if vr.NodeName != tc.want {
				t.Fatalf("verify response names node %q, want %q", vr.NodeName, tc.want)
			}
			srv.stop() // the embedded store is the server's while it runs
			st, err := boltstore.Open(filepath.Join(s.stateDir, "state.db"), time.Second, time.Now)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			rec, err := st.GetRecord(context.Background(), vr.Record)
			if err != nil {
				t.Fatal(err)
			}
			if rec.NodeName != tc.want || rec.Identity != "aws:"+d.AccountID+"/"+d.Region+"/"+d.InstanceID {
				t.Fatalf("record names node %q, identity %q; want %q", rec.NodeName, rec.Identity, tc.want)
			}
		})
	}
}

// TestAWSLiveCheckFlags runs `nodeproof serve --aws-live-check-region
// --aws-ec2-endpoint --aws-live-check-vpcs --aws-live-check-tags` against
// the loopback EC2 API, with credentials from a shared credentials file
// only (the SDK's default chain; nothing in the environment): a running
// instance in an allowed VPC with the tags attests, and takes the private
// DNS name EC2 reports; one in another VPC, without a tag, with another
// tag value, stopped, or unknown to EC2 is refused with
// InstanceNotRunning. Every EC2 call was signed with the file's key.
func TestAWSLiveCheckFlags(t *testing.T) {
	dir := t.TempDir()
	credsFile := filepath.Join(dir, "credentials")
	if err := os.WriteFile(credsFile, []byte("[default]\naws_access_key_id = AKIDSHAREDFILE\naws_secret_access_key = shared-file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"AWS_SHARED_CREDENTIALS_FILE": credsFile,
		"AWS_CONFIG_FILE":             filepath.Join(dir, "no-config"),
		"AWS_ACCESS_KEY_ID":           "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "",
		"AWS_PROFILE": "", "AWS_ROLE_ARN": "", "AWS_WEB_IDENTITY_TOKEN_FILE": "",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "",
		"AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_EC2": "",
		// The instance role, last in the chain, would be asked here (and
		// fail at once) if the file were not used.
		"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:1",
	} {
		t.Setenv(k, v)
	}

	type instance struct {
		name  string
		id    string
		edit  func(*awstest.Instance) // nil: running, vpc-good, the tags
		known bool
		want  attest.Reason // "": attests
	}
	cases := []instance{
		{"running in an allowed VPC with the tags", "i-00000000000000a01", nil, true, ""},
		{"another VPC", "i-00000000000000a02", func(in *awstest.Instance) { in.VPCID = "vpc-other" }, true, attest.ReasonInstanceNotLive},
		{"tag missing", "i-00000000000000a03", func(in *awstest.Instance) { delete(in.Tags, "role") }, true, attest.ReasonInstanceNotLive},
		{"tag with another value", "i-00000000000000a04", func(in *awstest.Instance) { in.Tags["role"] = "master" }, true, attest.ReasonInstanceNotLive},
		{"stopped", "i-00000000000000a05", func(in *awstest.Instance) { in.State = "stopped" }, true, attest.ReasonInstanceNotLive},
		{"unknown to EC2", "i-00000000000000a06", nil, false, attest.ReasonInstanceNotLive},
	}
	ec2 := awstest.NewEC2()
	defer ec2.Close()
	docs := map[string]awstest.Document{}
	for i, c := range cases {
		d := awstest.NewDocument("us-east-1", time.Now().Add(-5*time.Minute))
		d.InstanceID, d.PrivateIP = c.id, fmt.Sprintf("10.0.2.%d", i+1)
		docs[c.id] = d
		if !c.known {
			continue
		}
		in := awstest.InstanceOf(d)
		in.VPCID = "vpc-good"
		if c.edit != nil {
			c.edit(&in)
		}
		ec2.Put(in)
	}

	s := newAWSSetup(t, awsPool(true, ""))
	srv := s.serve(t, directoryMode,
		"--aws-live-check-region", "us-east-1", "--aws-ec2-endpoint", ec2.URL,
		"--aws-live-check-vpcs", "vpc-other-allowed,vpc-good",
		"--aws-live-check-tags", "role=worker,kubernetes.io/cluster/demo=owned")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			md := awstest.NewIMDS(s.instanceFiles(t, docs[c.id]))
			defer md.Close()
			vr, err := srv.attest(t, md)
			if c.want != "" {
				wantRefused(t, c.name, err, c.want)
				return
			}
			if err != nil {
				t.Fatalf("attest: %v\n%s", err, srv.log)
			}
			if vr.NodeName != c.id+".ec2.internal" {
				t.Fatalf("node name %q, want the private DNS name EC2 reports", vr.NodeName)
			}
		})
	}
	keys := ec2.AccessKeyIDs()
	if len(keys) < len(cases) || slices.ContainsFunc(keys, func(k string) bool { return k != "AKIDSHAREDFILE" }) {
		t.Fatalf("EC2 calls signed with %q; want each of the %d instances checked with the shared file's key", keys, len(cases))
	}
}
