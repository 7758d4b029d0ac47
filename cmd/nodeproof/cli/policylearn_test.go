package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/cmd/nodeproof-agent/agentcli"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// TestPolicyLearn: a known-good machine's log, dumped by the agent,
// becomes a pool policy that checks; a second machine's log merges in;
// bad invocations say what is wrong.
func TestPolicyLearn(t *testing.T) {
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, serve.StoreFile), time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	logFile := func(name string) string {
		p := filepath.Join(dir, name+".bin")
		if err := os.WriteFile(p, firmwaretestdata.MustLog(name), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), args, &out, &errb)
		return out.String(), errb.String(), code
	}

	dump := filepath.Join(dir, "evidence.json")
	var aout, aerr bytes.Buffer
	if code := agentcli.Main(context.Background(), []string{"--dump-evidence", dump, "--event-log", logFile("sb-cert-eventlog")}, &aout, &aerr); code != 0 {
		t.Fatalf("nodeproof-agent --dump-evidence: exit %d: %s", code, aerr.String())
	}
	pol := filepath.Join(dir, "policy.yaml")
	// A vendor-CA EK names no node: learn asks how names are established.
	if _, errs, code := run("policy", "learn", "--pool", "worker", "--evidence", dump, "--ek-root", "vendor="+testRoots(t), "-o", pol); code != 1 || !strings.Contains(errs, "--node-names requested") {
		t.Fatalf("policy learn without --node-names for a CA-trusted EK: exit %d: %s; want it to ask for --node-names", code, errs)
	}
	if _, err := os.Stat(pol); err == nil {
		t.Fatal("a refused learn wrote the policy")
	}
	if _, errs, code := run("policy", "learn", "--pool", "worker", "--evidence", dump, "--ek-root", "vendor="+testRoots(t), "--node-names", "requested", "-o", pol); code != 0 {
		t.Fatalf("policy learn: exit %d: %s", code, errs)
	} else if !strings.Contains(errs, "kernelCmdline: any: true") || !strings.Contains(errs, "grub: open") {
		t.Errorf("what the log does not establish (its partial log has no GRUB measurements) is not said: %s", errs)
	}
	if out, errs, code := run("policy", "check", pol); code != 0 || !strings.Contains(out, "valid (1 pools; its trust files load") {
		t.Fatalf("policy check of the learned policy: exit %d: %s%s", code, out, errs)
	}
	// A wrong ek-root directory: learn says it does not load; check
	// refuses as serve would (the document alone with --document-only).
	wrong := filepath.Join(dir, "wrong.yaml")
	if _, errs, code := run("policy", "learn", "--pool", "worker", "--evidence", dump, "--ek-root", "vendor="+dir, "--node-names", "requested", "-o", wrong); code != 0 || !strings.Contains(errs, "does not load here") {
		t.Errorf("policy learn with a directory of no CAs: exit %d: %s; want a note that it does not load", code, errs)
	}
	if out, errs, code := run("policy", "check", wrong); code == 0 || !strings.Contains(errs, "serve would refuse it") {
		t.Errorf("policy check of a policy whose ek-root does not load: exit %d: %s%s; want refused as serve refuses it", code, out, errs)
	}
	if out, errs, code := run("policy", "check", "--document-only", wrong); code != 0 || !strings.Contains(out, "the document only") {
		t.Errorf("policy check --document-only: exit %d: %s%s", code, out, errs)
	}
	merged, errs, code := run("policy", "learn", "--pool", "worker", "--event-log", logFile("rhel8-uefi"), "--ek-trust", "ca:vendor", "--merge", pol)
	if code != 0 {
		t.Fatalf("policy learn --merge: exit %d: %s", code, errs)
	}
	p, err := policy.Parse([]byte(merged))
	if err != nil {
		t.Fatalf("merged policy: %v\n%s", err, merged)
	}
	if got := p.ServeFor("worker").NodeNames; got != "requested" {
		t.Errorf("merged: serve.nodeNames %q, want the learned pool's requested", got)
	}
	if n := len(p.Pools["worker"].TPM.BootComponents.Bootloader.SignedBy); n != 2 {
		t.Errorf("merged: %d boot loader signers allowed, want both machines' (Canonical's and Red Hat's CA)", n)
	}

	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no source", []string{"--pool", "worker"}, "exactly one of --event-log, --evidence, --node"},
		{"two sources", []string{"--pool", "worker", "--event-log", logFile("rhel8-uefi"), "--evidence", dump}, "exactly one of"},
		{"no pool", []string{"--event-log", logFile("rhel8-uefi")}, "--pool"},
		{"bad ek-root", []string{"--pool", "worker", "--event-log", logFile("rhel8-uefi"), "--ek-root", "vendor"}, "want NAME=DIR"},
		{"bad node names", []string{"--pool", "worker", "--event-log", logFile("rhel8-uefi"), "--ek-root", "v=/x", "--node-names", "hostname"}, "want requested or evidence"},
		{"no EK trust for a new policy", []string{"--pool", "worker", "--event-log", logFile("rhel8-uefi")}, "EK trust"},
		{"not an event log", []string{"--pool", "worker", "--event-log", pol, "--ek-root", "v=/x"}, "EventLogMalformed"},
		{"not a dump", []string{"--pool", "worker", "--evidence", pol, "--ek-root", "v=/x"}, "not a nodeproof-agent --dump-evidence file"},
		{"a node never re-attested", []string{"--pool", "worker", "--node", "worker-9", "--state-dir", dir}, "node worker-9"},
		{"merge a Secure Boot off machine", []string{"--pool", "worker", "--event-log", logFile("ubuntu-2104-no-secure-boot"), "--ek-trust", "ca:vendor", "--merge", pol}, "SecureBootDisabled"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errs, code := run(append([]string{"policy", "learn"}, c.args...)...)
			if code == 0 || !strings.Contains(errs, c.want) {
				t.Errorf("exit %d, %q; want a refusal with %q", code, errs, c.want)
			}
		})
	}
}

// TestPolicyLearnEKRootDir: `policy learn -o DIR/p.yaml --ek-root
// N=DIR/roots`, DIR relative to the working directory as an operator types
// it, writes a dir: that serve (policy.Load, relative to the policy file)
// resolves to that same directory; on standard output, where the file will
// go is unknown, so the dir is absolute.
func TestPolicyLearnEKRootDir(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	if err := os.MkdirAll(filepath.Join("e2e", "ekroots"), 0o755); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(work, "log.bin")
	if err := os.WriteFile(log, firmwaretestdata.MustLog("rhel8-uefi"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(work, "e2e", "ekroots")
	for _, c := range []struct {
		name, ekRoot, out string
	}{
		{"relative, beside the policy", "swtpm=e2e/ekroots", "e2e/policy.yaml"},
		{"relative, the policy elsewhere", "swtpm=e2e/ekroots", "policies/worker/policy.yaml"},
		{"absolute", "swtpm=" + want, "e2e/abs.yaml"},
		{"standard output", "swtpm=e2e/ekroots", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := []string{"policy", "learn", "--pool", "worker", "--event-log", log, "--ek-root", c.ekRoot, "--node-names", "requested"}
			file := c.out
			if file != "" {
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					t.Fatal(err)
				}
				args = append(args, "-o", file)
			}
			if code := Run(context.Background(), args, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			if file == "" {
				file = filepath.Join(t.TempDir(), "saved.yaml")
				if err := os.WriteFile(file, out.Bytes(), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			p, err := policy.Load(file)
			if err != nil {
				t.Fatal(err)
			}
			got, err := filepath.Abs(p.Trust.EKRoots[0].Dir)
			if err != nil || got != want {
				t.Errorf("serve reads the EK roots from %s; want %s", got, want)
			}
		})
	}
}

// testRoots is a directory of a test vendor's EK CAs, as an ekRoots entry
// names one (serve and policy check load it).
func testRoots(t *testing.T) string {
	t.Helper()
	ca, err := tpmtest.NewVendorCA("Vendor", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "ek-roots")
	if err := ca.WriteRoots(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}
