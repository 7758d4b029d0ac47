package policy_test

import (
	"crypto"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// learned is a real firmware log's machine, read by itself.
func learned(t *testing.T, log string) policy.Learned {
	t.Helper()
	bs, err := tpm.LogBootState(firmwaretestdata.MustLog(log), crypto.SHA256)
	if err != nil {
		t.Fatalf("%s: %v", log, err)
	}
	return policy.Learned{EKTrust: "ca:vendor", Bank: "sha256", Boot: bs, Root: &policy.EKRoot{Name: "vendor", Dir: "/etc/nodeproof/ek-roots/vendor"}, NodeNames: "requested"}
}

func claimsOf(l policy.Learned) *attest.Claims {
	return &attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{EKTrust: l.EKTrust, EKKind: attest.EKKindRSA2048, PCRBank: l.Bank, Boot: l.Boot}}
}

func mustParse(t *testing.T, doc []byte) *policy.Policy {
	t.Helper()
	p, err := policy.Parse(doc)
	if err != nil {
		t.Fatalf("learned policy does not parse: %v\n%s", err, doc)
	}
	return p
}

// TestLearn: a policy learned from one real machine admits it and refuses
// machines that booted otherwise; merging a second machine adds its boot
// chain's signers, and both are admitted; what cannot be learned is said.
// Signer rules by default (the log names Microsoft's UEFI CA for the
// shim, Canonical's CA for GRUB; the log establishes no kernel); digests on
// request.
func TestLearn(t *testing.T) {
	first, second := learned(t, "sb-cert-eventlog"), learned(t, "rhel8-uefi")
	const microsoft, canonical = "48e99b991f57fc52f76149599bff0a58c47154229b9f8d603ac40d3500248507", "ed1fe72cb9ca31c9af5b757afcd733323d675825032e6ced7fe1ae9eb767998c"
	doc, notes, err := policy.Learn(nil, "worker", first)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("learned:\n%s\nnotes: %q", doc, notes)
	p := mustParse(t, doc)
	tp := p.Pools["worker"].TPM
	c := tp.BootComponents
	if !tp.RequireSecureBoot || tp.MinimumDBX == nil || tp.MinimumDBX.Entries != first.Boot.DBXEntries ||
		!slices.Equal(c.Shim.SignedBy, []string{microsoft}) || !slices.Equal(c.Bootloader.SignedBy, []string{canonical}) ||
		!slices.Equal(c.Kernel.SignedBy, []string{canonical}) || len(c.Shim.Allow)+len(c.Bootloader.Allow)+len(c.Kernel.Allow) != 0 ||
		!tp.KernelCmdline.Any || !tp.Grub.Any {
		t.Errorf("learned tpm policy %+v; want Secure Boot, the machine's dbx count and its signers, no digests, any command line and GRUB (its partial log has none)", tp)
	}
	for _, want := range []string{"tpm.kernelCmdline: open", "tpm.grub: open", "tpm.minimumKernel: not set"} {
		if !strings.Contains(strings.Join(notes, "\n"), want) {
			t.Errorf("the notes do not say %q: %q", want, notes)
		}
	}
	withDigests := first
	withDigests.Digests = true
	dd, _, err := policy.Learn(nil, "worker", withDigests)
	if err != nil {
		t.Fatal(err)
	}
	if dc := mustParse(t, dd).Pools["worker"].TPM.BootComponents; !slices.Equal(dc.Shim.Allow, []string{first.Boot.BootApplications[0]}) || !slices.Equal(dc.Shim.SignedBy, []string{microsoft}) {
		t.Errorf("learned with digests: %+v; want the shim's digest and signer", dc)
	}
	if err := p.Evaluate("worker", claimsOf(first)); err != nil {
		t.Errorf("the learned machine is refused: %v", err)
	}
	cases := []struct {
		log  string
		want attest.Reason
	}{
		{"ubuntu-2104-no-secure-boot", attest.ReasonPolicySecureBootOff},
		{"rhel8-uefi", attest.ReasonPolicyBootSigner},
	}
	for _, c := range cases {
		err := p.Evaluate("worker", claimsOf(learned(t, c.log)))
		if r, _ := attest.ReasonOf(err); r != c.want {
			t.Errorf("%s under the policy learned from sb-cert-eventlog: %v; want %s", c.log, err, c.want)
		}
	}

	// Merge the second machine: both admitted.
	doc2, notes, err := policy.Learn(doc, "worker", second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("merged notes: %q", notes)
	p2 := mustParse(t, doc2)
	for name, l := range map[string]policy.Learned{"first": first, "second": second} {
		if err := p2.Evaluate("worker", claimsOf(l)); err != nil {
			t.Errorf("after the merge, the %s machine is refused: %v", name, err)
		}
	}
	if n := len(p2.Pools["worker"].TPM.BootComponents.Bootloader.SignedBy); n != 2 {
		t.Errorf("after the merge, %d boot loader signers allowed; want both machines'", n)
	}
	if len(p2.Trust.EKRoots) != 1 {
		t.Errorf("trust.ekRoots %+v: want the one root, once", p2.Trust.EKRoots)
	}
	// Merging again changes nothing.
	if doc3, _, err := policy.Learn(doc2, "worker", second); err != nil || string(doc3) != string(doc2) {
		t.Errorf("merging the same machine twice changed the policy (%v)", err)
	}
}

func TestLearnRefusals(t *testing.T) {
	sbOn, sbOff := learned(t, "rhel8-uefi"), learned(t, "ubuntu-2104-no-secure-boot")
	doc, _, err := policy.Learn(nil, "worker", sbOn)
	if err != nil {
		t.Fatal(err)
	}
	older := learned(t, "cos-85-amd-sev") // a dbx of 4 entries against rhel8's 186
	cases := []struct {
		name string
		doc  []byte
		l    policy.Learned
		pool string
		err  string // in the error; "" no error
		note string // in a note
	}{
		{"merge a machine that booted with Secure Boot off", doc, sbOff, "worker", "SecureBootDisabled", ""},
		{"merge a machine with an older dbx: kept, said", doc, older, "worker", "", "minimumDBX: kept"},
		{"a Secure Boot off machine alone: learned without requireSecureBoot, said", nil, sbOff, "worker", "", "requireSecureBoot: not set"},
		{"no pool", nil, sbOn, "", "pool name is required", ""},
		{"no EK trust", nil, policy.Learned{Bank: "sha256", Boot: sbOn.Boot, NodeNames: "requested"}, "worker", "EK trust", ""},
		{"bad bank", nil, policy.Learned{EKTrust: "ca:vendor", Bank: "md5", Boot: sbOn.Boot, NodeNames: "requested"}, "worker", "bank", ""},
		{"EK trust naming no root", nil, policy.Learned{EKTrust: "ca:other", Bank: "sha256", Boot: sbOn.Boot, NodeNames: "requested"}, "worker", `"ca:other"`, ""},
		{"names from the evidence of a CA-trusted EK", nil, with(sbOn, func(l *policy.Learned) { l.NodeNames = "evidence" }), "worker", "NodeNameNotEstablished", ""},
		{"unknown node names", nil, with(sbOn, func(l *policy.Learned) { l.NodeNames = "hostname" }), "worker", "want requested or evidence", ""},
		{"merge into a document that does not check", []byte("apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\npools:\n  worker:\n    tpm: {ekTrust: [ca:vendor], sha1: true}\n"), sbOn, "worker", "sha1", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, notes, err := policy.Learn(c.doc, c.pool, c.l)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v; want one with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(notes, "\n"), c.note) {
				t.Errorf("notes %q; want one with %q", notes, c.note)
			}
		})
	}
}

// TestLearnLiveBoots learns from the live boots' logs (internal/liveboot):
// with Secure Boot on, the shim, GRUB and kernel digests pin the Debian
// package files' Authenticode digests; with Secure Boot off (GRUB's
// linuxefi), the kernel is measured only into PCR 9, so the kernel stays
// any with a note that says why, and the pool does not require Secure Boot.
func TestLearnLiveBoots(t *testing.T) {
	on := learned(t, "debian-12-ovmf-secure-boot")
	doc, _, err := policy.Learn(nil, "worker", on)
	if err != nil {
		t.Fatal(err)
	}
	tp := mustParse(t, doc).Pools["worker"].TPM
	const microsoft, debian = "48e99b991f57fc52f76149599bff0a58c47154229b9f8d603ac40d3500248507", "079646974bce09b1f04da67bd722d1fb0947ae4c4010bccdbba52d5b23cbf1a2"
	if c := tp.BootComponents; !slices.Equal(c.Shim.SignedBy, []string{microsoft}) || !slices.Equal(c.Bootloader.SignedBy, []string{debian}) ||
		!slices.Equal(c.Kernel.SignedBy, []string{debian}) || !maps.Equal(tp.MinimumSBAT, map[string]int{"shim": 4, "grub": 5}) {
		t.Errorf("learned from the Secure Boot boot: %+v, SBAT %v; want Microsoft's CA for the shim, Debian's for GRUB and the kernel, SBAT shim 4, grub 5", tp.BootComponents, tp.MinimumSBAT)
	}
	on.Digests = true
	if doc, _, err = policy.Learn(nil, "worker", on); err != nil {
		t.Fatal(err)
	}
	tp = mustParse(t, doc).Pools["worker"].TPM
	apps := on.Boot.BootApplications
	if !tp.RequireSecureBoot || len(apps) != 4 || tp.BootComponents.Shim.Allow[0] != apps[0] ||
		tp.BootComponents.Bootloader.Allow[0] != apps[1] || len(tp.BootComponents.Kernel.Allow) != 1 || tp.BootComponents.Kernel.Allow[0] != apps[2] {
		t.Errorf("learned from the Secure Boot boot: %+v; want Secure Boot and its shim, GRUB and kernel (of %v)", tp, apps)
	}

	off := learned(t, "debian-12-ovmf-no-secure-boot")
	doc, notes, err := policy.Learn(nil, "worker", off)
	if err != nil {
		t.Fatal(err)
	}
	tp = mustParse(t, doc).Pools["worker"].TPM
	if tp.RequireSecureBoot || !tp.BootComponents.Kernel.Any || len(tp.BootComponents.Shim.Allow) != 1 {
		t.Errorf("learned from the Secure Boot off boot: %+v; want no Secure Boot, the shim pinned, the kernel any", tp)
	}
	explained := false
	for _, n := range notes {
		if strings.Contains(n, "bootComponents.kernel") && strings.Contains(n, "PCR 9") && strings.Contains(n, "Secure Boot") {
			explained = true
		}
	}
	if !explained {
		t.Errorf("the kernel measured only into PCR 9 is not explained: %q", notes)
	}
}

func with(l policy.Learned, f func(*policy.Learned)) policy.Learned {
	f(&l)
	return l
}

// TestLearnNodeNames: a learned policy names the machine it was learned
// from. A TPM trusted through a vendor CA names no node, so Learn asks
// (ErrNodeNamesUnset) unless told requested names, or the pool it merges
// into takes them already; an EK trusted through the inventory, which
// names nodes, needs nothing; what is chosen is written as
// serve.nodeNames.
func TestLearnNodeNames(t *testing.T) {
	ca := learned(t, "rhel8-uefi")
	unset := with(ca, func(l *policy.Learned) { l.NodeNames = "" })
	inventory := with(unset, func(l *policy.Learned) { l.EKTrust, l.Root, l.Inventory = "inventory", nil, "ek-inventory.yaml" })
	requestedDoc, _, err := policy.Learn(nil, "worker", ca)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		doc   []byte
		l     policy.Learned
		unset bool   // ErrNodeNamesUnset
		want  string // serve.nodeNames written
	}{
		{"CA trust, names not chosen: asked", nil, unset, true, ""},
		{"CA trust, requested names", nil, ca, false, "requested"},
		{"inventory trust, names not chosen: the inventory names nodes", nil, inventory, false, ""},
		{"inventory trust, evidence names", nil, with(inventory, func(l *policy.Learned) { l.NodeNames = "evidence" }), false, "evidence"},
		{"merged into a pool that takes requested names", requestedDoc, unset, false, "requested"},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc, _, err := policy.Learn(c.doc, "worker", c.l)
			if c.unset {
				if !errors.Is(err, policy.ErrNodeNamesUnset) || !strings.Contains(err.Error(), "serve.nodeNames") {
					t.Fatalf("error %v; want ErrNodeNamesUnset naming serve.nodeNames", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := mustParse(t, doc).ServeFor("worker").NodeNames; got != c.want {
				t.Errorf("serve.nodeNames %q, want %q\n%s", got, c.want, doc)
			}
		})
	}
}
