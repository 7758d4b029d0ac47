package tpm_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
)

// shimLockGUID is the shim's vendor GUID (605DAB50-E046-4300-ABB6-3DD810DD8B23) as stored.
var shimLockGUID = [16]byte{0x50, 0xab, 0x5d, 0x60, 0x46, 0xe0, 0x00, 0x43, 0xab, 0xb6, 0x3d, 0xd8, 0x10, 0xdd, 0x8b, 0x23}

// like is an event measured as e's log measures: its digests, in e's
// algorithms, are the hashes of content.
func like(e rawEvent, pcr, typ uint32, data, content []byte) rawEvent {
	out := rawEvent{pcr: pcr, typ: typ, data: data}
	for _, d := range e.digests {
		out.digests = append(out.digests, algDigest{d.alg, hashOf(d.alg, content)})
	}
	return out
}

// variableName is the name of an event's UEFI_VARIABLE_DATA ("" if none).
func variableName(e rawEvent) string {
	if len(e.data) < 32 {
		return ""
	}
	n := binary.LittleEndian.Uint64(e.data[16:24])
	if n > 64 || uint64(len(e.data)) < 32+2*n {
		return ""
	}
	u := make([]rune, n)
	for i := range u {
		u[i] = rune(binary.LittleEndian.Uint16(e.data[32+2*i:]))
	}
	return string(u)
}

func isAuthority(name string) func(rawEvent) bool {
	return func(e rawEvent) bool { return e.pcr == 7 && e.typ == evEFIVarAuth && variableName(e) == name }
}

func isApp(e rawEvent) bool { return e.pcr == 4 && e.typ == evEFIBootApp }

// nthApp is the position of the n-th (from 0) PCR 4 application.
func nthApp(t *testing.T, events []rawEvent, n int) int {
	t.Helper()
	for i, e := range events {
		if isApp(e) {
			if n == 0 {
				return i
			}
			n--
		}
	}
	t.Fatal("the log has fewer applications")
	return -1
}

// moved is events with the event at from moved to stand right before
// the event at before (positions in events).
func moved(events []rawEvent, from, before int) []rawEvent {
	var out []rawEvent
	for i, e := range events {
		if i == before {
			out = append(out, events[from])
		}
		if i != from {
			out = append(out, e)
		}
	}
	return out
}

// emptyMokList is the shim's empty key list (one zero SHA-256 entry it
// owns), whose digest the shim logs for MokListX when nothing is in it.
func emptyMokList() []byte {
	entry := append(append([]byte(nil), shimLockGUID[:]...), make([]byte, 32)...)
	b := []byte{0x26, 0x16, 0xc4, 0xc1, 0x4c, 0x50, 0x92, 0x40, 0xac, 0xa9, 0x41, 0xf9, 0x36, 0x93, 0x43, 0x28}
	b = binary.LittleEndian.AppendUint32(b, uint32(28+len(entry)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(entry)))
	return append(b, entry...)
}

// TestSecureBootAuthorityAttacks: root on a booted machine forges what
// verified its boot applications, the shim's SBAT level and its MokList
// measurements — extending PCRs 7, 9 and 14 from userspace and sending a
// log that replays, or reordering the genuine log across PCRs (which the
// quote does not prove) — on the live Debian boot's log and a real swtpm
// quote. Each is refused with its reason, or, where the log stays
// possible, leaves the signer unknown or ambiguous (a typed refusal from
// BootState.Signer), never another's.
func TestSecureBootAuthorityAttacks(t *testing.T) {
	live := firmwaretestdata.MustLog("debian-12-ovmf-secure-boot")
	rhel := firmwaretestdata.MustLog("rhel8-uefi")
	header, ev := splitLog(t, live)
	_, rhelEv := splitLog(t, rhel)
	honestMachine := newSwMachine(t, live) // also makes the swtpm CA
	v := swtpmVerifier(t, nil)
	ca := newCA(t, "Another signer")
	// Another signer's db-style entry: owner GUID, then its certificate.
	otherEntry := append(append([]byte(nil), shimLockGUID[:]...), ca.Root.Raw...)

	honest, err := swAttest(t, honestMachine, v)
	if err != nil {
		t.Fatalf("the honest live boot: %v", err)
	}
	hb := honest.TPM.Boot
	for i := range hb.BootApplications {
		if _, err := hb.Signer(i); err != nil {
			t.Fatalf("the honest boot's application %d has no signer: %v", i, err)
		}
	}

	ebs := index(t, ev, isEBS)
	dbAt := index(t, ev, isAuthority("db"))
	sbatAt := index(t, ev, isAuthority("SbatLevel"))
	mokRTAt := index(t, ev, isAuthority("MokListRT"))
	shimApp, kernelApp := nthApp(t, ev, 0), nthApp(t, ev, 2)
	if !(dbAt < shimApp && shimApp < sbatAt && sbatAt < mokRTAt && mokRTAt < kernelApp && kernelApp < ebs) {
		t.Fatalf("the live log's order changed: db %d, shim %d, SbatLevel %d, MokListRT %d, kernel %d, ExitBootServices %d", dbAt, shimApp, sbatAt, mokRTAt, kernelApp, ebs)
	}
	ref := ev[dbAt]
	authority := func(guid [16]byte, name string, data []byte) rawEvent {
		v := efiVariable(guid, name, data)
		return like(ref, 7, evEFIVarAuth, v, v)
	}
	ipl := func(pcr uint32, label string, content []byte) rawEvent {
		return like(ref, pcr, evIPL, append([]byte(label), 0), content)
	}

	row := func(attack string, want attest.Reason, m *swMachine, signerOf int) {
		t.Helper()
		claims, err := swAttest(t, m, v)
		got := "accepted"
		switch {
		case err != nil:
			r, _ := attest.ReasonOf(err)
			got = string(r)
		case signerOf >= 0:
			if _, err := claims.TPM.Boot.Signer(signerOf); err != nil {
				r, _ := attest.ReasonOf(err)
				got = string(r)
			} else {
				got = "a signer named"
			}
		}
		attacktable.Check(t, "TPM boot state", attack, string(want), got)
	}
	const verifierRefuses = -1
	const named = attest.Reason("a signer named")
	learnedDoc, _, err := policy.Learn(nil, "worker", policy.Learned{EKTrust: "ca:swtpm-localca", Bank: "sha256", Boot: hb,
		Root: &policy.EKRoot{Name: "swtpm-localca", Dir: "/unused"}, NodeNames: "requested"})
	if err != nil {
		t.Fatal(err)
	}
	learned, err := policy.Parse(learnedDoc)
	if err != nil {
		t.Fatal(err)
	}
	if err := learned.Evaluate("worker", honest); err != nil {
		t.Fatalf("the policy learned from the honest boot refuses it: %v", err)
	}
	judged := func(attack string, want attest.Reason, m *swMachine) {
		t.Helper()
		claims, err := swAttest(t, m, v)
		if err == nil {
			err = learned.Evaluate("worker", claims)
		}
		attacktable.Check(t, "TPM boot state", attack, string(want), attacktable.Outcome(err))
	}

	row("root appends a Secure Boot authority naming its own signer to PCR 7 after ExitBootServices: the kernel's signer is", attest.ReasonBootSignerAmbiguous,
		rootAppends(t, live, map[int][]rawEvent{len(ev): {authority(shimLockGUID, "MokListRT", otherEntry)}}), 2)
	row("root appends a copy of the shim's MokListRT authority to PCR 7, moved before the kernel (the shim measures each once)", attest.ReasonEventLogVariableRepeated,
		rootAppends(t, live, map[int][]rawEvent{kernelApp: {ev[mokRTAt]}}), verifierRefuses)
	twice := append(append(append([]rawEvent(nil), ev[:dbAt+1]...), ev[dbAt]), ev[dbAt+1:]...)
	row("the firmware logs the shim's db authority twice (the firmware measures each once)", attest.ReasonEventLogVariableRepeated,
		firmwareLogged(t, joinLog(header, twice)), verifierRefuses)
	row("root appends an authority naming another signer to PCR 7, moved before the kernel: the kernel's signer is", attest.ReasonBootSignerAmbiguous,
		rootAppends(t, live, map[int][]rawEvent{kernelApp: {authority(shimLockGUID, "MokListRT", otherEntry)}}), 2)
	appended, err := swAttest(t, rootAppends(t, live, map[int][]rawEvent{kernelApp: {authority(shimLockGUID, "MokListRT", otherEntry)}}), v)
	if err != nil {
		t.Fatal(err)
	}
	grub, err := appended.TPM.Boot.Signer(1)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := hb.Signer(1)
	attacktable.Check(t, "TPM boot state", "... and GRUB's signer (the shim's first authority, in PCR 7's own order) is still", want.Subject, grub.Subject)
	row("root moves the firmware's db authority after the shim in the log (cross-PCR order, not proven): the shim's signer is still", named,
		firmwareLogged(t, joinLog(header, moved(ev, dbAt, shimApp+1))), 0)
	rhelHeader, _ := splitLog(t, rhel)
	rhelDB, rhelShim := index(t, rhelEv, isAuthority("db")), nthApp(t, rhelEv, 0)
	row("a shim that measures no SbatLevel: root moves the firmware's db authority after the shim in the log: the shim's signer is still", named,
		firmwareLogged(t, joinLog(rhelHeader, moved(rhelEv, rhelDB, rhelShim+1))), 0)
	// The shim's SbatLevel, then its authority, before the shim; PCR 7's
	// own order (db, SbatLevel, MokListRT) kept.
	early := moved(ev, sbatAt, shimApp)
	early = moved(early, index(t, early, isAuthority("MokListRT")), index(t, early, isApp))
	row("root moves the shim's SbatLevel and its authority before the shim in the log: GRUB's signer is still", named,
		firmwareLogged(t, joinLog(header, early)), 1)
	newer := []byte("sbat,1,2099010100\nshim,9\ngrub,9\n")
	row("root appends a SbatLevel of newer generations to PCR 7, moved before the kernel (the shim measured its own)", attest.ReasonEventLogVariableRepeated,
		rootAppends(t, live, map[int][]rawEvent{kernelApp: {authority(shimLockGUID, "SbatLevel", newer)}}), verifierRefuses)
	rhelRef := rhelEv[index(t, rhelEv, isAuthority("db"))]
	rhelSbat := efiVariable(shimLockGUID, "SbatLevel", newer)
	row("a shim that measures no SbatLevel: root appends one to PCR 7, moved before ExitBootServices (after the shim's authority)", attest.ReasonEventLogOutOfOrder,
		rootAppends(t, rhel, map[int][]rawEvent{index(t, rhelEv, isEBS): {like(rhelRef, 7, evEFIVarAuth, rhelSbat, rhelSbat)}}), verifierRefuses)
	judged("root logs a MokList (the empty list's digest) into PCR 9, before ExitBootServices: a file GRUB did not read", attest.ReasonPolicyGrubFile,
		rootAppends(t, live, map[int][]rawEvent{lastOf(ev, 9) + 1: {ipl(9, "MokList", emptyMokList())}}))
	row("root appends a second MokList (the empty list's digest) to PCR 14, moved before ExitBootServices", attest.ReasonEventLogVariableRepeated,
		rootAppends(t, live, map[int][]rawEvent{ebs: {ipl(14, "MokList", emptyMokList())}}), verifierRefuses)
	swapped := append([]rawEvent(nil), ev...)
	mok := index(t, swapped, func(e rawEvent) bool { return e.pcr == 14 && bytes.Equal(e.data, []byte("MokList\x00")) })
	mokX := index(t, swapped, func(e rawEvent) bool { return e.pcr == 14 && bytes.Equal(e.data, []byte("MokListX\x00")) })
	swapped[mok].data, swapped[mokX].data = swapped[mokX].data, swapped[mok].data
	row("root swaps the labels of PCR 14's MokList and MokListX (labels are not measured)", attest.ReasonEventLogOutOfOrder,
		firmwareLogged(t, joinLog(header, swapped)), verifierRefuses)
	judged("root appends a Secure Boot authority to PCR 9 (outside PCR 7), before ExitBootServices: a file GRUB did not read", attest.ReasonPolicyGrubFile,
		rootAppends(t, live, map[int][]rawEvent{lastOf(ev, 9) + 1: {like(ref, 9, evEFIVarAuth, ev[mokRTAt].data, ev[mokRTAt].data)}}))
}
