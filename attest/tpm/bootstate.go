package tpm

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"

	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest"
)

// bootState reads what replayed events establish about the boot. A quote
// proves each PCR's own sequence of digests and nothing else: not how the
// log interleaves PCRs, nor any event's type (neither is measured), nor
// event data that does not hash to its digest. So bootState splits the
// events by PCR, keeps each PCR's order, reads each PCR alone, and never
// reads an event's type: an event is what its digest says it is — the
// hash of its own data (a UEFI variable, an EFI action, a GRUB command, a
// GPT), a separator (the hash of 00 00 00 00), or, where neither, an
// image or a file. Its verdict is therefore the same for every
// interleaving and every labelling of the same per-PCR digests
// (TestBootStateOnlyWhatTheQuoteProves, FuzzBootStateTransforms), and
// root, which can only append to a PCR after boot, can only add to the
// end of a sequence. It refuses, each with its own reason:
//   - separators (PCRs 0-7, by digest): at most one per PCR
//     (EventLogOutOfOrder); in PCR 7, where every other measurement is a
//     UEFI variable or a known action, an error separator (the hash of
//     01 00 00 00 or FF FF FF FF) is EventLogUnexpectedEvent (elsewhere
//     such a digest is indistinguishable from other data);
//   - PCR 7 before its separator: each event a UEFI variable (data
//     hashing to the digest and parsing as a UEFI_VARIABLE_DATA:
//     EventLogMalformed otherwise) or the EFI action "DMA Protection
//     Disabled"; "UEFI Debug Mode" is UEFIDebuggerPresent; anything else
//     EventLogUnexpectedEvent. The first of each name is the variable
//     (each once: EventLogVariableRepeated; SecureBoot, PK, KEK under the
//     EFI global variable GUID, db and dbx under the image security
//     database GUID: EventLogVariableGUID; SecureBoot one byte, 0 or 1:
//     EventLogUnexpectedEvent); a later db is an authority the firmware
//     measured verifying a driver; the shim's names are
//     EventLogOutOfOrder (the shim runs after the separator);
//   - PCR 7 after its separator: only authorities (a UEFI variable
//     holding one signature database entry) and the shim's state
//     variables; a Secure Boot variable or anything else is
//     EventLogOutOfOrder (authority.go lists the authorities' checks);
//   - PCR 5 after ExitBootServices (its "Exit Boot Services Invocation"
//     action, by digest): only the "Exit Boot Services Returned …"
//     actions (EventLogOutOfOrder);
//   - the shim's PCR 14 logs (events whose data names MokList, MokListX,
//     MokSBState, MokListTrusted, MokPolicy; the name is not measured):
//     PCR 14's first events, in that order, each once
//     (EventLogOutOfOrder, EventLogVariableRepeated); MokSBState logged in
//     PCR 14 exactly when measured in PCR 7, and MokListTrusted's value
//     the same in both (EventLogUnexpectedEvent);
//   - Secure Boot on needs PK, KEK and db measured and at least one
//     authority (EventLogUnexpectedEvent).
//
// What it establishes:
//   - Secure Boot and the digests of PK, KEK, db and dbx (dbx's entries
//     counted and its SHA-256 entries listed), from PCR 7 before its
//     separator;
//   - the boot chain (BootApplications): PCR 2's images after its
//     separator, then PCR 4's, in each PCR's order; OtherImages, every
//     other image digest of PCRs 2 and 4;
//   - who verified each boot application and with which authority
//     (authority.go), and the shim's own state;
//   - ExitBootServices, from PCR 5 alone;
//   - GRUB's commands (PCR 8: each event's text that hashes to its digest,
//     under any label), and from them the kernel command line: the text
//     of the one linux command (`linux`, `linuxefi`, `linux16`) less the
//     command word — with GRUB's quotes where a text equal to it but for
//     quotes says where GRUB put them (GRUB measures the command line it
//     hands the kernel too) — or unknown when there are several linux
//     commands (root appending one makes the command line unknown, never
//     another) or a text that cannot be checked;
//   - the files GRUB read (PCR 9), in order, by digest, with the path the
//     log gives each (not measured: a name, never a fact);
//   - the sections of the unified kernel image systemd-stub ran (PCR 11
//     alone; ukistub.go lists when they are known).
func bootState(events []tcg.Event, bank crypto.Hash) (attest.BootState, error) {
	r := bootReader{bank: bank, seen: map[string]bool{}, shimVars: map[string]bool{}}
	r.bs.LogEvents = len(events)
	var per [lastSRTMPCR + 1][]tcg.Event
	for _, e := range events {
		if e.Index >= 0 && e.Index <= lastSRTMPCR {
			per[e.Index] = append(per[e.Index], e)
		}
	}
	for i, es := range per {
		if len(es) > 0 {
			r.bs.ReplayedPCRs = append(r.bs.ReplayedPCRs, i)
		}
	}
	for i := 0; i <= 7; i++ {
		if err := r.separators(i, per[i]); err != nil {
			return r.bs, err
		}
	}
	steps := []func() error{
		func() error { return r.pcr7(per[7]) },
		func() error { r.chain(per[2], per[4]); return nil },
		func() error { return r.pcr5(per[5]) },
		func() error { r.pcr8(per[8]); return nil },
		func() error { r.pcr9(per[9]); return nil },
		func() error { r.pcr11(per[11]); return nil },
		func() error { return r.pcr14(per[14]) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return r.bs, err
		}
	}
	return r.finish()
}

// bootReader is bootState's state between PCRs.
type bootReader struct {
	bank        crypto.Hash
	bs          attest.BootState
	sepAt       [8]int          // position of each PCR's separator in its own sequence; -1 none
	seen        map[string]bool // UEFI variables measured before PCR 7's separator
	pk, kek, db bool            // non-empty

	// Secure Boot authorities and the shim (authority.go).
	auths      []authEvent
	shimMarked bool            // PCR 7 after its separator holds a measurement only the shim makes
	shimAuthed bool            // the shim measured an authority (its state comes before)
	shimSeen   bool            // the shim ran (PCR 7 or PCR 14 say so)
	sbatSeen   bool            // the shim measured its SbatLevel (15.4 on)
	shimVars   map[string]bool // the shim's state variables measured into PCR 7
	shim       attest.ShimState
	pcr14Seen  [5]bool // the shim's PCR 14 logs (shimPCR14Order)
}

// Digests of the measurements read by their data: what a separator, and
// the EFI actions firmware logs, extend.
var (
	separatorData      = []byte{0, 0, 0, 0}
	errorSeparatorData = [][]byte{{1, 0, 0, 0}, {0xff, 0xff, 0xff, 0xff}}
)

// EFI actions (TCG PC Client PFP), measured as the hash of their text.
const (
	actionCallingApp  = "Calling EFI Application from Boot Option"
	actionReturning   = "Returning from EFI Application from Boot Option"
	actionEBS         = "Exit Boot Services Invocation"
	actionEBSReturned = "Exit Boot Services Returned with Success"
	actionEBSFailed   = "Exit Boot Services Returned with Failure"
	actionDebug       = "UEFI Debug Mode"
	actionDMA         = "DMA Protection Disabled"
)

// is reports whether e's digest is the hash of data (in the bank).
func (r *bootReader) is(e tcg.Event, data []byte) bool {
	return dataMatchesDigest(data, e.Digest, r.bank)
}

// isAction reports whether e's digest is the hash of the EFI action text.
func (r *bootReader) isAction(e tcg.Event, text string) bool { return r.is(e, []byte(text)) }

// selfMeasured reports whether e's digest is the hash of its own data: a
// measurement of that data, not of an image (no image's Authenticode
// hash is the hash of the event describing it).
func (r *bootReader) selfMeasured(e tcg.Event) bool { return r.is(e, e.Data) }

// separators finds PCR i's separator in its sequence: at most one, not an
// error separator.
func (r *bootReader) separators(i int, es []tcg.Event) error {
	r.sepAt[i] = -1
	for j, e := range es {
		for _, bad := range errorSeparatorData {
			if i == 7 && r.is(e, bad) {
				return attest.Deny(attest.ReasonEventLogUnexpected, "PCR %d, event %d of its own: an error separator (%x)", i, j, bad)
			}
		}
		if !r.is(e, separatorData) {
			continue
		}
		if r.sepAt[i] >= 0 {
			return attest.Deny(attest.ReasonEventLogOutOfOrder, "PCR %d, event %d of its own: a second separator", i, j)
		}
		r.sepAt[i] = j
	}
	return nil
}

// afterSeparator is the part of PCR i's sequence after its separator:
// all of it when it has none (a partial log).
func (r *bootReader) afterSeparator(i int, es []tcg.Event) []tcg.Event {
	if r.sepAt[i] < 0 {
		return es
	}
	return es[r.sepAt[i]+1:]
}

// chain reads the boot chain from PCR 2 and PCR 4, each after its
// separator: every digest that is not its own event data's hash is an
// image. What PCR 2 holds after its separator comes first (a confidential
// VM's firmware measures the shim there). Every other image digest of
// either PCR is kept too (OtherImages).
func (r *bootReader) chain(pcr2, pcr4 []tcg.Event) {
	bs := &r.bs
	for _, p := range []struct {
		i  int
		es []tcg.Event
	}{{2, pcr2}, {4, pcr4}} {
		start := r.sepAt[p.i]
		for j, e := range p.es {
			if j == start || r.selfMeasured(e) {
				continue
			}
			d := hex.EncodeToString(e.Digest)
			// PCR 2's images before its separator are drivers and option
			// ROMs; without a separator it holds no chain.
			if j > start && (p.i == 4 || start >= 0) {
				bs.BootApplications = append(bs.BootApplications, d)
				continue
			}
			bs.OtherImages = append(bs.OtherImages, d)
		}
	}
}

// pcr5 reads PCR 5 alone: ExitBootServices, and after it only its
// "Returned" actions.
func (r *bootReader) pcr5(es []tcg.Event) error {
	for j, e := range es {
		if !r.bs.ExitBootServices {
			r.bs.ExitBootServices = r.isAction(e, actionEBS)
			continue
		}
		if !r.isAction(e, actionEBSReturned) && !r.isAction(e, actionEBSFailed) {
			return attest.Deny(attest.ReasonEventLogOutOfOrder, "PCR 5, event %d of its own: measured after ExitBootServices, when the OS already ran", j)
		}
	}
	return nil
}

// GRUB's PCR 8 labels: a command, and the kernel command line (new and
// old forms). GRUB measures the text after the label (with or without its
// NUL), never the label.
var grubLabels = []string{"grub_cmd: ", "grub_cmd ", "kernel_cmdline: ", "grub_kernel_cmdline ", ""}

// measuredText returns the text of a PCR 8 event whose hash is its
// digest: its data after any of GRUB's labels (or none), with or without
// a trailing NUL. Which label the log shows does not matter: it is not
// measured.
func (r *bootReader) measuredText(e tcg.Event) (string, bool) {
	for _, l := range grubLabels {
		rest, found := bytes.CutPrefix(e.Data, []byte(l))
		if !found {
			continue
		}
		if r.is(e, rest) {
			return string(bytes.TrimSuffix(rest, []byte{0})), true
		}
		if t, nul := bytes.CutSuffix(rest, []byte{0}); nul && r.is(e, t) {
			return string(t), true
		}
	}
	return "", false
}

// pcr8 reads GRUB's commands and the kernel command line from PCR 8's
// texts (see bootState).
func (r *bootReader) pcr8(es []tcg.Event) {
	if len(es) == 0 {
		return
	}
	bs := &r.bs
	texts := make([]string, 0, len(es))
	for _, e := range es {
		t, ok := r.measuredText(e)
		if !ok {
			bs.GrubCommands = nil
			return // a text nobody can check could be the real command line
		}
		texts = append(texts, t)
	}
	bs.GrubCommands, bs.GrubCommandsKnown = texts, true
	var args []string
	for _, t := range texts {
		if a, ok := attest.LinuxCommandArgs(t); ok {
			args = append(args, a)
		}
	}
	if len(args) != 1 {
		return
	}
	// GRUB measures the linux command as parsed (its quotes gone) and the
	// command line it hands the kernel with the words that hold spaces
	// quoted again: where exactly one text is that command line, it says
	// where the quotes are.
	cmdline, quoted := args[0], 0
	for _, t := range texts {
		if t != args[0] && strings.Contains(t, `"`) && strings.ReplaceAll(t, `"`, "") == args[0] {
			cmdline, quoted = t, quoted+1
		}
	}
	if quoted > 1 {
		return
	}
	bs.KernelCmdlineKnown, bs.KernelCmdline = true, cmdline
}

// maxFilePath bounds the path kept for a PCR 9 file (it is only a name).
const maxFilePath = 256

// pcr9 reads the files GRUB read: every PCR 9 digest, in order, with the
// path the event's data gives (GRUB logs the path; other measurers a
// description).
func (r *bootReader) pcr9(es []tcg.Event) {
	for _, e := range es {
		r.bs.GrubFiles = append(r.bs.GrubFiles, attest.MeasuredFile{Path: eventName(e.Data), Digest: hex.EncodeToString(e.Digest)})
	}
}

// eventName is an event's data as a name: printable UTF-8 up to its first
// NUL, at most maxFilePath bytes; "" when it is not text.
func eventName(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	if len(b) > maxFilePath || !utf8.Valid(b) {
		return ""
	}
	for _, c := range string(b) {
		if c < 0x20 || c == 0x7f {
			return ""
		}
	}
	return string(b)
}

func (r *bootReader) finish() (attest.BootState, error) {
	bs := &r.bs
	if bs.SecureBoot && !(r.pk && r.kek && r.db && len(r.auths) > 0) {
		return *bs, attest.Deny(attest.ReasonEventLogUnexpected, "Secure Boot is on, but PK, KEK and db were not all measured, or no authority verified an image")
	}
	if err := r.attribute(); err != nil {
		return *bs, err
	}
	return *bs, nil
}

// pcr7 reads PCR 7 (see bootState): before its separator the Secure Boot
// variables and the firmware's driver authorities, after it the
// authorities and the shim's state.
func (r *bootReader) pcr7(es []tcg.Event) error {
	for j, e := range es {
		if j == r.sepAt[7] {
			continue
		}
		after := r.sepAt[7] >= 0 && j > r.sepAt[7]
		switch {
		case r.isAction(e, actionDebug):
			if after {
				return attest.Deny(attest.ReasonEventLogOutOfOrder, "PCR 7, event %d of its own: an EFI action after its separator", j)
			}
			return attest.Deny(attest.ReasonUEFIDebugger, "PCR 7, event %d of its own: the firmware logged UEFI Debug Mode: a debugger was attached during boot", j)
		case r.isAction(e, actionDMA):
			if after {
				return attest.Deny(attest.ReasonEventLogOutOfOrder, "PCR 7, event %d of its own: an EFI action after its separator", j)
			}
			continue
		}
		if !authorityDataMatches(e.Data, e.Digest, r.bank) {
			if _, err := parseUEFIVariable(e.Data); err == nil {
				return attest.Deny(attest.ReasonEventLogInvalid, "PCR 7, event %d of its own: a UEFI variable whose data does not match its digest", j)
			}
			if after {
				return attest.Deny(attest.ReasonEventLogOutOfOrder, "PCR 7, event %d of its own: after its separator, a measurement that is no authority (its data does not hash to its digest)", j)
			}
			return attest.Deny(attest.ReasonEventLogUnexpected, "PCR 7, event %d of its own: neither a UEFI variable nor an action firmware logs there (its data does not hash to its digest)", j)
		}
		v, err := parseUEFIVariable(e.Data)
		if err != nil {
			return attest.Deny(attest.ReasonEventLogInvalid, "PCR 7, event %d of its own: not a UEFI_VARIABLE_DATA", j)
		}
		name := v.String()
		switch {
		case shimStateVars[name] || shimAuthNames[name]:
			if !after {
				return attest.Deny(attest.ReasonEventLogOutOfOrder, "PCR 7, event %d of its own: the shim's %q measured before PCR 7's separator (the shim runs after it)", j, name)
			}
			if err := r.authority(j, e, v); err != nil {
				return err
			}
		case !after && !r.seen[name]:
			if err := r.variable(j, e, v); err != nil {
				return err
			}
		case name == "db" || name == "vendor_db" || after:
			// A database entry that verified an image: before the separator
			// a driver or option ROM, after it a boot application.
			if after && isSecureBootVariable(name) && !isSignatureEntry(v.data) {
				return attest.Deny(attest.ReasonEventLogOutOfOrder, "PCR 7, event %d of its own: the UEFI variable %q measured after PCR 7's separator (firmware measures them before the first boot application)", j, name)
			}
			if err := r.authority(j, e, v); err != nil {
				return err
			}
		default:
			return attest.Deny(attest.ReasonEventLogVariableRepeated, "PCR 7, event %d of its own: UEFI variable %q measured a second time", j, name)
		}
	}
	return nil
}

// isSecureBootVariable reports a name of the Secure Boot configuration.
func isSecureBootVariable(name string) bool {
	switch name {
	case "SecureBoot", "PK", "KEK", "db", "dbx", "dbt", "dbr", "AuditMode", "DeployedMode", "SetupMode":
		return true
	}
	return false
}

// isSignatureEntry reports whether d is one signature database entry (an
// authority's data), not a list of them.
func isSignatureEntry(d []byte) bool {
	_, _, _, ok := signatureEntry(d)
	return ok
}

// variable reads the first measurement of a UEFI variable before PCR 7's
// separator: the Secure Boot configuration.
func (r *bootReader) variable(j int, e tcg.Event, v uefiVariable) error {
	bs := &r.bs
	if !r.is(e, e.Data) {
		return attest.Deny(attest.ReasonEventLogInvalid, "PCR 7, event %d of its own: variable event's data does not match its digest", j)
	}
	name := v.String()
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
		return attest.Deny(attest.ReasonEventLogVariableGUID, "PCR 7, event %d of its own: variable %q is not under its vendor GUID: not that variable", j, name)
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
			return attest.Deny(attest.ReasonEventLogUnexpected, "PCR 7, event %d of its own: SecureBoot is not 0 or 1", j)
		}
		bs.SecureBootKnown = true
	case "PK":
		bs.PK, r.pk = digest, len(v.data) > 0
	case "KEK":
		bs.KEK, r.kek = digest, len(v.data) > 0
		bs.KEKCerts, bs.KEKCertsKnown = certificateEntries(v.data)
	case "db":
		bs.DB, r.db = digest, len(v.data) > 0
		bs.DBCerts, bs.DBCertsKnown = certificateEntries(v.data)
	case "dbx":
		n, hashes, err := signatureLists(v.data)
		if err != nil {
			return attest.Deny(attest.ReasonEventLogInvalid, "PCR 7, event %d of its own: dbx is not a list of EFI_SIGNATURE_LISTs", j)
		}
		bs.DBX, bs.DBXKnown, bs.DBXEntries, bs.DBXSHA256s = digest, true, n, hashes
	}
	return nil
}
