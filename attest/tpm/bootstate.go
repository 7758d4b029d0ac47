package tpm

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"path"
	"strings"

	"github.com/google/go-eventlog/extract"
	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest"
)

// bootState reads what replayed events establish about the boot, as the
// boot's sequence (the order a UEFI boot measures in: the TCG PC Client
// Platform Firmware Profile; docs/tpm.md, "The boot's sequence"), never
// "last value wins". Events whose meaning is in their data (UEFI
// variables, separators, EFI actions, GRUB commands) are used only when
// their data hashes to their replayed digest. It refuses, each with its
// own reason:
//   - PCR 7 before its separator: EV_EFI_VARIABLE_DRIVER_CONFIG (each
//     variable once: EventLogVariableRepeated; SecureBoot, PK, KEK under
//     the EFI global variable GUID and db, dbx under the image security
//     database GUID: EventLogVariableGUID; data matching the digest and
//     parsing: EventLogMalformed), EV_EFI_VARIABLE_AUTHORITY, and the
//     EV_EFI_ACTION "DMA Protection Disabled"; "UEFI Debug Mode" is
//     UEFIDebuggerPresent; any other type EventLogUnexpectedEvent;
//   - PCR 7 after its separator: only EV_EFI_VARIABLE_AUTHORITY; a
//     variable (a Secure Boot state or a dbx appended by root) or anything
//     else is EventLogOutOfOrder;
//   - separators in PCRs 0-7: at most one each (EventLogOutOfOrder), data
//     00 00 00 00 matching the digest (EventLogUnexpectedEvent); an event
//     of another type whose digest is a separator's (a relabelled
//     separator: types are not measured) is EventLogUnexpectedEvent;
//   - after ExitBootServices (the EV_EFI_ACTION "Exit Boot Services
//     Invocation" in PCR 5): no event in PCRs 0-9 but PCR 5's "Exit Boot
//     Services Returned …" actions (EventLogOutOfOrder): the OS measures
//     elsewhere (IMA 10, systemd 11-15);
//   - SecureBoot is one byte, 0 or 1 (empty data reads as off, as an unset
//     variable; anything else is EventLogUnexpectedEvent); on, it needs
//     PK, KEK and db measured and at least one authority
//     (EventLogUnexpectedEvent);
//   - Secure Boot authorities (authority.go): data matching the digest
//     (less one trailing byte, an old shim's bug) and parsing as a
//     UEFI_VARIABLE_DATA holding a certificate or a hash entry
//     (EventLogMalformed); db and vendor_db under the image security
//     database GUID, the shim's names (MokListRT, MokList, Shim,
//     SbatLevel, MokSBState, MokListTrusted) under the shim's
//     (EventLogVariableGUID); the shim's only after the first boot
//     application and PCR 7's separator (EventLogOutOfOrder); the
//     shim's state (SbatLevel, MokSBState, MokListTrusted) each once
//     (EventLogVariableRepeated), before any authority measured after
//     the first application (EventLogOutOfOrder), a SbatLevel that
//     parses (EventLogMalformed); the same authority measured twice by
//     the firmware, or by a shim that measures SbatLevel (both measure
//     each once), is EventLogVariableRepeated;
//   - the shim's PCR 14 logs (EV_IPL named MokList, MokListX, MokSBState,
//     MokListTrusted, MokPolicy; the name is not measured): only in PCR
//     14 (elsewhere EventLogUnexpectedEvent), after the first boot
//     application and before ExitBootServices, PCR 14's first events, in
//     that order, each once (EventLogOutOfOrder, EventLogVariableRepeated);
//     MokSBState logged in PCR 14 exactly when measured in PCR 7, and
//     MokListTrusted's value the same in both (EventLogUnexpectedEvent);
//   - an authority outside PCR 7 is EventLogUnexpectedEvent.
//
// What it establishes:
//   - Secure Boot and the digests of PK, KEK, db and dbx (dbx's entries
//     counted and its SHA-256 entries listed), from PCR 7 before its
//     separator;
//   - the boot applications: PCR 4 EV_EFI_BOOT_SERVICES_APPLICATION events
//     after PCR 4's separator (and before ExitBootServices: nothing may
//     follow it); a log without PCR 4's separator, a partial one, lists
//     every PCR 4 application; the shim and the boot loader are the first
//     two;
//   - the kernel, by content, only when ExitBootServices is in the log:
//     the first application measured after GRUB's measured `linux`
//     command (PCR 8; the image GRUB then loads through the shim), else an
//     application whose image file is vmlinuz* (systemd-boot); otherwise
//     unknown;
//   - who verified each boot application, and with which authority
//     (authority.go's rule: each verifier's authorities are a set; one
//     names the signer, several leave it ambiguous), the authorities
//     themselves, and the shim's state: its SBAT level, its MokList,
//     MokListX and MokListTrusted measurements, its validation;
//   - the kernel command line, from GRUB's measured commands (PCRs 8/9,
//     go-eventlog's GRUB extractor), only where what GRUB measured, not
//     how the log labels it, agrees (grubCmdlineConsistent): the label of
//     an event is not measured, so root can relabel the real command line
//     as another command and append a forged one; otherwise unknown, which
//     a pool with command-line rules refuses.
//
// The log's interleaving across PCRs is not covered by the replay (each
// PCR's own sequence is): docs/tpm.md says what that leaves and how PCR
// reference values close it.
func bootState(events []tcg.Event, bank crypto.Hash) (attest.BootState, error) {
	r := bootReader{bank: bank, seen: map[string]bool{}, shimVars: map[string]bool{}, pcr4Sep: hasSeparator(events, 4)}
	r.bs.LogEvents = len(events)
	for i, e := range events {
		if err := r.event(i, e); err != nil {
			return r.bs, err
		}
	}
	return r.finish()
}

// bootReader is bootState's state between events.
type bootReader struct {
	bank        crypto.Hash
	bs          attest.BootState
	replayed    [lastSRTMPCR + 1]bool
	separator   [8]bool
	seen        map[string]bool // UEFI variables measured
	pk, kek, db bool            // non-empty
	pcr4Sep     bool            // the log has PCR 4's separator
	grubEvents  []tcg.Event
	grubUsable  bool
	grubSeen    bool
	afterLinux  bool   // GRUB's linux command measured, its image not yet
	vmlinuz     string // the first application whose image file is vmlinuz*

	// Secure Boot authorities and the shim (authority.go).
	appsRan      int  // boot applications measured so far: PCR 4's, and PCR 2's after its separator (a CC log's shim)
	firstInPCR2  bool // the first application ran from PCR 2, so BootApplications[0] is not it
	auths        []authEvent
	authAfterApp bool            // an authority measured after the first application
	shimSeen     bool            // a measurement only the shim makes
	sbatSeen     bool            // the shim measured its SbatLevel (15.4 on)
	shimVars     map[string]bool // the shim's state variables measured into PCR 7
	shim         attest.ShimState
	pcr14Seen    [5]bool // the shim's PCR 14 logs (shimPCR14Order)
	pcr14Next    int     // the next of them the order allows
	pcr14Other   bool    // a PCR 14 event not the shim's
}

func (r *bootReader) event(i int, e tcg.Event) error {
	bs := &r.bs
	if e.Index >= 0 && e.Index <= lastSRTMPCR {
		r.replayed[e.Index] = true
	}
	if bs.ExitBootServices && e.Index <= 9 {
		if e.Index == 5 && e.Type == tcg.EFIAction && strings.HasPrefix(string(e.Data), "Exit Boot Services Returned") &&
			dataMatchesDigest(e.Data, e.Digest, r.bank) {
			return nil
		}
		return attest.Deny(attest.ReasonEventLogOutOfOrder, "event %d (%s in PCR %d) comes after ExitBootServices, when the OS already ran", i, e.Type, e.Index)
	}
	if e.Type != tcg.Separator && e.Index <= 7 && (dataMatchesDigest([]byte{0, 0, 0, 0}, e.Digest, r.bank) || dataMatchesDigest([]byte{0xff, 0xff, 0xff, 0xff}, e.Digest, r.bank)) {
		// An event's type is not measured: a separator relabelled as
		// another type would hide where its PCR's sequence turns.
		return attest.Deny(attest.ReasonEventLogUnexpected, "event %d: a separator's measurement logged as %s in PCR %d", i, e.Type, e.Index)
	}
	if e.Type == tcg.Separator && e.Index <= 7 {
		if r.separator[e.Index] {
			return attest.Deny(attest.ReasonEventLogOutOfOrder, "event %d: a second separator in PCR %d", i, e.Index)
		}
		if !bytes.Equal(e.Data, []byte{0, 0, 0, 0}) || !dataMatchesDigest(e.Data, e.Digest, r.bank) {
			return attest.Deny(attest.ReasonEventLogUnexpected, "event %d: the separator of PCR %d is not 00 00 00 00 (an error separator, or data that does not match its digest)", i, e.Index)
		}
		r.separator[e.Index] = true
		return nil
	}
	switch {
	case e.Index != 14 && shimPCR14Label(e) >= 0:
		return attest.Deny(attest.ReasonEventLogUnexpected, "event %d: the shim's %s logged in PCR %d (the shim logs it only into PCR 14)", i, bytes.TrimRight(e.Data, "\x00"), e.Index)
	case e.Index != 7 && e.Type == tcg.EFIVariableAuthority:
		return attest.Deny(attest.ReasonEventLogUnexpected, "event %d: a Secure Boot authority in PCR %d (firmware and the shim measure them only into PCR 7)", i, e.Index)
	}
	switch e.Index {
	case 14:
		return r.pcr14(i, e)
	case 7:
		return r.pcr7(i, e)
	case 5:
		if e.Type == tcg.EFIAction && string(e.Data) == "Exit Boot Services Invocation" && dataMatchesDigest(e.Data, e.Digest, r.bank) {
			bs.ExitBootServices = true
		}
	case 4:
		if e.Type != tcg.EFIBootServicesApplication || (r.pcr4Sep && !r.separator[4]) {
			return nil
		}
		d := hex.EncodeToString(e.Digest)
		bs.BootApplications = append(bs.BootApplications, d)
		r.appsRan++
		if r.afterLinux {
			bs.Kernel, bs.KernelBy, r.afterLinux = d, "grub-linux-command", false
		}
		if r.vmlinuz == "" && strings.HasPrefix(strings.ToLower(path.Base(strings.ReplaceAll(imageFileName(e.Data), `\`, "/"))), "vmlinuz") {
			r.vmlinuz = d
		}
	case 2:
		// On a confidential VM's log (TDX: RTMR 1 read as PCR 2) the
		// firmware measures the first application, the shim, here.
		if e.Type == tcg.EFIBootServicesApplication && r.separator[2] {
			if r.appsRan == 0 {
				r.firstInPCR2 = true
			}
			r.appsRan++
		}
	case 8, 9:
		// go-eventlog's GRUB extractor reads only EV_IPL and EV_EVENT_TAG;
		// other types there mean another loader.
		if !r.grubSeen {
			r.grubSeen, r.grubUsable = true, true
		}
		if e.Type != tcg.Ipl && e.Type != tcg.EventTag {
			r.grubUsable = false
		}
		r.grubEvents = append(r.grubEvents, e)
		if e.Index == 8 && e.Type == tcg.Ipl && bs.Kernel == "" && grubLinuxCommand(e.Data, e.Digest, r.bank) {
			r.afterLinux = true
		}
	}
	return nil
}

func (r *bootReader) finish() (attest.BootState, error) {
	bs := &r.bs
	if bs.SecureBoot && !(r.pk && r.kek && r.db && len(r.auths) > 0) {
		return *bs, attest.Deny(attest.ReasonEventLogUnexpected, "Secure Boot is on, but PK, KEK and db were not all measured, or no authority verified an image")
	}
	for i, ok := range r.replayed {
		if ok {
			bs.ReplayedPCRs = append(bs.ReplayedPCRs, i)
		}
	}
	if err := r.attribute(); err != nil {
		return *bs, err
	}
	if len(bs.BootApplications) > 0 {
		bs.Shim = bs.BootApplications[0]
	}
	if len(bs.BootApplications) > 1 {
		bs.Bootloader = bs.BootApplications[1]
	}
	switch {
	case !bs.ExitBootServices:
		// Without the end of the boot in the log, nothing says an
		// application was the boot's own: the kernel is unknown.
		bs.Kernel, bs.KernelBy = "", ""
	case bs.Kernel == "" && r.vmlinuz != "":
		bs.Kernel, bs.KernelBy = r.vmlinuz, "image-file-name"
	}
	if r.grubUsable && len(r.grubEvents) > 0 {
		if grub, err := extract.GrubStateFromTPMLog(r.bank, r.grubEvents); err == nil {
			if k, err := extract.LinuxKernelStateFromGRUB(grub); err == nil && k.GetCommandLine() != "" && grubCmdlineConsistent(r.bank, r.grubEvents) {
				bs.KernelCmdlineKnown = true
				bs.KernelCmdline = strings.TrimRight(k.GetCommandLine(), "\x00")
			}
		}
	}
	return *bs, nil
}

// hasSeparator reports whether the events hold a separator of PCR pcr.
func hasSeparator(events []tcg.Event, pcr int) bool {
	for _, e := range events {
		if e.Index == pcr && e.Type == tcg.Separator {
			return true
		}
	}
	return false
}

// grubLinuxCommand reports whether a GRUB PCR 8 EV_IPL event is its `linux`
// (or `linuxefi`, `linux16`) command as GRUB measured it: "grub_cmd: " (or
// the older "grub_cmd ") and the command, whose digest is the hash of the
// command (with or without its terminating NUL).
func grubLinuxCommand(data, digest []byte, bank crypto.Hash) bool {
	var cmd []byte
	for _, p := range []string{"grub_cmd: ", "grub_cmd "} {
		if bytes.HasPrefix(data, []byte(p)) {
			cmd = data[len(p):]
			break
		}
	}
	if cmd == nil || !(dataMatchesDigest(cmd, digest, bank) || (bytes.HasSuffix(cmd, []byte{0}) && dataMatchesDigest(cmd[:len(cmd)-1], digest, bank))) {
		return false
	}
	for _, c := range []string{"linux ", "linuxefi ", "linux16 "} {
		if bytes.HasPrefix(cmd, []byte(c)) {
			return true
		}
	}
	return false
}

// pcr7 reads one PCR 7 event (not a separator); see bootState.
func (r *bootReader) pcr7(i int, e tcg.Event) error {
	after := r.separator[7]
	switch e.Type {
	case tcg.EFIVariableAuthority:
		return r.authority(i, e)
	case tcg.EFIVariableDriverConfig:
		if after {
			return attest.Deny(attest.ReasonEventLogOutOfOrder, "event %d: a UEFI variable measured into PCR 7 after its separator (firmware measures them before the first boot application)", i)
		}
		return r.variable(i, e)
	case tcg.EFIAction:
		switch {
		case after:
			return attest.Deny(attest.ReasonEventLogOutOfOrder, "event %d: an EFI action in PCR 7 after its separator", i)
		case !dataMatchesDigest(e.Data, e.Digest, r.bank):
			return attest.Deny(attest.ReasonEventLogInvalid, "event %d: PCR 7 action's data does not match its digest", i)
		case string(e.Data) == "UEFI Debug Mode":
			return attest.Deny(attest.ReasonUEFIDebugger, "event %d: the firmware logged UEFI Debug Mode: a debugger was attached during boot", i)
		case string(e.Data) == "DMA Protection Disabled":
			return nil
		}
		return attest.Deny(attest.ReasonEventLogUnexpected, "event %d: an EFI action firmware does not log in PCR 7", i)
	}
	if after {
		return attest.Deny(attest.ReasonEventLogOutOfOrder, "event %d: %s in PCR 7 after its separator (only authorities follow it)", i, e.Type)
	}
	return attest.Deny(attest.ReasonEventLogUnexpected, "event %d: %s is not an event firmware logs in PCR 7", i, e.Type)
}

// variable reads one EV_EFI_VARIABLE_DRIVER_CONFIG before PCR 7's
// separator.
func (r *bootReader) variable(i int, e tcg.Event) error {
	bs := &r.bs
	if !dataMatchesDigest(e.Data, e.Digest, r.bank) {
		return attest.Deny(attest.ReasonEventLogInvalid, "event %d: PCR 7 variable event's data does not match its digest", i)
	}
	v, err := parseUEFIVariable(e.Data)
	if err != nil {
		return attest.Deny(attest.ReasonEventLogInvalid, "event %d: PCR 7 variable event is not a UEFI_VARIABLE_DATA", i)
	}
	name := v.String()
	if r.seen[name] {
		return attest.Deny(attest.ReasonEventLogVariableRepeated, "event %d: UEFI variable %q measured a second time", i, name)
	}
	r.seen[name] = true
	want := map[string][16]byte{
		"SecureBoot": efiGlobalVariableGUID, "PK": efiGlobalVariableGUID, "KEK": efiGlobalVariableGUID,
		"db": efiImageSecurityDatabaseGUID, "dbx": efiImageSecurityDatabaseGUID,
	}
	g, known := want[name]
	if !known {
		return nil // dbt, AuditMode, DeployedMode, …: measured, not read
	}
	if v.guid != g {
		return attest.Deny(attest.ReasonEventLogVariableGUID, "event %d: variable %q is not under its vendor GUID: not that variable", i, name)
	}
	sum := sha256.Sum256(v.data)
	digest := hex.EncodeToString(sum[:])
	switch name {
	case "SecureBoot":
		switch {
		case len(v.data) == 0:
			bs.SecureBoot = false // an empty variable is an unset one
		case len(v.data) == 1 && v.data[0] <= 1:
			bs.SecureBoot = v.data[0] == 1
		default:
			return attest.Deny(attest.ReasonEventLogUnexpected, "event %d: SecureBoot is not 0 or 1", i)
		}
		bs.SecureBootKnown = true
	case "PK":
		bs.PK, r.pk = digest, len(v.data) > 0
	case "KEK":
		bs.KEK, r.kek = digest, len(v.data) > 0
	case "db":
		bs.DB, r.db = digest, len(v.data) > 0
	case "dbx":
		n, hashes, err := signatureLists(v.data)
		if err != nil {
			return attest.Deny(attest.ReasonEventLogInvalid, "event %d: dbx is not a list of EFI_SIGNATURE_LISTs", i)
		}
		bs.DBX, bs.DBXKnown, bs.DBXEntries, bs.DBXSHA256s = digest, true, n, hashes
	}
	return nil
}

// GRUB's PCR 8 labels: a command, and the kernel command line (new and
// old forms). GRUB measures the text after the label (with or without its
// NUL), never the label.
var (
	grubCommandLabels = []string{"grub_cmd: ", "grub_cmd "}
	grubCmdlineLabels = []string{"kernel_cmdline: ", "grub_kernel_cmdline "}
)

// grubText returns the measured text of a GRUB PCR 8 event: after one of
// its labels, the text whose hash is the event's digest (NUL trimmed).
func grubText(e tcg.Event, bank crypto.Hash) (text string, cmdline, ok bool) {
	for _, labels := range [][]string{grubCommandLabels, grubCmdlineLabels} {
		for _, l := range labels {
			rest, found := bytes.CutPrefix(e.Data, []byte(l))
			if !found {
				continue
			}
			if dataMatchesDigest(rest, e.Digest, bank) || (bytes.HasSuffix(rest, []byte{0}) && dataMatchesDigest(rest[:len(rest)-1], e.Digest, bank)) {
				return string(bytes.TrimSuffix(rest, []byte{0})), l == grubCmdlineLabels[0] || l == grubCmdlineLabels[1], true
			}
		}
	}
	return "", false, false
}

// grubCmdlineConsistent reports whether GRUB's measurements establish its
// kernel command line whatever the labels say:
//   - every PCR 8 event is EV_IPL with a GRUB label and a text that hashes
//     to its digest (an event whose text cannot be checked could be the
//     real command line under a label nobody reads);
//   - exactly one measured text, under any label, is a linux command
//     (`linux`, `linuxefi`, `linux16`): a relabelled real one still counts,
//     so a forged one beside it makes two;
//   - exactly one event is labelled the kernel command line, and its text
//     is that command's, less the command word and GRUB's quotes — as GRUB
//     measures it.
func grubCmdlineConsistent(bank crypto.Hash, events []tcg.Event) bool {
	var linux, cmdlines []string
	for _, e := range events {
		if e.Index != 8 {
			continue
		}
		if e.Type != tcg.Ipl {
			return false
		}
		text, isCmdline, ok := grubText(e, bank)
		if !ok {
			return false
		}
		if isCmdline {
			cmdlines = append(cmdlines, text)
		}
		for _, c := range []string{"linux ", "linuxefi ", "linux16 "} {
			if args, found := strings.CutPrefix(text, c); found {
				linux = append(linux, args)
			}
		}
	}
	// GRUB measures the linux command as parsed (its quotes gone) and
	// re-quotes the words that hold spaces in the command line it hands
	// the kernel: the two agree once those quotes are dropped.
	return len(linux) == 1 && len(cmdlines) == 1 && strings.ReplaceAll(cmdlines[0], `"`, "") == linux[0]
}
