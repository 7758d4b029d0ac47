package systemtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
	"github.com/nodeproof/nodeproof/internal/faultproxy"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/systemtest"
)

// server is `nodeproof serve` running in-process on loopback.
type server struct {
	url, plainURL string
	stateDir      string
	man           *swtpm.Manufacturer
	log           *testenv.LockedBuffer
	gce           *gcptest.Server // the GCE metadata server machines ask
	awsRegion     *awstest.Region // the test region whose certificate the server trusts
	inventoried   *swtpm.Machine  // a machine a test listed in the policy's inventory
}

func e2ePolicy(roots string) *policytest.Builder {
	return policytest.New().EKRoot(systemtest.VendorRoot, roots).
		Pool("worker", policytest.TPM("ca:"+systemtest.VendorRoot).SecureBoot().GCP().MaxInstanceAge(time.Hour).AWS().Requested()).
		Pool("master", policytest.Public().Private().Token())
}

// startServer runs Serve on the example bootstrap directory. before, if
// set, runs on the state directory first (to plant old certificates).
func startServer(t *testing.T, before func(stateDir string)) *server {
	t.Helper()
	return startServerWith(t, before, nil)
}

// startServerWith is startServer with the configuration edited by edit
// (when set) before Serve starts.
func startServerWith(t *testing.T, before func(stateDir string), edit func(*serve.Config)) *server {
	t.Helper()
	w := systemtest.New(t, "..", systemtest.Options{TPM: true, Cloud: true,
		Policy: func(w *systemtest.World) *policytest.Builder { return e2ePolicy(w.EKRoots) }})
	s := &server{stateDir: filepath.Join(t.TempDir(), "state"), log: new(testenv.LockedBuffer),
		man: w.Manufacturer, gce: w.GCE, awsRegion: w.Region}
	if before != nil {
		before(s.stateDir)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]net.Addr, 1)
	done := make(chan error, 1)
	cfg := serve.Config{
		SecurePort: 0, InsecurePort: 0, Listen: "127.0.0.1", TLSMinVersion: "VersionTLS12",
		ServerBasedir: w.Path("deploy/examples/bootstrap"), BootstrapKube: w.Path("deploy/examples/bootstrap-kubeconfig"),
		Policy: w.PolicyFile, StateDir: s.stateDir, Hosts: []string{"127.0.0.1"},
		TokenTTL: 10 * time.Minute, Grace: time.Hour, Reload: time.Second, Clock: time.Now,
		GCPAudienceURL: "https://mcs.nodeproof.test:22623", GCPJWKSURL: s.gce.JWKSURL(),
		AWSCertsDir: w.AWSCerts, AWSMaxDocumentAge: time.Hour,
		Log:   slog.New(slog.NewJSONHandler(s.log, nil)),
		Ready: func(a, b net.Addr) { ready <- [2]net.Addr{a, b} },
	}
	if edit != nil {
		edit(&cfg)
	}
	go func() { done <- serve.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	select {
	case a := <-ready:
		s.url = "https://" + a[0].String()
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("serve failed: %v\n%s", err, s.log)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start")
	}
	return s
}

// logged reports whether the server logged a request with status and
// reason.
func (s *server) logged(status int, reason string) bool {
	for _, line := range strings.Split(s.log.String(), "\n") {
		var l struct {
			Status int    `json:"status"`
			Reason string `json:"reason"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Status == status && l.Reason == reason {
			return true
		}
	}
	return false
}

// pointerFile runs `nodeproof pointer` and returns the file it wrote.
func (s *server) pointerFile(t *testing.T, args ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "pointer.ign")
	var stderr bytes.Buffer
	args = append([]string{"pointer", "--state-dir", s.stateDir, "--url", s.url, "--http-total", "15s", "-o", out}, args...)
	if code := cli.Run(context.Background(), args, io.Discard, &stderr); code != 0 {
		t.Fatalf("nodeproof %v: exit %d: %s", args, code, stderr.String())
	}
	return out
}

// ignitionFetch runs the real Ignition client's fetch stage with a pointer
// config and returns the config it cached, or its output on failure.
func ignitionFetch(t *testing.T, pointer string) (cached []byte, output string, err error) {
	t.Helper()
	return testenv.IgnitionFetch(t, pointer, "")
}

// cachedFiles maps the cached config's file paths to their sources.
func cachedFiles(t *testing.T, cached []byte) map[string]string {
	t.Helper()
	files, err := systemtest.ConfigFiles(cached)
	if err != nil {
		t.Fatalf("cached config: %v", err)
	}
	return files
}

// expectedFiles is what the server's renderer serves for pool and tier at
// spec 3.5 (what Ignition v2.24 asks for), as path → source.
func expectedFiles(t *testing.T, pool string, tier render.Tier, caBundle []byte) map[string]string {
	t.Helper()
	in, err := render.LoadBootstrapDir("../deploy/examples/bootstrap")
	if err != nil {
		t.Fatal(err)
	}
	kc, _ := os.ReadFile("../deploy/examples/bootstrap-kubeconfig")
	extra, err := render.CABundleExtra(caBundle)
	if err != nil {
		t.Fatal(err)
	}
	r, err := render.NewRenderer(in, render.Options{BootstrapKubeconfig: kc, PublicExtra: extra})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Config(pool, tier, render.V3_5)
	if err != nil {
		t.Fatal(err)
	}
	return cachedFiles(t, b)
}

func sameFiles(t *testing.T, got, want map[string]string) {
	t.Helper()
	for p, src := range want {
		if g, ok := got[p]; !ok {
			t.Errorf("Ignition's cache lacks %s", p)
		} else if g != src {
			t.Errorf("Ignition's cache has other contents for %s", p)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("Ignition's cache has an unexpected file %s", p)
		}
	}
}

func TestIgnitionFetchesEachTier(t *testing.T) {
	s := startServer(t, nil)
	bundle, err := os.ReadFile(filepath.Join(s.stateDir, "certs", "current", certs.CABundleFileName))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("public tier without credentials", func(t *testing.T) {
		cached, out, err := ignitionFetch(t, s.pointerFile(t, "--pool", "worker"))
		if err != nil {
			t.Fatalf("ignition: %v\n%s", err, out)
		}
		got := cachedFiles(t, cached)
		sameFiles(t, got, expectedFiles(t, "worker", render.TierPublic, bundle))
		for _, p := range render.ForbiddenPublicPaths() {
			if _, ok := got[p]; ok {
				t.Errorf("public tier delivered %s", p)
			}
		}
	})

	t.Run("token tier", func(t *testing.T) {
		cached, out, err := ignitionFetch(t, s.pointerFile(t, "--pool", "master", "--token"))
		if err != nil {
			t.Fatalf("ignition: %v\n%s", err, out)
		}
		got := cachedFiles(t, cached)
		sameFiles(t, got, expectedFiles(t, "master", render.TierFull, bundle))
		if _, ok := got[render.KubeconfigPath]; !ok {
			t.Error("full config without the kubeconfig")
		}
	})

	t.Run("token tier refuses a pointer without the token", func(t *testing.T) {
		start := time.Now()
		_, out, err := ignitionFetch(t, s.pointerFile(t, "--pool", "master"))
		if err == nil {
			t.Fatal("Ignition fetched the master config without a token")
		}
		if !s.logged(401, "CredentialsRequired") {
			t.Fatalf("the server did not refuse with 401 CredentialsRequired:\n%s", out)
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("a 4xx should fail at once, not be retried")
		}
	})

	t.Run("attested config token", func(t *testing.T) {
		m, err := s.man.NewMachine(context.Background(), t.TempDir(), firmwaretestdata.MustLog("rhel8-uefi"))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		c, err := agent.NewClient(s.url, bundle)
		if err != nil {
			t.Fatal(err)
		}
		vr, err := c.AttestTPM(context.Background(), "worker", "worker-1", m.Collector, m.KubeletDER)
		if err != nil {
			t.Fatalf("attest: %v", err)
		}
		tokFile := filepath.Join(t.TempDir(), "token")
		os.WriteFile(tokFile, []byte(vr.ConfigToken), 0o600)
		pointer := s.pointerFile(t, "--pool", "worker", "--token-file", tokFile)
		cached, out, err := ignitionFetch(t, pointer)
		if err != nil {
			t.Fatalf("ignition: %v\n%s", err, out)
		}
		got := cachedFiles(t, cached)
		sameFiles(t, got, expectedFiles(t, "worker", render.TierFull, bundle))
		// The token was spent: a second fetch with it is refused.
		if _, out, err := ignitionFetch(t, pointer); err == nil || !s.logged(403, "TokenAlreadyUsed") {
			t.Fatalf("a spent config token fetched again, or was refused for another reason: %v\n%s", err, out)
		}
		if strings.Contains(s.log.String(), vr.ConfigToken) {
			t.Fatal("the config token was logged")
		}
	})
}

// TestIgnitionWithGCPIdentity: a GCE machine attests with an identity
// token its metadata server minted for the challenge's audience, and
// Ignition fetches the full config with the config token; the node name is
// the instance's, whatever the machine asked for.
func TestIgnitionWithGCPIdentity(t *testing.T) {
	s := startServer(t, nil)
	bundle, err := os.ReadFile(filepath.Join(s.stateDir, "certs", "current", certs.CABundleFileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("GCE_METADATA_HOST", s.gce.Host())
	c, err := agent.NewClient(s.url, bundle)
	if err != nil {
		t.Fatal(err)
	}
	kubelet, err := agent.KubeletKey(filepath.Join(t.TempDir(), "kubelet.key"))
	if err != nil {
		t.Fatal(err)
	}
	vr, err := agent.GCPEvidence{}.Attest(context.Background(), c, "worker", "asked-for-name", kubelet)
	if err != nil {
		t.Fatalf("attest: %v\n%s", err, s.log)
	}
	if vr.NodeName != s.gce.Instance().InstanceName {
		t.Fatalf("node name %q, want the instance name %q", vr.NodeName, s.gce.Instance().InstanceName)
	}
	tokFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokFile, []byte(vr.ConfigToken), 0o600)
	cached, out, err := ignitionFetch(t, s.pointerFile(t, "--pool", "worker", "--token-file", tokFile))
	if err != nil {
		t.Fatalf("ignition: %v\n%s", err, out)
	}
	sameFiles(t, cachedFiles(t, cached), expectedFiles(t, "worker", render.TierFull, bundle))

	// A project the pool does not allow is refused with its reason.
	inst := s.gce.Instance()
	inst.ProjectID = "someone-else"
	s.gce.SetInstance(inst)
	_, err = agent.GCPEvidence{}.Attest(context.Background(), c, "worker", "", kubelet)
	var refused *agent.Refused
	if !errors.As(err, &refused) || refused.Refusal.Reason != attest.ReasonPolicyProject {
		t.Fatalf("another project: %v", err)
	}
}

// TestIgnitionWithAWSIdentity: an EC2 instance attests with its identity
// document (IMDSv2), Ignition fetches the full config, and the same
// instance cannot enrol a second time (trust on first use).
func TestIgnitionWithAWSIdentity(t *testing.T) {
	s := startServer(t, nil)
	bundle, err := os.ReadFile(filepath.Join(s.stateDir, "certs", "current", certs.CABundleFileName))
	if err != nil {
		t.Fatal(err)
	}
	files, err := s.awsRegion.Files(awstest.NewDocument("us-east-1", time.Now().Add(-5*time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	imds := awstest.NewIMDS(files)
	defer imds.Close()
	c, err := agent.NewClient(s.url, bundle)
	if err != nil {
		t.Fatal(err)
	}
	kubelet, err := agent.KubeletKey(filepath.Join(t.TempDir(), "kubelet.key"))
	if err != nil {
		t.Fatal(err)
	}
	ev := agent.AWSEvidence{IMDS: imds.Client()}
	vr, err := ev.Attest(context.Background(), c, "worker", "asked-for-name", kubelet)
	if err != nil {
		t.Fatalf("attest: %v\n%s", err, s.log)
	}
	if vr.NodeName != "ip-10-0-1-2.ec2.internal" {
		t.Fatalf("node name %q, want the instance's private DNS name", vr.NodeName)
	}
	tokFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokFile, []byte(vr.ConfigToken), 0o600)
	cached, out, err := ignitionFetch(t, s.pointerFile(t, "--pool", "worker", "--token-file", tokFile))
	if err != nil {
		t.Fatalf("ignition: %v\n%s", err, out)
	}
	sameFiles(t, cachedFiles(t, cached), expectedFiles(t, "worker", render.TierFull, bundle))

	// The document again (a stolen copy, or the same machine): refused.
	_, err = ev.Attest(context.Background(), c, "worker", "", kubelet)
	var refused *agent.Refused
	if !errors.As(err, &refused) || refused.Refusal.Reason != attest.ReasonIdentityEnrolled {
		t.Fatalf("second enrolment: %v", err)
	}
}

// TestIgnitionAcrossCARotation: a pointer config written while the old CA
// was current still fetches after the server rotated its CA.
func TestIgnitionAcrossCARotation(t *testing.T) {
	var oldBundle []byte
	s := startServer(t, func(stateDir string) {
		// Certificates made 8.1 years ago: past 80% of the CA's life, so
		// the server rotates them when it starts.
		then := time.Now().Add(-time.Duration(8.1 * 365.25 * 24 * float64(time.Hour)))
		st, err := certs.Ensure(filepath.Join(stateDir, "certs"), certs.Options{Clock: func() time.Time { return then }, Hosts: []string{"127.0.0.1"}})
		if err != nil {
			t.Fatal(err)
		}
		oldBundle = st.CABundlePEM
	})
	st, err := certs.Ensure(filepath.Join(s.stateDir, "certs"), certs.Options{Clock: time.Now, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.CABundle) != 2 || bytes.Equal(st.CABundlePEM, oldBundle) {
		t.Fatalf("the server did not rotate its CA at start (%d CAs)", len(st.CABundle))
	}
	bundleFile := filepath.Join(t.TempDir(), "old-bundle.pem")
	os.WriteFile(bundleFile, oldBundle, 0o600)
	oldPointer := s.pointerFile(t, "--pool", "worker", "--ca-bundle", bundleFile)
	for _, p := range []string{oldPointer, s.pointerFile(t, "--pool", "worker")} {
		if _, out, err := ignitionFetch(t, p); err != nil {
			t.Fatalf("ignition with a pointer config: %v\n%s", err, out)
		}
	}
}

// TestIgnitionAfterACutDelivery: pointer mode (the agent in the
// initramfs) when the connection drops in the middle of the full config —
// the start of the secrets already sent, so its config token is spent. The
// agent finds the token spent, attests again (proving the kubelet key its
// enrolment bound) for a new one, fetches the config whole and hands it to
// the real Ignition, which applies it; the spent token stays refused.
func TestIgnitionAfterACutDelivery(t *testing.T) {
	s := startServer(t, nil)
	bundle, err := os.ReadFile(filepath.Join(s.stateDir, "certs", "current", certs.CABundleFileName))
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.man.NewMachine(context.Background(), t.TempDir(), firmwaretestdata.MustLog("rhel8-uefi"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	proxy := faultproxy.New(t, strings.TrimPrefix(s.url, "https://"))
	// The challenge and verify exchanges and the TLS handshake pass; the
	// cut lands inside the config (about 45 KB).
	proxy.CutAfter(24 << 10)
	sysDir := t.TempDir()
	var console bytes.Buffer
	err = agent.Run(context.Background(), agent.Config{
		Server: "https://" + proxy.Addr(), CABundle: bundle, Pool: "worker", NodeName: "worker-cut",
		Evidence: agent.TPMEvidence{Collector: m.Collector}, KubeletKeyPath: filepath.Join(t.TempDir(), "kubelet.key"),
		Mode: agent.ModePointer, IgnitionDir: sysDir, Console: &console,
	})
	if err != nil {
		t.Fatalf("agent: %v\n%s\n%s", err, console.String(), s.log)
	}
	if !strings.Contains(console.String(), "attesting again") || !s.logged(http.StatusForbidden, string(attest.ReasonTokenUsed)) {
		t.Fatalf("the cut delivery's token was not refused and the node did not attest again:\n%s", console.String())
	}
	cached, out, err := testenv.IgnitionFetch(t, s.pointerFile(t, "--pool", "worker"), sysDir)
	if err != nil {
		t.Fatalf("ignition: %v\n%s", err, out)
	}
	got := cachedFiles(t, cached)
	if _, ok := got[render.KubeconfigPath]; !ok {
		t.Fatalf("Ignition did not get the full config: %v", got)
	}
	if fi, err := os.Stat(filepath.Join(sysDir, agent.UserConfigName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("user config %v %v: it holds secrets", fi, err)
	}
}
