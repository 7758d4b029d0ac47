package liveboot_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/uefivar"
	"github.com/nodeproof/nodeproof/attest/uefivar/microsoft"
	"github.com/nodeproof/nodeproof/attest/uefivar/uefivartest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// revocation is TestLiveBoot's fleet-wide revocation, live (issue 41):
// the node is enrolled and passing (Debian's chain, OVMF's Microsoft
// variables, whose dbx holds one placeholder). A dbx update as published
// — an authenticated variable a lab KEK signs, revoking Debian's Secure
// Boot CA (the shim's vendor certificate, which verified GRUB and the
// kernel) and two image hashes of a real dbx — goes into the policy with
// `nodeproof policy revoke --require-dbx`; `policy check
// --against-records` says the node would be tainted; applied, the server
// re-judges the fleet and the running node is tainted without a reboot
// (BootSignerDenied, the Node's Attested condition False and its taint, a
// PolicyRejudged Event). Then the machine's firmware and boot chain are
// updated — its own Secure Boot keys and a real dbx holding the update's
// hashes (liveboot.SignerLab), GRUB and the kernel re-signed by the
// replacement key (the test db signer: ChainTestDBAll) — and it boots:
// its re-attestation passes every rule of the new policy and clears it.
// `nodeproof inspect secureboot-ca` shows the node's db moving from
// Microsoft's 2011 CAs alone to the 2011 and the 2023 ones (the lab's db
// CA standing in for a 2023 CA: trust.secureBootCAs). The policy is then
// put back, for the boots after.
func revocation(t *testing.T, ctx context.Context, w *world, g *liveboot.Guest, work string, say func(string, ...any),
	boot func(name, disk, vars string) *liveboot.Result, bootNumber int64) {
	t.Helper()
	lab, err := liveboot.LoadSignerLab(ctx, testenv.Cache(), say)
	if err != nil {
		t.Fatal(err)
	}
	shim, err := bootimage.ReadFile(lab.Current.Path(lab.Current.Shim))
	if err != nil {
		t.Fatal(err)
	}
	if len(shim.VendorCerts) != 1 {
		t.Fatalf("the shim carries %d vendor certificates; want Debian's one", len(shim.VendorCerts))
	}
	debianCA := shim.VendorCerts[0]
	real, err := liveboot.RealDBX()
	if err != nil {
		t.Fatal(err)
	}
	l, err := uefivar.ParseLists(real)
	if err != nil || len(l.SHA256) < 2 {
		t.Fatalf("the real dbx: %v", err)
	}
	update := uefivartest.NewKEK(t, "nodeproof lab KEK").Authenticated(t, time.Now(), append(
		uefivartest.List(uefivar.CertX509, debianCA.Raw), uefivartest.List(uefivar.CertSHA256, l.SHA256[0][:], l.SHA256[1][:])...))
	dir := t.TempDir()
	updateFile, revoked := filepath.Join(dir, "DBXUpdate.bin"), filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(updateFile, update, 0o600); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(w.policyFile)
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		out, err := exec.Command(w.bins.nodeproof, args...).CombinedOutput()
		return string(out), err
	}
	if out, err := run("policy", "revoke", "--pool", "worker", "--dbx-update", updateFile, "--require-dbx", "-o", revoked, w.policyFile); err != nil {
		t.Fatalf("policy revoke: %v\n%s", err, out)
	}
	// The lab's db CA stands in for a 2023 CA (the lab has no shim
	// Microsoft's 2023 CA signed): the policy counts it as one.
	withCA, err := os.ReadFile(revoked)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse(withCA)
	if err != nil {
		t.Fatal(err)
	}
	pol.Trust.SecureBootCAs = append(pol.Trust.SecureBootCAs, policy.SecureBootCA{Name: "the lab's db CA, standing in for a 2023 CA", Variable: "db", Year: 2023, SHA256: lab.Keys.DBCA.SHA256()})
	if withCA, err = policy.Marshal(pol); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(revoked, withCA, 0o600); err != nil {
		t.Fatal(err)
	}
	standing := func() microsoft.Transition {
		t.Helper()
		var v inspect.SecureBootCAs
		if err := json.Unmarshal([]byte(w.nodeproofCmd(t, "inspect", "secureboot-ca", "--policy", revoked, "-o", "json")), &v); err != nil {
			t.Fatal(err)
		}
		for _, n := range v.Nodes {
			if n.Name == node {
				return n.Transition
			}
		}
		t.Fatalf("inspect secureboot-ca does not list %s", node)
		return microsoft.Transition{}
	}
	before := standing()
	if before.DB != microsoft.Gen2011 {
		t.Errorf("before: the node's db stands at %q; want 2011 (OVMF's Microsoft variables)", before.DB)
	}
	out, err := run("policy", "check", revoked, "--against-records", "--store", "kubernetes", "--kubeconfig", w.admin, "--store-namespace", "nodeproof")
	if err == nil || !strings.Contains(out, "it would taint 1 nodes now") {
		t.Fatalf("policy check --against-records: %v; want it to say the node would be tainted (exit 1)\n%s", err, out)
	}
	say("revocation: the dbx update (Debian's CA and two hashes) in the policy; the dry run: %s", lastLine(out))
	b, err := os.ReadFile(revoked)
	if err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	w.putPolicy(t, b)
	defer w.putPolicy(t, orig)
	w.inspectUntil(t, node, 2*time.Minute, func(s *inspect.Story) string {
		switch a, reason, taint := nodeState(s); {
		case s.State != inspect.StateFailed || s.Reason != string(attest.ReasonPolicyBootSignerDenied):
			return "state Failed " + string(attest.ReasonPolicyBootSignerDenied) + " (re-judged), not " + s.State + " " + s.Reason
		case a != corev1.ConditionFalse || reason != string(attest.ReasonAttestationFailed) || taint != corev1.TaintEffectNoSchedule:
			return "the Node's Attested condition False (AttestationFailed) and the NoSchedule taint"
		case !hasEvent(s.Cluster.Events, "NodeBinding/"+node, string(attest.ReasonPolicyRejudged), ""):
			return "the server's " + string(attest.ReasonPolicyRejudged) + " Event"
		}
		return ""
	})
	say("revocation: the running node tainted %.1fs after the policy was applied, without a reboot", time.Since(applied).Seconds())

	disk, _, err := lab.BootDisk(ctx, liveboot.ChainTestDBAll, g, work)
	if err != nil {
		t.Fatal(err)
	}
	r := boot("revocation-updated-"+liveboot.ChainTestDBAll, disk, lab.Vars.Path)
	expectLines(t, r, "nodeproof-liveboot: secure-boot 1", "nodeproof-liveboot: agent reattest start",
		fmt.Sprintf("node %s re-attested (tpm evidence, boot %d seen by the server)", node, bootNumber), "nodeproof-liveboot: agent exit 0")
	w.inspectUntil(t, node, time.Minute, func(s *inspect.Story) string {
		switch a, _, taint := nodeState(s); {
		case s.State != inspect.StateAttested:
			return "state Attested, not " + s.State + " " + s.Reason
		case a != corev1.ConditionTrue || taint != "":
			return "the Node attested and untainted"
		}
		return ""
	})
	after := standing()
	if after.DB != microsoft.Both {
		t.Errorf("after: the node's db stands at %q; want 2011+2023 (Microsoft's and the lab's stand-in)", after.DB)
	}
	say("revocation: updated firmware dbx (%d entries) and a chain the replacement key signed: re-attested and cleared; the update's first hash %s…; inspect secureboot-ca: db %s → %s, KEK %s → %s, chain %s → %s",
		lab.Vars.DBXEntries, hex.EncodeToString(l.SHA256[0][:])[:12], before.DB, after.DB, before.KEK, after.KEK, before.Chain, after.Chain)
}

// lastLine is s's last non-empty line.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
