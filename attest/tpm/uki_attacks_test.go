package tpm_test

import (
	"bytes"
	"context"
	"crypto"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
)

// stubEvent is an event as systemd-stub logs a PCR 11 measurement: its
// description (UTF-16, with NUL) as data, its digests measured being of
// measured (a section's name with its NUL, or its content), in the
// algorithms of the log's own events (algsOf).
func stubEvent(pcr uint32, description string, measured []byte, algs []uint16) rawEvent {
	var data []byte
	for _, u := range utf16.Encode([]rune(description + "\x00")) {
		data = append(data, byte(u), byte(u>>8))
	}
	e := rawEvent{pcr: pcr, typ: evIPL, data: data}
	for _, a := range algs {
		e.digests = append(e.digests, algDigest{a, hashOf(a, measured)})
	}
	return e
}

// section is systemd-stub's pair of measurements of one UKI section.
func section(name string, content []byte, algs []uint16) []rawEvent {
	return []rawEvent{stubEvent(11, name, append([]byte(name), 0), algs), stubEvent(11, name, content, algs)}
}

// algsOf are the digest algorithms of a log's events.
func algsOf(events []rawEvent) []uint16 {
	var out []uint16
	for _, d := range events[0].digests {
		out = append(out, d.alg)
	}
	return out
}

// rootExtends boots a swtpm machine with the real log, then extends each
// event's digests into its PCR without logging it (root on the booted
// machine, tpm2_pcrextend): the log sent is the real one.
func rootExtends(t *testing.T, real []byte, events ...rawEvent) *swMachine {
	t.Helper()
	m, err := manufacturer(t).NewMachine(context.Background(), t.TempDir(), real)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	m.Collector.Close()
	ch, err := tpm.DialSocket("tcp", m.TPM.Addr, real)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		for _, d := range e.digests {
			if alg := map[uint16]tpm2.Algorithm{0x0004: tpm2.AlgSHA1, 0x000B: tpm2.AlgSHA256}[d.alg]; alg != 0 {
				if err := tpm2.PCRExtend(ch, tpmutil.Handle(e.pcr), alg, d.digest, ""); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if m.Collector, err = tpm.NewCollector(ch); err != nil {
		t.Fatal(err)
	}
	return &swMachine{tpm: m.TPM, collector: m.Collector, keySHA: m.KubeletSHA}
}

// TestUKIAttacks: a pool learned (`policy learn`, tpm.uki) from a real
// boot of a signed unified kernel image — OVMF with the lab's own keys,
// systemd-stub 252, measured into swtpm — admits that boot's real quote,
// and refuses what root on the booted machine, or a firmware log of
// another UKI, can make of it: each PCR judged by its own sequence, event
// types and descriptions never read.
func TestUKIAttacks(t *testing.T) {
	uki := firmwaretestdata.MustLog("debian-12-ovmf-uki")
	var exp firmwaretestdata.Expected
	logs, err := firmwaretestdata.Logs()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range logs {
		if l.Name == "debian-12-ovmf-uki" {
			exp = l.Expected
		}
	}
	first := newSwMachine(t, uki) // also makes the vendor CA
	v := swtpmVerifier(t, nil)
	honest, err := swAttest(t, first, v)
	if err != nil {
		t.Fatalf("the honest UKI boot: %v", err)
	}
	b := honest.TPM.Boot
	if !b.UKISectionsKnown || len(b.UKISections) != len(exp.UKISections) {
		t.Fatalf("the honest quote's UKI sections %v (known %v); want %v", b.UKISections, b.UKISectionsKnown, exp.UKISections)
	}
	doc, notes, err := policy.Learn(nil, "worker", policy.Learned{EKTrust: honest.TPM.EKTrust, Bank: "sha256", Boot: b, PCRs: honest.TPM.PCRs,
		Root: &policy.EKRoot{Name: "swtpm-localca", Dir: "/unused"}, NodeNames: "requested"})
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse(doc)
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	tp := pol.Pools["worker"].TPM
	if tp.UKI == nil || !slices.Equal(tp.UKI.SignedBy, []string{exp.Authorities[0].SHA256}) || len(tp.UKI.Allow) != 0 || tp.Grub != nil || tp.KernelCmdline != nil {
		t.Fatalf("learned from the UKI boot:\n%s\nwant tpm.uki.signedBy the lab's db CA alone, no GRUB rules", doc)
	}
	if !slices.ContainsFunc(notes, func(n string) bool {
		return bytes.Contains([]byte(n), []byte("tpm.uki.signedBy: admits every unified kernel image"))
	}) {
		t.Errorf("learn's notes do not say what a UKI signer rule admits: %q", notes)
	}
	if err := pol.Evaluate("worker", honest); err != nil {
		t.Fatalf("the learned pool refuses the honest UKI boot: %v", err)
	}

	header, events := splitLog(t, uki)
	algs := algsOf(events)
	end := len(events)
	judged := func(m *swMachine, p *policy.Policy) string {
		t.Helper()
		claims, err := swAttest(t, m, v)
		if err == nil {
			err = p.Evaluate("worker", claims)
		}
		return attacktable.Outcome(err)
	}
	row := func(attack string, want attest.Reason, m *swMachine, p *policy.Policy) {
		t.Helper()
		attacktable.Check(t, "TPM boot state", attack, string(want), judged(m, p))
	}
	edit := func(fn func(*policy.UKIRule)) *policy.Policy {
		t.Helper()
		p, err := policy.Parse(doc)
		if err != nil {
			t.Fatal(err)
		}
		pp := p.Pools["worker"]
		u := *pp.TPM.UKI
		fn(&u)
		pp.TPM.UKI = &u
		p.Pools["worker"] = pp
		return p
	}

	relabelled := slices.Clone(events)
	for i := range relabelled {
		if relabelled[i].pcr == 11 {
			relabelled[i].typ, relabelled[i].data = evEFIAction, []byte("anything") // neither is measured
		}
	}
	row("a UKI boot whose PCR 11 events root relabelled (types and descriptions are not measured): the same sections, admitted", "accepted",
		rootAppends(t, joinLog(header, relabelled), nil), pol)
	row("root appends a second .initrd (its name and another content) to PCR 11 after boot", attest.ReasonPolicyUKISections,
		rootAppends(t, uki, map[int][]rawEvent{end: section(".initrd", []byte("an initramfs root wrote"), algs)}), pol)
	row("root appends a .cmdline after .initrd to PCR 11 (out of systemd-stub's order)", attest.ReasonPolicyUKISections,
		rootAppends(t, uki, map[int][]rawEvent{end: section(".cmdline", []byte("init=/bin/sh"), algs)}), pol)
	row("root appends half a section (a name without content) to PCR 11", attest.ReasonPolicyUKISections,
		rootAppends(t, uki, map[int][]rawEvent{end: section(".uname", []byte("x"), algs)[:1]}), pol)
	phase := func(words ...string) []rawEvent {
		var es []rawEvent
		for _, w := range words {
			es = append(es, stubEvent(11, "", []byte(w), algs))
		}
		return es
	}
	row("root extends PCR 11 with leave-initrd, unlogged (not a run of systemd's phases: enter-initrd comes first): PCR 11 no longer replays, and the log is refused before any rule", attest.ReasonEventLogReplay,
		rootExtends(t, uki, phase("leave-initrd")...), pol)
	row("root extends PCR 11 with systemd's phases out of order (ready before sysinit)", attest.ReasonEventLogReplay,
		rootExtends(t, uki, phase("enter-initrd", "leave-initrd", "ready", "sysinit")...), pol)
	row("root extends PCR 11 with a phase twice (sysinit, sysinit)", attest.ReasonEventLogReplay,
		rootExtends(t, uki, phase("sysinit", "sysinit")...), pol)
	row("root extends PCR 11 with a phase word of its own after systemd's", attest.ReasonEventLogReplay,
		rootExtends(t, uki, phase("enter-initrd", "leave-initrd", "sysinit", "ready", "rooted")...), pol)
	row("root extends PCR 11 with a phase word and its NUL (not what systemd measures)", attest.ReasonEventLogReplay,
		rootExtends(t, uki, phase("enter-initrd\x00")...), pol)
	for _, words := range [][]string{{"enter-initrd"}, {"enter-initrd", "leave-initrd", "sysinit", "ready"}, {"sysinit", "ready"}} {
		m := rootExtends(t, uki, phase(words...)...)
		row(fmt.Sprintf("systemd-pcrphase's phases after the stub, as systemd makes them (%s): admitted, the phases read from the quote", strings.Join(words, ", ")), "accepted", m, pol)
		claims, err := swAttest(t, m, v)
		if err != nil {
			t.Errorf("phases %q: %v", words, err)
		} else if got := claims.TPM.Boot; !slices.Equal(got.SystemdPhases, words) || !got.UKISectionsKnown {
			t.Errorf("phases %q: the claims' phases %q, sections known %v", words, got.SystemdPhases, got.UKISectionsKnown)
		}
	}
	if len(b.SystemdPhases) != 0 {
		t.Errorf("the honest quote (no phases) reads phases %q", b.SystemdPhases)
	}
	row("a command line passed by the boot loader (PCR 12, logged)", attest.ReasonPolicyUKIExtended,
		rootAppends(t, uki, map[int][]rawEvent{end: {stubEvent(12, "LOADED_IMAGE::LoadOptions", []byte("init=/bin/sh"), algs)}}), pol)
	row("credentials measured into PCR 12 and left out of the log", attest.ReasonPolicyUKIExtended,
		rootExtends(t, uki, stubEvent(12, "", []byte("a credential"), algs)), pol)
	row("a system extension measured into PCR 13", attest.ReasonPolicyUKIExtended,
		rootAppends(t, uki, map[int][]rawEvent{end: {stubEvent(13, "sysext", []byte("an extension image"), algs)}}), pol)
	appended := rawEvent{pcr: 4, typ: evEFIBootApp, data: make([]byte, 32)}
	for _, a := range algs {
		appended.digests = append(appended.digests, algDigest{a, hashOf(a, []byte("a second image"))})
	}
	row("root appends a boot application to PCR 4 after the UKI (the UKI pool then reads the first as a shim it does not allow)", attest.ReasonPolicyBootNotAllowed,
		rootAppends(t, uki, map[int][]rawEvent{end: {appended}}), pol)

	// Firmware logs of other UKIs (each measured as it is).
	var sec, names []int // positions of PCR 11's events; its name events
	for i, e := range events {
		if e.pcr == 11 {
			sec = append(sec, i)
		}
	}
	for j := 0; j < len(sec); j += 2 {
		names = append(names, sec[j])
	}
	swapped := slices.Clone(events)
	// .osrel and .cmdline measured the other way round.
	swapped[names[1]], swapped[names[1]+1], swapped[names[2]], swapped[names[2]+1] = events[names[2]], events[names[2]+1], events[names[1]], events[names[1]+1]
	row("a stub that measured .cmdline before .osrel (not systemd-stub's order)", attest.ReasonPolicyUKISections,
		firmwareLogged(t, joinLog(header, swapped)), pol)
	noLinux := slices.Delete(slices.Clone(events), sec[0], sec[0]+2)
	row("a PCR 11 without .linux (sections of no UKI)", attest.ReasonPolicyUKISections,
		firmwareLogged(t, joinLog(header, noLinux)), pol)

	// Rules narrower than the learned signer.
	row("a UKI pool whose signer is another key", attest.ReasonPolicyBootSigner,
		newSwMachine(t, uki), edit(func(u *policy.UKIRule) { u.SignedBy = []string{exp.Authorities[0].SHA256[:62] + "00"} }))
	row("a pool pinning .cmdline to another command line", attest.ReasonPolicyUKISections,
		newSwMachine(t, uki), edit(func(u *policy.UKIRule) {
			u.Sections = map[string][]string{".cmdline": {exp.UKISections[0].SHA256}}
		}))
	row("a pool pinning .splash, which this UKI has not", attest.ReasonPolicyUKISections,
		newSwMachine(t, uki), edit(func(u *policy.UKIRule) { u.Sections = map[string][]string{".splash": {exp.UKISections[0].SHA256}} }))
	row("the UKI denied by digest", attest.ReasonPolicyBootDenied,
		newSwMachine(t, uki), edit(func(u *policy.UKIRule) { u.Deny = []string{exp.BootApplications[0]} }))
	row("a GRUB boot (shim, GRUB, kernel) under the UKI pool", attest.ReasonPolicyBootNotAllowed,
		newSwMachine(t, firmwaretestdata.MustLog("rhel8-uefi")), pol)
}

// TestUKIPolicyRules: what a pool with tpm.uki may hold, and what learn
// does with a UKI boot beside a GRUB pool.
func TestUKIPolicyRules(t *testing.T) {
	uki := firmwaretestdata.MustLog("debian-12-ovmf-uki")
	bs, err := tpm.LogBootState(uki, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	pcrs, err := tpm.LogPCRs(uki, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	rhel, err := tpm.LogBootState(firmwaretestdata.MustLog("rhel8-uefi"), crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	learn := func(doc []byte, b attest.BootState) ([]byte, error) {
		out, _, err := policy.Learn(doc, "worker", policy.Learned{EKTrust: "ca:swtpm-localca", Bank: "sha256", Boot: b, PCRs: pcrs,
			Root: &policy.EKRoot{Name: "swtpm-localca", Dir: "/unused"}, NodeNames: "requested"})
		return out, err
	}
	ukiDoc, err := learn(nil, bs)
	if err != nil {
		t.Fatal(err)
	}
	grubDoc, err := learn(nil, rhel)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		doc  []byte
		boot attest.BootState
		want string
	}{
		{"a UKI boot merged into a GRUB pool", grubDoc, bs, "judges GRUB's boot chain"},
		{"a GRUB boot merged into a UKI pool", ukiDoc, rhel, "judges unified kernel images"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := learn(c.doc, c.boot); err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
				t.Errorf("learn: %v; want a refusal saying %q", err, c.want)
			}
		})
	}
	for _, c := range []struct {
		name, add, want string
	}{
		{"kernelCmdline beside uki", "    kernelCmdline: {any: true}\n", "tpm.uki and tpm.kernelCmdline"},
		{"grub beside uki", "    grub: {any: true}\n", "tpm.uki and tpm.grub"},
		{"a kernel stage beside uki", "    bootComponents: {kernel: {any: true}}\n", "tpm.uki and tpm.bootComponents.kernel"},
		{"a section systemd-stub does not measure", "    uki: {signedBy: [" + bsSigner(t, bs) + "], sections: {.pcrsig: [" + bs.BootApplications[0] + "]}}\n", "is not a section systemd-stub measures"},
		{"a pinned section with no digests", "    uki: {signedBy: [" + bsSigner(t, bs) + "], sections: {.cmdline: []}}\n", "tpm.uki.sections[.cmdline] is empty"},
		{"an empty uki", "    uki: {}\n", "tpm.uki.allow is empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := "apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\ntrust: {ekRoots: [{name: swtpm-localca, dir: /unused}]}\npools:\n  worker:\n    evidence: [tpm]\n    serve: {nodeNames: requested}\n    tpm:\n      ekTrust: [ca:swtpm-localca]\n"
			body := c.add
			if !bytes.Contains([]byte(body), []byte("uki:")) {
				body += "    uki: {signedBy: [" + bsSigner(t, bs) + "]}\n"
			}
			doc += indent(body)
			_, err := policy.Parse([]byte(doc))
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
				t.Errorf("%v; want an error saying %q\n%s", err, c.want, doc)
			}
		})
	}
}

func bsSigner(t *testing.T, b attest.BootState) string {
	t.Helper()
	if len(b.Authorities) != 1 {
		t.Fatalf("authorities %v", b.Authorities)
	}
	return b.Authorities[0].SHA256
}

// indent puts a pool's tpm lines under tpm: (two more spaces).
func indent(s string) string {
	var out []byte
	for _, l := range bytes.SplitAfter([]byte(s), []byte("\n")) {
		if len(l) > 0 {
			out = append(append(out, "  "...), l...)
		}
	}
	return string(out)
}
