package cli

import (
	"bytes"
	"context"
	"crypto"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// TestPolicyCheckAgainstRecords: every enrolled node is judged by the new
// policy from its last recorded claims; a node without claims (enrolled,
// not re-attested) is reported NOT JUDGED, never counted as passing; the
// command exits 1 when any node would fail, 0 otherwise.
func TestPolicyCheckAgainstRecords(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pol, err := policytest.New().Pool("worker", policytest.TPM().SecureBoot()).Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	claims := func(secureBoot bool) []byte {
		c := attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{PCRBank: "sha256", EKTrust: "ca:vendor", EKKind: attest.EKKindRSA2048}}
		c.TPM.Boot.SecureBootKnown, c.TPM.Boot.SecureBoot = true, secureBoot
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// name: claims recorded (nil: none)
	nodes := map[string][]byte{"worker-pass": claims(true), "worker-fail": claims(false), "worker-new": nil}
	st, err := boltstore.Open(filepath.Join(dir, "state.db"), time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for node, cl := range nodes {
		id := "ek:" + node
		r := &store.Record{ID: "rec-" + node, NodeName: node, Pool: "worker", Kind: attest.KindTPM, Identity: id,
			KubeletKeySHA256: make([]byte, 32), CreatedAt: now, Expires: now.Add(time.Hour)}
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		if cl == nil {
			continue
		}
		if _, err := st.UpdateStatus(ctx, node, id, func(b *store.Binding) error {
			b.Status.LastAttempt, b.Status.Passed, b.Status.Claims = now, true, cl
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()

	check := func() (int, string) {
		var stdout, stderr bytes.Buffer
		code := Run(ctx, []string{"policy", "check", pol, "--against-records", "--state-dir", dir}, &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}
	code, out := check()
	for _, want := range []string{
		"worker-fail  worker  tpm   FAIL " + string(attest.ReasonPolicySecureBootOff),
		"worker-new   worker  tpm   " + verdictNotJudged,
		"worker-pass  worker  tpm   " + verdictPass,
		"1 of 3 nodes would fail at their next re-attestation; 1 could not be judged",
		// worker-fail passes today (its last attempt did): applying the
		// policy re-judges it (mcs/rejudge), and taints it.
		"applied, it would taint 1 nodes now",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if code != 1 {
		t.Errorf("a node would fail: exit %d, want 1\n%s", code, out)
	}

	// The failing node released: nothing would fail, one is not judged.
	var stdout, stderr bytes.Buffer
	if c := Run(ctx, []string{"release", "worker-fail", "--state-dir", dir}, &stdout, &stderr); c != 0 {
		t.Fatalf("release: %s", stderr.String())
	}
	code, out = check()
	if code != 0 || !strings.Contains(out, "0 of 2 nodes would fail at their next re-attestation; 1 could not be judged") {
		t.Errorf("no node would fail: exit %d, want 0\n%s", code, out)
	}
}

// TestPolicyCheckSignerAndDigestRules: --against-records judges each node
// by the pool's digest rules alone and its signer rules alone beside the
// policy's verdict, on claims read from real logs: Debian 12's boot (its
// kernel's digest listed, signed by Debian's CA), the same boot with a
// new kernel Debian signed (the digest rule refuses it, the signer rule
// passes it), RHEL 8's (both refuse); with the kernel's rule in audit
// mode the new kernel passes, saying what the audit found.
func TestPolicyCheckSignerAndDigestRules(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	read := func(log string) attest.Claims {
		bs, err := tpm.LogBootState(firmwaretestdata.MustLog(log), crypto.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		return attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{PCRBank: "sha256", EKTrust: "ca:vendor", EKKind: attest.EKKindRSA2048, Boot: bs}}
	}
	debian, rhel := read("debian-12-ovmf-secure-boot"), read("rhel8-uefi")
	kernelA := debian.TPM.Boot.Kernels()[0]
	kernelB := strings.Repeat("b", 64)
	newKernel := read("debian-12-ovmf-secure-boot")
	b := &newKernel.TPM.Boot
	for i, a := range b.BootApplications {
		if a == kernelA {
			b.BootApplications[i] = kernelB
		}
	}
	const debianCA = "079646974bce09b1f04da67bd722d1fb0947ae4c4010bccdbba52d5b23cbf1a2"
	doc := func(audit string) string {
		return `apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
pools:
  worker:
    evidence: [tpm]
    tpm:
      anyEKTrust: true
      bootComponents:
        shim: {any: true}
        bootloader: {signedBy: [` + debianCA + `]}
        kernel: {allow: [` + kernelA + `], signedBy: [` + debianCA + `]}
      kernelCmdline: {any: true}
      grub: {any: true}
` + audit
	}
	st, err := boltstore.Open(filepath.Join(dir, "state.db"), time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for node, cl := range map[string]attest.Claims{"worker-a": debian, "worker-b": newKernel, "worker-rhel": rhel} {
		id := "ek:" + node
		r := &store.Record{ID: "rec-" + node, NodeName: node, Pool: "worker", Kind: attest.KindTPM, Identity: id,
			KubeletKeySHA256: make([]byte, 32), CreatedAt: now, Expires: now.Add(time.Hour)}
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		raw, err := json.Marshal(cl)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.UpdateStatus(ctx, node, id, func(b *store.Binding) error {
			b.Status.LastAttempt, b.Status.Passed, b.Status.Claims = now, true, raw
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	for _, c := range []struct {
		name  string
		audit string
		code  int
		want  []string
	}{
		{"digest and signer rules", "", 1, []string{
			"worker-a     worker  tpm   pass                               pass          pass",
			"worker-b     worker  tpm   FAIL BootComponentNotAllowed       FAIL BootComponentNotAllowed  pass",
			"worker-rhel  worker  tpm   FAIL BootSignerNotAllowed          FAIL BootComponentNotAllowed  FAIL BootSignerNotAllowed",
		}},
		{"the kernel's rule in audit mode", "      audit: [bootComponents.kernel]\n", 1, []string{
			"worker-b     worker  tpm   pass (audit)",
			"in audit mode: bootComponents.kernel: BootComponentNotAllowed",
			"worker-rhel  worker  tpm   FAIL BootSignerNotAllowed",
			"1 of 3 nodes would fail", // the audited one passes
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			pol := filepath.Join(dir, "policy.yaml")
			if err := os.WriteFile(pol, []byte(doc(c.audit)), 0o600); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			code := Run(ctx, []string{"policy", "check", pol, "--against-records", "--state-dir", dir}, &stdout, &stderr)
			out := stdout.String() + stderr.String()
			for _, w := range c.want {
				if !strings.Contains(collapse(out), collapse(w)) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if code != c.code {
				t.Errorf("exit %d, want %d\n%s", code, c.code, out)
			}
		})
	}
}

// collapse is s with every run of spaces one space (tabwriter's columns).
func collapse(s string) string { return strings.Join(strings.Fields(s), " ") }
