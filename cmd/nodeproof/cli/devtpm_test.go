package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/attest/tpm/swtpm"
	"github.com/nodeproof/nodeproof/internal/walkthrough"
)

// TestDevTPM: `nodeproof dev tpm` makes a machine an operator can attest
// without TPM hardware. init provisions a TPM whose EK certificate chains
// to the local CA it prints and whose EK hash it writes; start runs it as
// a daemon (it outlives the command) with a real firmware log extended into
// its PCRs, so the verifier accepts its quote and replays the log to the
// boot state that log records; reboot boots it into another state (Secure
// Boot off, the reset count up); stop ends it.
func TestDevTPM(t *testing.T) {
	if err := swtpm.Check(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	root := t.TempDir()
	m1 := filepath.Join(root, "machines", "worker-1")
	run := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := Run(ctx, append([]string{"dev", "tpm"}, args...), &stdout, &stderr); code != 0 {
			t.Fatalf("nodeproof dev tpm %v: exit %d\n%s%s", args, code, stdout.String(), stderr.String())
		}
		return stdout.String()
	}
	logs := filepath.Join(root, "logs")
	os.MkdirAll(logs, 0o755)
	for _, name := range []string{"rhel8-uefi", "ubuntu-2104-no-secure-boot"} {
		b, err := os.ReadFile(filepath.Join("../../../firmware-testdata/logs", name+".bin"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(logs, name+".bin"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	out := run("init", "--dir", m1)
	roots := filepath.Join(root, "machines", "ek-ca", "roots")
	if !strings.Contains(out, "EK roots:  "+roots) {
		t.Fatalf("init does not name the EK roots beside the machine (%s):\n%s", roots, out)
	}
	ekHash, err := os.ReadFile(filepath.Join(m1, devTPMEKHash))
	if err != nil {
		t.Fatal(err)
	}
	if code := Run(ctx, []string{"dev", "tpm", "init", "--dir", m1}, new(bytes.Buffer), new(bytes.Buffer)); code == 0 {
		t.Error("init over an existing TPM succeeded: it would be a new machine under an old name")
	}

	ports, err := walkthrough.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	port := ports[0]
	out = run("start", "--dir", m1, "--port", strconv.Itoa(port), "--event-log", filepath.Join(logs, "rhel8-uefi.bin"))
	t.Cleanup(func() { Run(ctx, []string{"dev", "tpm", "stop", "--dir", m1}, new(bytes.Buffer), new(bytes.Buffer)) })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if !strings.Contains(out, "--tpm tcp:"+addr+" --event-log "+filepath.Join(m1, devTPMLog)) {
		t.Fatalf("start does not print the agent's flags:\n%s", out)
	}

	set, err := tpm.LoadRootSet("dev", roots)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tpm.NewVerifier(tpm.Options{Roots: []tpm.RootSet{set}, Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	// attestOnce is what the agent does with the flags start printed.
	attestOnce := func() *attest.Claims {
		t.Helper()
		log, err := os.ReadFile(filepath.Join(m1, devTPMLog))
		if err != nil {
			t.Fatal(err)
		}
		ch, err := tpm.DialSocket("tcp", addr, log)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tpm.NewCollector(ch)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		req, err := c.Request()
		if err != nil {
			t.Fatal(err)
		}
		key := sha256.Sum256([]byte("kubelet key"))
		challenge, sess, err := v.Challenge("worker", key[:], req)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := c.Answer(challenge, key[:])
		if err != nil {
			t.Fatal(err)
		}
		claims, err := v.Verify(sess, ev)
		if err != nil {
			t.Fatalf("the verifier refuses the dev TPM's evidence: %v", err)
		}
		return claims
	}
	claims := attestOnce()
	if claims.Identity != "tpm-ek:"+strings.TrimSpace(string(ekHash)) {
		t.Errorf("identity %s; init wrote EK hash %s", claims.Identity, ekHash)
	}
	if claims.TPM.EKTrust != "ca:dev" || !claims.TPM.Boot.SecureBootKnown || !claims.TPM.Boot.SecureBoot {
		t.Errorf("claims after booting rhel8-uefi: trust %s, Secure Boot known %v on %v", claims.TPM.EKTrust, claims.TPM.Boot.SecureBootKnown, claims.TPM.Boot.SecureBoot)
	}
	if _, err := swtpm.Attach(filepath.Join(m1, devTPMState)); err != nil {
		t.Fatalf("the daemon did not outlive the command: %v", err)
	}

	run("reboot", "--dir", m1, "--event-log", filepath.Join(logs, "ubuntu-2104-no-secure-boot.bin"))
	again := attestOnce()
	if again.Identity != claims.Identity || !again.TPM.Boot.SecureBootKnown || again.TPM.Boot.SecureBoot {
		t.Errorf("after a reboot into ubuntu-2104-no-secure-boot: identity %s (was %s), Secure Boot known %v on %v",
			again.Identity, claims.Identity, again.TPM.Boot.SecureBootKnown, again.TPM.Boot.SecureBoot)
	}
	if again.TPM.ResetCount <= claims.TPM.ResetCount {
		t.Errorf("reset count %d after a reboot, %d before", again.TPM.ResetCount, claims.TPM.ResetCount)
	}

	run("stop", "--dir", m1)
	if _, err := swtpm.Attach(filepath.Join(m1, devTPMState)); err == nil {
		t.Error("the daemon still runs after stop")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the TPM port still answers after stop")
	}
	// start again: the same machine boots once more.
	run("start", "--dir", m1, "--port", strconv.Itoa(port), "--event-log", filepath.Join(logs, "rhel8-uefi.bin"))
	if c := attestOnce(); c.Identity != claims.Identity {
		t.Errorf("after stop and start: identity %s, want %s", c.Identity, claims.Identity)
	}
}
