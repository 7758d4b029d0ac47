package walkthrough

import (
	"context"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm/swtpm"
	"github.com/nodeproof/nodeproof/internal/doctest"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
)

const root = "../.."

// The guide's blocks in the order the guide gives them; the tests below
// run them in that order (TestGuideOrder holds the two together).
var (
	directoryBlocks = []string{"dir-machine", "dir-policy", "dir-serve", "dir-enrol", "dir-life", "dir-admin", "dir-revoked"}
	clusterBlocks   = []string{"cluster-deploy", "cluster-policy", "cluster-ca", "cluster-serve", "cluster-approve", "cluster-enrol", "cluster-admin"}
)

// TestGuideOrder: the guide's named blocks are exactly the ones the tests
// run, in the guide's order, so a block added, dropped or moved in the
// guide fails here until the test runs it.
func TestGuideOrder(t *testing.T) {
	bs, err := doctest.Blocks(filepath.Join(root, Guide))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range bs {
		got = append(got, b.Name)
	}
	want := append(append([]string(nil), directoryBlocks...), clusterBlocks...)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("the guide's blocks %v; the tests run %v", got, want)
	}
}

// env is a work directory for the guide, with freshly built binaries and
// free ports in place of the guide's.
func env(t *testing.T) *Env {
	t.Helper()
	if err := swtpm.Check(); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"curl", "openssl", "base64"} {
		if _, err := osexec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (make deps installs it)", tool, err)
		}
	}
	bin := t.TempDir()
	if err := BuildBinaries(context.Background(), root, bin); err != nil {
		t.Fatal(err)
	}
	// kubectl, as the guide's reader has it.
	if err := os.Symlink(testenv.Kubectl(t), filepath.Join(bin, "kubectl")); err != nil {
		t.Fatal(err)
	}
	e, err := New(root, t.TempDir(), bin, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ports, err := FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	e.Subst = map[string]string{
		"22623": strconv.Itoa(ports[0]), "22624": strconv.Itoa(ports[0] + 1),
		"2321": strconv.Itoa(ports[1]), "2323": strconv.Itoa(ports[2]), "9090": strconv.Itoa(ports[3]),
	}
	t.Cleanup(func() {
		// The software TPMs run as daemons: stop any a failure left.
		for _, m := range []string{"worker-1", "worker-2"} {
			if p, err := swtpm.Attach(filepath.Join(e.Dir, "machines", m, "state")); err == nil {
				p.Stop()
			}
		}
	})
	return e
}

// testWriter logs what the blocks print.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// must runs block and requires each of want in its output.
func must(t *testing.T, e *Env, block string, want ...string) string {
	t.Helper()
	out, err := e.Run(context.Background(), block)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s: the output lacks %q", block, w)
		}
	}
	return out
}

// TestDirectoryMode runs the guide's directory mode: a software TPM booted
// from a real log, a policy learned from that log, the server, the
// machine's enrolment and first-boot files, a re-attestation, a refused one
// (Secure Boot off), inspect and a revocation while the server runs, and
// the revoked machine refused.
func TestDirectoryMode(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	must(t, e, "dir-machine", "EK SHA-256:", "--tpm tcp:127.0.0.1:"+e.Subst["2321"])
	must(t, e, "dir-policy", "policy.yaml: valid (1 pools; its trust files load as serve loads them)")
	ready := HTTPReady("http://127.0.0.1:" + e.Subst["22624"] + "/healthz")
	srv, err := e.Start(ctx, "dir-serve", ready)
	if err != nil {
		t.Fatal(err)
	}
	must(t, e, "dir-enrol", "attested: node worker-1, pool worker", "kubeconfig")
	out := must(t, e, "dir-life", "node worker-1 re-attested", "REFUSED", string(attest.ReasonPolicySecureBootOff), "refused: exit 3")
	if strings.Count(out, "REFUSED") != 1 {
		t.Errorf("dir-life: the clean boot's re-attestation was refused too")
	}
	// The admin commands reach the running server (its admin socket).
	must(t, e, "dir-admin", "reload:      no refusal stands", "records:     1 node bindings", "worker-1", "revoked")
	out = must(t, e, "dir-revoked", string(attest.ReasonRevoked), "refused: exit 3")
	srv.Stop()
	if strings.Contains(out, "RMA 4711") {
		t.Error("dir-revoked: the machine was told the operator's reason")
	}
}

// TestClusterMode runs the guide's cluster mode on a real API server with
// nothing installed: the kubernetes overlay, the examples and the keyring;
// a policy in an overlay of the reader's own; the server and the approver
// with the deployment's flags; a machine's enrolment, its kubelet's CSR
// approved; inspect, the binding's Events, a revocation and its refusal.
func TestClusterMode(t *testing.T) {
	e := env(t)
	ctx := context.Background()
	cp, err := clustertest.LaunchWith(t.TempDir(), clustertest.LaunchOptions{Bare: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Stop() })
	kubeconfig := filepath.Join(e.Dir, "admin.kubeconfig")
	if err := clustertest.WriteKubeconfig(cp.Config, kubeconfig, ""); err != nil {
		t.Fatal(err)
	}
	e.Vars = append(e.Vars, "KUBECONFIG="+kubeconfig)

	must(t, e, "cluster-deploy", "secret/nodeproof-keys created")
	must(t, e, "cluster-policy", "configmap/nodeproof-policy serverside-applied")
	must(t, e, "cluster-ca")
	srv, err := e.Start(ctx, "cluster-serve", HTTPReady("http://127.0.0.1:"+e.Subst["22624"]+"/healthz"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			if b, err := os.ReadFile(srv.Log); err == nil {
				t.Logf("--- the server's log ---\n%s", b)
			}
		}
	}()
	if _, err := e.Start(ctx, "cluster-approve", HTTPReady("http://127.0.0.1:"+e.Subst["9090"]+"/healthz")); err != nil {
		t.Fatal(err)
	}
	must(t, e, "cluster-enrol", "attested: node worker-2, pool worker", "condition met", "worker-2")
	out := must(t, e, "cluster-admin", "leader:      ", "replica:     ", "reload:      no refusal stands", "store:       kubernetes", "worker-2", string(attest.ReasonRevoked), "refused: exit 3")
	// kubectl describe lists the revocation's Event (it names the
	// binding's uid).
	_, describe, _ := strings.Cut(out, "$ kubectl -n nodeproof describe nodebinding worker-2")
	describe, agentOut, _ := strings.Cut(describe, "$ nodeproof-agent")
	if _, events, _ := strings.Cut(describe, "Events:"); !strings.Contains(events, "Revoked") {
		t.Errorf("kubectl describe nodebinding lists no Revoked Event:\n%s", describe)
	}
	if strings.Contains(agentOut, "RMA 4712") {
		t.Error("cluster-admin: the machine was told the operator's reason")
	}
}
