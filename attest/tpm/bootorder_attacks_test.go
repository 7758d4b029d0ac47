package tpm_test

import (
	"bytes"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
)

// Event types of the TCG PC Client profile the forgeries use.
const (
	evSeparator      = 0x00000004
	evEFIVariableCfg = 0x80000001
	evEFIBootApp     = 0x80000003
	evEFIAction      = 0x80000007
	evEFIVarAuth     = 0x800000E0
	evIPL            = 0x0000000D
)

// rawEvent is one event of a crypto-agile log, as bytes go: a forgery edits
// it and encodes it again.
type rawEvent struct {
	pcr, typ uint32
	digests  []algDigest // in the log's order
	data     []byte
}

type algDigest struct {
	alg    uint16
	digest []byte
}

// hashOf hashes data with the TPM algorithm alg (SHA-1, SHA-256, SHA-384).
func hashOf(alg uint16, data []byte) []byte {
	switch alg {
	case 0x0004:
		s := sha1.Sum(data)
		return s[:]
	case 0x000B:
		s := sha256.Sum256(data)
		return s[:]
	case 0x000C:
		s := sha512.Sum384(data)
		return s[:]
	}
	panic("algorithm")
}

// logAlgs are the algorithms every forged event carries: those of the logs
// used here.
var logAlgs = []uint16{0x0004, 0x000B, 0x000C}

// splitLog splits a crypto-agile log (SHA-1, SHA-256, SHA-384 digests)
// into its header (the Spec ID event) and its events.
func splitLog(t *testing.T, raw []byte) ([]byte, []rawEvent) {
	t.Helper()
	hsize := 32 + int(binary.LittleEndian.Uint32(raw[28:32]))
	header, rest := raw[:hsize], raw[hsize:]
	var out []rawEvent
	for len(rest) > 0 {
		e := rawEvent{pcr: binary.LittleEndian.Uint32(rest), typ: binary.LittleEndian.Uint32(rest[4:])}
		n := binary.LittleEndian.Uint32(rest[8:])
		rest = rest[12:]
		for range n {
			alg := binary.LittleEndian.Uint16(rest)
			size := map[uint16]int{0x0004: 20, 0x000B: 32, 0x000C: 48}[alg]
			if size == 0 {
				t.Fatalf("the log has digests of algorithm %#x", alg)
			}
			e.digests, rest = append(e.digests, algDigest{alg, rest[2 : 2+size]}), rest[2+size:]
		}
		size := binary.LittleEndian.Uint32(rest)
		e.data, rest = rest[4:4+size], rest[4+size:]
		out = append(out, e)
	}
	return header, out
}

func (e rawEvent) encode() []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, e.pcr)
	binary.Write(&b, binary.LittleEndian, e.typ)
	binary.Write(&b, binary.LittleEndian, uint32(len(e.digests)))
	for _, d := range e.digests {
		binary.Write(&b, binary.LittleEndian, d.alg)
		b.Write(d.digest)
	}
	binary.Write(&b, binary.LittleEndian, uint32(len(e.data)))
	b.Write(e.data)
	return b.Bytes()
}

func joinLog(header []byte, events []rawEvent) []byte {
	out := append([]byte(nil), header...)
	for _, e := range events {
		out = append(out, e.encode()...)
	}
	return out
}

// measured is an event whose digests are the hashes of its data, as
// firmware measures variables, separators and actions.
func measured(pcr, typ uint32, data []byte) rawEvent {
	e := rawEvent{pcr: pcr, typ: typ, data: data}
	for _, a := range logAlgs {
		e.digests = append(e.digests, algDigest{a, hashOf(a, data)})
	}
	return e
}

// image is an application event whose digest is an image's (its
// Authenticode hash, here any fixed bytes), with no image path.
func image(seed string) rawEvent {
	e := rawEvent{pcr: 4, typ: evEFIBootApp, data: make([]byte, 32)}
	for _, a := range logAlgs {
		e.digests = append(e.digests, algDigest{a, hashOf(a, []byte(seed))})
	}
	return e
}

// efiVariable is a UEFI_VARIABLE_DATA.
func efiVariable(guid [16]byte, name string, data []byte) []byte {
	u := utf16.Encode([]rune(name))
	var b bytes.Buffer
	b.Write(guid[:])
	binary.Write(&b, binary.LittleEndian, uint64(len(u)))
	binary.Write(&b, binary.LittleEndian, uint64(len(data)))
	binary.Write(&b, binary.LittleEndian, u)
	b.Write(data)
	return b.Bytes()
}

var (
	globalGUID  = [16]byte{0x61, 0xdf, 0xe4, 0x8b, 0xca, 0x93, 0xd2, 0x11, 0xaa, 0x0d, 0x00, 0xe0, 0x98, 0x03, 0x2b, 0x8c}
	imageDBGUID = [16]byte{0xcb, 0xb2, 0x19, 0xd7, 0x3a, 0x3d, 0x96, 0x45, 0xa3, 0xbc, 0xda, 0xd0, 0x0e, 0x67, 0x65, 0x6f}
)

// index returns the position of the first event matching match.
func index(t *testing.T, events []rawEvent, match func(rawEvent) bool) int {
	t.Helper()
	for i, e := range events {
		if match(e) {
			return i
		}
	}
	t.Fatal("no such event in the log")
	return -1
}

// lastOf is the position of the last event of PCR pcr: an event spliced
// right after it extends that PCR last, and so replays.
func lastOf(events []rawEvent, pcr uint32) int {
	last := -1
	for i, e := range events {
		if e.pcr == pcr {
			last = i
		}
	}
	return last
}

func isEBS(e rawEvent) bool {
	return e.pcr == 5 && e.typ == evEFIAction && string(e.data) == "Exit Boot Services Invocation"
}

// rootAppends boots a swtpm machine with the real log, then does what root
// on the booted machine can: extends each forged event's digests into its
// PCR (tpm2_pcrextend) and sends the real log with the events spliced in
// at their positions (indexes of the real log's events; len(events) to
// append). The quote is a real one; the log replays.
func rootAppends(t *testing.T, real []byte, splice map[int][]rawEvent) *swMachine {
	t.Helper()
	m, err := manufacturer(t).NewMachine(context.Background(), t.TempDir(), real)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	m.Collector.Close()
	header, events := splitLog(t, real)
	var forged []rawEvent
	var extends []rawEvent
	for i := 0; i <= len(events); i++ {
		forged = append(forged, splice[i]...)
		extends = append(extends, splice[i]...)
		if i < len(events) {
			forged = append(forged, events[i])
		}
	}
	ch, err := tpm.DialSocket("tcp", m.TPM.Addr, joinLog(header, forged))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range extends {
		for _, d := range e.digests {
			alg := map[uint16]tpm2.Algorithm{0x0004: tpm2.AlgSHA1, 0x000B: tpm2.AlgSHA256}[d.alg]
			if alg == 0 {
				continue // the TPM has SHA-1 and SHA-256 banks
			}
			if err := tpm2.PCRExtend(ch, tpmutil.Handle(e.pcr), alg, d.digest, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	if m.Collector, err = tpm.NewCollector(ch); err != nil {
		t.Fatal(err)
	}
	return &swMachine{tpm: m.TPM, collector: m.Collector, keySHA: m.KubeletSHA}
}

// firmwareLogged boots a swtpm machine whose firmware measured exactly
// this log (a log edited before the boot): what the parser's rules refuse
// even when every digest is genuine.
func firmwareLogged(t *testing.T, log []byte) *swMachine {
	t.Helper()
	return newSwMachine(t, log)
}

// TestBootStateForgeryAttacks: root on a booted machine forges the boot
// state it reports — extending PCRs from userspace and sending a log that
// replays — and firmware-shaped logs break each PCR's sequence; each on a
// real firmware log and a real swtpm quote, each refused with its reason.
// Root chooses every event's type and how the log interleaves PCRs (the
// quote proves neither), and appends to any PCR: the rows whose log the
// verifier accepts are judged by a policy, which refuses what it refused
// before the forgery.
func TestBootStateForgeryAttacks(t *testing.T) {
	rhel := firmwaretestdata.MustLog("rhel8-uefi")
	honestMachine := newSwMachine(t, rhel) // also makes the vendor CA
	v := swtpmVerifier(t, nil)
	noSB := firmwaretestdata.MustLog("ubuntu-2104-no-secure-boot")
	noDBX := firmwaretestdata.MustLog("ubuntu-2104-no-dbx")
	_, rhelEvents := splitLog(t, rhel)
	_, noSBEvents := splitLog(t, noSB)
	end := func(events []rawEvent) int { return len(events) }
	pcr7Sep := func(e rawEvent) bool { return e.pcr == 7 && e.typ == evSeparator }

	bigDBX := bytes.Repeat([]byte{0xaa}, 16+4+4+4)
	binary.LittleEndian.PutUint32(bigDBX[16:], 28+48)
	binary.LittleEndian.PutUint32(bigDBX[24:], 48)
	bigDBX = append(bigDBX, make([]byte, 48)...)

	// judged: the verifier's refusal, else the policy's outcome.
	judged := func(m *swMachine, pol *policy.Policy) string {
		t.Helper()
		claims, err := swAttest(t, m, v)
		if err == nil && pol != nil {
			err = pol.Evaluate("worker", claims)
		}
		return attacktable.Outcome(err)
	}
	row := func(attack string, want attest.Reason, m *swMachine) {
		t.Helper()
		attacktable.Check(t, "TPM boot state", attack, string(want), judged(m, nil))
	}
	judgedRow := func(attack string, want attest.Reason, m *swMachine, pol *policy.Policy) {
		t.Helper()
		attacktable.Check(t, "TPM boot state", attack, string(want), judged(m, pol))
	}

	row("Secure Boot off, root appends SecureBoot=1 to PCR 7 after the boot", attest.ReasonEventLogOutOfOrder,
		rootAppends(t, noSB, map[int][]rawEvent{end(noSBEvents): {measured(7, evEFIVariableCfg, efiVariable(globalGUID, "SecureBoot", []byte{1}))}}))
	row("Secure Boot off, SecureBoot=1 appended to PCR 7 and moved before ExitBootServices in the log", attest.ReasonEventLogOutOfOrder,
		rootAppends(t, noSB, map[int][]rawEvent{lastOf(noSBEvents, 7) + 1: {measured(7, evEFIVariableCfg, efiVariable(globalGUID, "SecureBoot", []byte{1}))}}))
	_, noDBXEvents := splitLog(t, noDBX)
	row("an empty dbx, root appends a current one to PCR 7", attest.ReasonEventLogOutOfOrder,
		rootAppends(t, noDBX, map[int][]rawEvent{end(noDBXEvents): {measured(7, evEFIVariableCfg, efiVariable(imageDBGUID, "dbx", bigDBX))}}))
	noDBXHeader, _ := splitLog(t, noDBX)
	sep7 := index(t, noDBXEvents, pcr7Sep)
	hidden := append([]rawEvent(nil), noDBXEvents...)
	hidden[sep7].typ = evEFIVarAuth // same digest: the PCRs are the boot's
	row("root relabels PCR 7's separator as an authority (its type is not measured) and appends a current dbx: still the separator, by its digest", attest.ReasonEventLogOutOfOrder,
		rootAppends(t, joinLog(noDBXHeader, hidden), map[int][]rawEvent{lastOf(noDBXEvents, 7) + 1: {measured(7, evEFIVariableCfg, efiVariable(imageDBGUID, "dbx", bigDBX))}}))
	row("root appends a second PCR 4 separator, moved before ExitBootServices", attest.ReasonEventLogOutOfOrder,
		rootAppends(t, rhel, map[int][]rawEvent{lastOf(rhelEvents, 4) + 1: {measured(4, evSeparator, []byte{0, 0, 0, 0})}}))
	row("root appends an event to PCR 5 after ExitBootServices", attest.ReasonEventLogOutOfOrder,
		rootAppends(t, rhel, map[int][]rawEvent{end(rhelEvents): {measured(5, evEFIAction, []byte("Exit Boot Services Invocation again"))}}))

	// Logs firmware would not write, measured as they are.
	_, sbEvents := splitLog(t, rhel)
	header, _ := splitLog(t, rhel)
	sbAt := index(t, sbEvents, func(e rawEvent) bool { return e.pcr == 7 && e.typ == evEFIVariableCfg })
	dup := append(append(append([]rawEvent(nil), sbEvents[:sbAt+1]...), sbEvents[sbAt]), sbEvents[sbAt+1:]...)
	row("a variable measured twice before PCR 7's separator", attest.ReasonEventLogVariableRepeated, firmwareLogged(t, joinLog(header, dup)))
	wrong := append([]rawEvent(nil), sbEvents...)
	data := bytes.Clone(wrong[sbAt].data)
	data[0] ^= 0xff // another vendor GUID, same name
	wrong[sbAt] = measured(7, evEFIVariableCfg, data)
	row("SecureBoot under another vendor GUID", attest.ReasonEventLogVariableGUID, firmwareLogged(t, joinLog(header, wrong)))
	dbg := append(append(append([]rawEvent(nil), sbEvents[:sbAt]...), measured(7, evIPL, []byte("UEFI Debug Mode"))), sbEvents[sbAt:]...)
	row("the firmware logged UEFI Debug Mode (labelled as anything: the digest says what it is)", attest.ReasonUEFIDebugger, firmwareLogged(t, joinLog(header, dbg)))
	badSep := append([]rawEvent(nil), sbEvents...)
	sepAt := index(t, badSep, pcr7Sep)
	badSep[sepAt] = measured(7, evSeparator, []byte{1, 0, 0, 0})
	row("an error separator in PCR 7", attest.ReasonEventLogUnexpected, firmwareLogged(t, joinLog(header, badSep)))

	// The chain, judged by what PCR 4's own sequence proves: a pool that
	// pins another kernel than the one this machine booted refuses it,
	// whatever root appends, reorders or relabels.
	honest, err := swAttest(t, honestMachine, v)
	if err != nil {
		t.Fatal(err)
	}
	forgedKernel := image("an allowed kernel")
	allowed := fmt.Sprintf("%x", forgedKernel.digests[1].digest)
	hb := honest.TPM.Boot
	if len(hb.Kernels()) == 0 {
		t.Fatalf("the honest boot measured no kernel into PCR 4: %v", hb.BootApplications)
	}
	pinned := policytest.New().Pool("worker", policytest.TPM().SecureBoot().Boot(hb.BootApplications[0], hb.BootApplications[1], allowed)).Must(t)
	if r, _ := attest.ReasonOf(pinned.Evaluate("worker", honest)); r != attest.ReasonPolicyBootNotAllowed {
		t.Fatalf("the honest boot under a pool pinning another kernel: %v", r)
	}
	ebsAt := index(t, rhelEvents, isEBS)
	judgedRow("root appends an allowed kernel's digest to PCR 4 and moves ExitBootServices after it (cross-PCR order): the kernel it booted is still judged",
		attest.ReasonPolicyBootNotAllowed, rootAppends(t, rhel, map[int][]rawEvent{ebsAt: {forgedKernel}}), pinned)
	isLinux := func(e rawEvent) bool { return e.pcr == 8 && bytes.Contains(e.data, []byte("grub_cmd linux ")) }
	kernelAt := nthApp(t, rhelEvents, 2)
	relabelled := moved(rhelEvents, kernelAt, index(t, rhelEvents, isLinux)) // the real kernel before GRUB's linux command
	kernelAt = nthApp(t, relabelled, 2)
	relabelled[kernelAt].typ = evEFIAction // types are not measured
	judgedRow("root relabels the kernel's PCR 4 event as an EFI action and moves it before GRUB's linux command, and appends an allowed kernel after that command: the kernel it booted is still judged",
		attest.ReasonPolicyBootNotAllowed, rootAppends(t, joinLog(header, relabelled), map[int][]rawEvent{index(t, relabelled, isLinux) + 1: {forgedKernel}}), pinned)
	wholeChain := policytest.New().Pool("worker", policytest.TPM().SecureBoot().Boot(fmt.Sprintf("%x", image("shim").digests[1].digest),
		fmt.Sprintf("%x", image("grub").digests[1].digest), allowed)).Must(t)
	chainRelabelled := append([]rawEvent(nil), rhelEvents...)
	for i := range chainRelabelled {
		if chainRelabelled[i].pcr == 4 && chainRelabelled[i].typ == evEFIBootApp {
			chainRelabelled[i].typ = evEFIAction
		}
	}
	judgedRow("root relabels every PCR 4 application as an EFI action and appends an allowed shim, GRUB and kernel: the chain is still the one it booted",
		attest.ReasonPolicyBootNotAllowed, rootAppends(t, joinLog(header, chainRelabelled), map[int][]rawEvent{end(rhelEvents): {image("shim"), image("grub"), forgedKernel}}), wholeChain)
	denied := policytest.New().Pool("worker", policytest.TPM().SecureBoot().Edit(func(p *policy.Pool) { p.TPM.DeniedDigests = []string{hb.BootApplications[2]} })).Must(t)
	judgedRow("root relabels the denied kernel's event as an EFI action: a denied digest refuses wherever it appears",
		attest.ReasonPolicyBootDenied, rootAppends(t, joinLog(header, relabelled), nil), denied)

	// Where the boot did not measure its kernel into PCR 4 (Secure Boot
	// off: GRUB loaded it itself), root appending an allowed kernel's
	// digest to PCR 4 fills the kernel's stage; what GRUB read (PCR 9,
	// pinned by grub.files) still shows the kernel that ran.
	noSBHonest, err := swAttest(t, newSwMachine(t, noSB), v)
	if err != nil {
		t.Fatal(err)
	}
	learnedDoc, _, err := policy.Learn(nil, "worker", policy.Learned{EKTrust: "ca:swtpm-localca", Bank: "sha256", Boot: noSBHonest.TPM.Boot,
		Root: &policy.EKRoot{Name: "swtpm-localca", Dir: "/unused"}, NodeNames: "requested"})
	if err != nil {
		t.Fatal(err)
	}
	learnedNoSB, err := policy.Parse(learnedDoc)
	if err != nil {
		t.Fatal(err)
	}
	noSBHeader, _ := splitLog(t, noSB)
	evil := append([]rawEvent(nil), noSBEvents...)
	kernelFile := -1
	for i, e := range evil {
		if e.pcr == 9 && bytes.Contains(e.data, []byte("vmlinuz")) {
			kernelFile = i
		}
	}
	if kernelFile < 0 {
		t.Fatal("the log has no PCR 9 kernel file")
	}
	evil[kernelFile] = rawEvent{pcr: 9, typ: evil[kernelFile].typ, data: evil[kernelFile].data, digests: image("an evil kernel file").digests}
	judgedRow("Secure Boot off, GRUB loads an evil kernel (PCR 9 only), root appends an allowed kernel's digest to PCR 4; the pool learned from the honest boot",
		attest.ReasonPolicyGrubFile, rootAppends(t, joinLog(noSBHeader, evil), map[int][]rawEvent{end(noSBEvents): {forgedKernel}}), learnedNoSB)

	cmdlineRows(t, v)
}

// grubIPL is a GRUB PCR 8 event: label, then text, whose digest is the
// text's (with its NUL, as GRUB measures it, not hashed).
func grubIPL(label, text string) rawEvent {
	e := rawEvent{pcr: 8, typ: evIPL, data: append([]byte(label+text), 0)}
	for _, a := range logAlgs {
		e.digests = append(e.digests, algDigest{a, hashOf(a, []byte(text))})
	}
	return e
}

// relabel gives a real GRUB event another label: the measured text and
// its digest stay, so the PCRs are the boot's own.
func relabel(e rawEvent, from, to string) rawEvent {
	e.data = append([]byte(to), bytes.TrimPrefix(e.data, []byte(from))...)
	return e
}

// cmdlineRows: the label of a GRUB event is not measured. Root relabels
// the real kernel command line (and linux command) as other commands and
// appends forged ones to PCR 8; and a quote glued to a forbidden word
// hides it from a word-by-word policy. Each would pass a pool that
// forbids a word of the real command line.
func cmdlineRows(t *testing.T, v *tpm.Verifier) {
	rhel := firmwaretestdata.MustLog("rhel8-uefi")
	header, events := splitLog(t, rhel)
	const forbidden = "crashkernel=auto"
	pol := policytest.New().Pool("worker", policytest.TPM().Edit(func(p *policy.Pool) {
		p.TPM.KernelCmdline = &policy.KernelCmdline{Forbid: []string{forbidden}}
	})).Must(t)
	cmdAt := index(t, events, func(e rawEvent) bool { return e.pcr == 8 && bytes.HasPrefix(e.data, []byte("grub_kernel_cmdline ")) })
	real := string(bytes.TrimSuffix(bytes.TrimPrefix(events[cmdAt].data, []byte("grub_kernel_cmdline ")), []byte{0}))
	if !strings.Contains(real, forbidden) {
		t.Fatalf("the real command line %q lacks %q", real, forbidden)
	}
	clean := strings.Join(strings.Fields(strings.ReplaceAll(real, forbidden, "")), " ")
	edited := func(edit func([]rawEvent)) []byte {
		ev := append([]rawEvent(nil), events...)
		edit(ev)
		return joinLog(header, ev)
	}
	row := func(attack string, m *swMachine) {
		t.Helper()
		claims, err := swAttest(t, m, v)
		got := "accepted"
		if err != nil {
			r, _ := attest.ReasonOf(err)
			got = string(r)
		} else if err := pol.Evaluate("worker", claims); err != nil {
			r, _ := attest.ReasonOf(err)
			got = string(r)
		}
		attacktable.Check(t, "TPM boot state", attack, string(attest.ReasonPolicyKernelCmdline), got)
	}
	honest, err := swAttest(t, newSwMachine(t, rhel), v)
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := attest.ReasonOf(pol.Evaluate("worker", honest)); r != attest.ReasonPolicyKernelCmdline {
		t.Fatalf("the honest boot with %q: %v; want it refused", forbidden, r)
	}

	// The real command line relabelled as a GRUB command: the PCRs are
	// the boot's, and the log has no kernel command line of its own.
	relabelled := edited(func(ev []rawEvent) { ev[cmdAt] = relabel(ev[cmdAt], "grub_kernel_cmdline ", "grub_cmd ") })
	// Extended after the boot, so after every real PCR 8 event; placed
	// before ExitBootServices in the log (the interleaving across PCRs is
	// not proven by the quote).
	after8 := lastOf(events, 8) + 1
	if after8 > index(t, events, isEBS) {
		t.Fatal("the log measures PCR 8 after ExitBootServices")
	}
	appended := func(forged ...rawEvent) *swMachine {
		return rootAppends(t, relabelled, map[int][]rawEvent{after8: forged})
	}
	row("root relabels the measured kernel command line as a GRUB command and appends one without a forbidden word to PCR 8",
		appended(grubIPL("kernel_cmdline: ", clean)))
	row("... and appends a matching linux command too (the real one, relabelled or not, is still a linux command by its text)",
		appended(grubIPL("grub_cmd: ", "linux "+clean), grubIPL("kernel_cmdline: ", clean)))
	row("... and appends the real command line with the forbidden word in quotes (GRUB's quotes are not measured)",
		appended(grubIPL("kernel_cmdline: ", strings.Replace(real, forbidden, `"`+forbidden+`"`, 1))))
}
