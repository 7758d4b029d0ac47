package liveboot_test

import (
	"context"
	"crypto"
	"encoding/hex"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/systemtest"
)

// signerRules is TestLiveBoot's boot of kernel B (liveboot.ChainDebianPrevious:
// Debian's previous kernel, another image signed with the same key, after
// the same shim and GRUB, on the signer lab's store). The server's policy
// pins kernel A's digest with the kernel's rule in audit mode: kernel B is
// admitted, and the binding's status and a PolicyAuditRefusal Event say
// the kernel's digest rule would have refused it. Then, without another
// boot, the logs already captured are judged: a policy learned from
// kernel A's boot (first: policy.Learn, signer rules by default) admits
// kernel B's and refuses kernel C's (testDB: kernel A re-signed by the
// test db key, where the log leaves the kernel's signer one of Debian's
// CA and the test db CA: BootSignerAmbiguous); the digest policy without
// audit refuses kernel B (BootComponentNotAllowed).
func signerRules(t *testing.T, ctx context.Context, w *world, g *liveboot.Guest, work string, dg digests, say func(string, ...any),
	boot func(name, disk, vars string) *liveboot.Result, bootNumber int64, first, testDB *liveboot.Result) *liveboot.Result {
	t.Helper()
	lab, err := liveboot.LoadSignerLab(ctx, testenv.Cache(), say)
	if err != nil {
		t.Fatal(err)
	}
	disk, chain, err := lab.BootDisk(ctx, liveboot.ChainDebianPrevious, g, work)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := bootimage.ReadFile(chain.Path(chain.Kernel))
	if err != nil {
		t.Fatal(err)
	}
	kernelB := hex.EncodeToString(kb.AuthenticodeSHA256)
	if kernelB == dg.kernel {
		t.Fatalf("kernel B's digest is kernel A's (%s): not another kernel", kernelB)
	}

	r := boot("signers-"+liveboot.ChainDebianPrevious, disk, lab.Vars.Path)
	expectLines(t, r, "nodeproof-liveboot: secure-boot 1", "nodeproof-liveboot: agent reattest start",
		fmt.Sprintf("node %s re-attested (tpm evidence, boot %d seen by the server)", node, bootNumber), "nodeproof-liveboot: agent exit 0")
	wantAudit := policy.RuleBootComponents + ".kernel: " + string(attest.ReasonPolicyBootNotAllowed) + ": "
	w.inspectUntil(t, node, 30*time.Second, func(s *inspect.Story) string {
		switch {
		case s.Binding == nil || s.Binding.Status.Boots != bootNumber:
			return fmt.Sprintf("the binding counting boot %d", bootNumber)
		case !s.Binding.Status.Passed || !strings.HasPrefix(s.Binding.Status.Audit, wantAudit):
			return fmt.Sprintf("the binding passed with the audit %q, not %v %q", wantAudit, s.Binding.Status.Passed, s.Binding.Status.Audit)
		case !hasEvent(s.Cluster.Events, "NodeBinding/"+node, string(attest.ReasonPolicyAudit), kernelB):
			return "the server's PolicyAuditRefusal Event naming kernel B"
		}
		return ""
	})

	// The captured logs, judged by policies offline.
	claims := func(name string, r *liveboot.Result) *attest.Claims {
		raw, ok := r.EventLog()
		if !ok {
			t.Fatalf("%s: no event log", name)
		}
		b, err := tpm.LogBootState(raw, crypto.SHA256)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return &attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{EKTrust: "ca:" + systemtest.VendorRoot, EKKind: attest.EKKindRSA2048, PCRBank: "sha256", Boot: b}}
	}
	a, b, c := claims("kernel A", first), claims("kernel B", r), claims("kernel C", testDB)
	if k := b.TPM.Boot.Kernels(); len(k) == 0 || k[0] != kernelB {
		t.Errorf("kernel B's boot measured kernels %v; the file's digest is %s", k, kernelB)
	}
	doc, notes, err := policy.Learn(nil, "worker", policy.Learned{EKTrust: "ca:" + systemtest.VendorRoot, Bank: "sha256", Boot: a.TPM.Boot,
		Root: &policy.EKRoot{Name: systemtest.VendorRoot, Dir: w.roots}, NodeNames: "requested"})
	if err != nil {
		t.Fatal(err)
	}
	signers, err := policy.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	if k := signers.Pools["worker"].TPM.BootComponents.Kernel; len(k.SignedBy) != 1 || len(k.Allow) != 0 {
		t.Errorf("learned from kernel A's boot: kernel rule %+v; want its one signer, no digest (notes %q)", k, notes)
	}
	// The learned policy judges the whole boot: kernel B's file (PCR 9)
	// is not kernel A's. Its signer rules alone (grub and the command line
	// opened) admit every kernel Debian signed.
	whole := signers
	signers = withAfterKernelOpen(signers, "worker")
	digestPolicy, err := livePolicy(dg, false)(&systemtest.World{EKRoots: w.roots}).Policy()
	if err != nil {
		t.Fatal(err)
	}
	auditPolicy, err := livePolicy(dg, true)(&systemtest.World{EKRoots: w.roots}).Policy()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		pol    *policy.Policy
		claims *attest.Claims
		want   attest.Reason
	}{
		{"the policy learned from kernel A: kernel A", whole, a, ""},
		{"the policy learned from kernel A: kernel B, the same key, another file GRUB read", whole, b, attest.ReasonPolicyGrubFile},
		{"signer rules learned from kernel A: kernel A", signers, a, ""},
		{"signer rules learned from kernel A: kernel B, the same key", signers, b, ""},
		{"signer rules learned from kernel A: kernel C, another key", signers, c, attest.ReasonBootSignerAmbiguous},
		{"digest rules: kernel B", digestPolicy, b, attest.ReasonPolicyBootNotAllowed},
		{"digest rules: kernel C, the same code re-signed", digestPolicy, c, ""},
		{"digest rules, the kernel's in audit mode: kernel B", auditPolicy, b, ""},
	} {
		err := tc.pol.Evaluate("worker", tc.claims)
		if got, _ := attest.ReasonOf(err); got != tc.want {
			t.Errorf("%s: %v; want %q", tc.name, err, tc.want)
		}
	}
	say("signer rules: kernel B %.12s… admitted by the kernel's rule in audit mode (binding and Event), by the signer rules learned from kernel A; kernel C refused; took %.1fs",
		kernelB, r.Took.Seconds())
	return r
}

// withAfterKernelOpen is pol with pool's command line and GRUB rules
// opened: its stage rules alone.
func withAfterKernelOpen(pol *policy.Policy, pool string) *policy.Policy {
	cp := *pol
	cp.Pools = maps.Clone(pol.Pools)
	pp := cp.Pools[pool]
	pp.TPM.KernelCmdline, pp.TPM.Grub = &policy.KernelCmdline{Any: true}, &policy.GrubRules{Any: true}
	cp.Pools[pool] = pp
	return &cp
}
