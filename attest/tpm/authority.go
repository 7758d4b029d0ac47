package tpm

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest"
)

// What verified each boot application, read from the log (docs/tpm.md,
// "Who verified each boot application"). Facts it rests on, from the
// TCG PC Client Platform Firmware Profile and the shim's source
// (rhboot/shim: verify.c, mok.c, tpm.c, pe.c):
//
//   - The firmware verifies the first boot application (the shim) against
//     db and measures the db entry that verified it as an
//     EV_EFI_VARIABLE_AUTHORITY into PCR 7, before the image's own PCR 4
//     measurement; drivers and option ROMs it verified before PCR 7's
//     separator were measured the same way. It measures each authority
//     once: an image verified by an entry it already measured adds
//     nothing to the log.
//   - The shim verifies what it loads after it (GRUB, and the kernel GRUB
//     hands it) against db, its MokList (measured as "MokListRT": the
//     vendor certificate mirrored into it, then the machine owner's
//     keys), its built-in vendor certificate ("Shim") or vendor db
//     ("vendor_db"), and measures the entry into PCR 7, each once (since
//     shim 13). Whether that comes before or after the image's PCR 4
//     event depends on its version and path (since 15.6 its loader
//     verifies first; the shim_lock protocol GRUB uses for the kernel
//     measures first), so the position of an authority among the
//     shim's images says nothing.
//   - Before verifying anything the shim measures its own state into
//     PCR 7 (SbatLevel, MokSBState; MokListTrusted until 15.8) and logs
//     MokList, MokListX, MokSBState, MokListTrusted and MokPolicy into
//     PCR 14, in that order, as EV_IPL events whose data is the
//     variable's name and whose digest is its content's.
//   - MokDBState (MokIgnoreDB: the shim ignores db) is neither measured
//     nor logged: the log cannot tell it.
//
// So each verifier's authorities are a set, not a sequence, and which
// verifier measured one is read from PCR 7's own order, never from how the
// log interleaves PCR 7 with PCR 4 (which the quote does not prove): after
// PCR 7's separator, the firmware's come first (it verified the first
// boot application before anything ran); the shim's begin with the first
// measurement only the shim makes (its SbatLevel, MokSBState or
// MokListTrusted, an authority from its MokList, "Shim" or "vendor_db",
// or a bare certificate). The firmware's verified the first boot
// application (where it measured none after the separator, those it
// measured before, which it does not measure again); the shim's verified
// every later one. When a verifier measured exactly one authority, that
// one verified each image it checked; when several, the log does not say
// which verified which, and each of its images lists them all as possible
// signers (attest.BootState.Signer then refuses, BootSignerAmbiguous).
// One exception, from PCR 7's and PCR 4's own orders: the first image the
// shim verified (the chain's second) used the first authority it
// measured, and where the shim measured its SbatLevel first that
// authority is known (one root appends comes after it). Root appending
// an authority can only add a possible signer, never name one.

// The shim's vendor GUID (SHIM_LOCK_GUID, 605DAB50-E046-4300-ABB6-3DD810DD8B23),
// as stored, and the signature types of the entries it measures.
var (
	shimLockGUID = [16]byte{0x50, 0xab, 0x5d, 0x60, 0x46, 0xe0, 0x00, 0x43, 0xab, 0xb6, 0x3d, 0xd8, 0x10, 0xdd, 0x8b, 0x23}
	// efiCertX509GUID is EFI_CERT_X509_GUID (A5C059A1-94E4-4AA7-87B5-AB155C2BF072).
	efiCertX509GUID = []byte{0xa1, 0x59, 0xc0, 0xa5, 0xe4, 0x94, 0xa7, 0x4a, 0x87, 0xb5, 0xab, 0x15, 0x5c, 0x2b, 0xf0, 0x72}
)

// The shim's own measurements: its state variables in PCR 7 (the
// authority event type, the variable's data), and its PCR 14 logs in the
// order mok.c's table makes them.
var (
	shimStateVars  = map[string]bool{"SbatLevel": true, "SBAT": true, "MokSBState": true, "MokListTrusted": true}
	shimAuthNames  = map[string]bool{"MokListRT": true, "MokList": true, "Shim": true}
	shimPCR14Order = []string{"MokList", "MokListX", "MokSBState", "MokListTrusted", "MokPolicy"}
)

// authEvent is one authority (a signature database entry) read from
// PCR 7.
type authEvent struct {
	attest.SecureBootAuthority
	raw  string // name, GUID and data as measured: the same measurement twice is a repeat
	data []byte // the variable's data: the entry (an EFI_SIGNATURE_DATA, or a bare certificate)
}

// key identifies the authority's entry (a certificate or a hash).
func (a *authEvent) key() string {
	if a.Hash {
		return "hash:" + a.SHA256
	}
	return "cert:" + a.SHA256
}

// shimPCR14Label returns the index in shimPCR14Order of a PCR 14 event
// the shim logs (its data is the variable's name and a NUL; its type is
// not read), or -1.
func shimPCR14Label(e tcg.Event) int {
	for i, n := range shimPCR14Order {
		if len(e.Data) == len(n)+1 && string(e.Data[:len(n)]) == n && e.Data[len(n)] == 0 {
			return i
		}
	}
	return -1
}

// authorityDataMatches reports whether an authority event's data hashes
// to its digest: as measured, or less one trailing byte (shims before
// commit 8a27a48, 2019, logged one byte more than they measured; the
// variable's own lengths say where it ends).
func authorityDataMatches(data, digest []byte, bank crypto.Hash) bool {
	return dataMatchesDigest(data, digest, bank) || (len(data) > 0 && dataMatchesDigest(data[:len(data)-1], digest, bank))
}

// authority reads one authority in PCR 7 (a UEFI variable v holding one
// signature database entry), or one of the shim's state variables, at
// position j of PCR 7's own sequence; see bootState.
func (r *bootReader) authority(j int, e tcg.Event, v uefiVariable) error {
	if !authorityDataMatches(e.Data, e.Digest, r.bank) {
		return attest.Deny(attest.ReasonEventLogInvalid, "PCR 7, event %d of its own: authority's data does not match its digest", j)
	}
	name := v.String()
	before := r.sepAt[7] < 0 || j < r.sepAt[7]
	shimLock := v.guid == shimLockGUID
	switch {
	case shimStateVars[name] || shimAuthNames[name]:
		if !shimLock {
			return attest.Deny(attest.ReasonEventLogVariableGUID, "PCR 7, event %d of its own: %q is not under the shim's vendor GUID: not the shim's", j, name)
		}
		r.shimMarked, r.shimSeen = true, true
	case name == "db" || name == "vendor_db":
		if v.guid != efiImageSecurityDatabaseGUID {
			return attest.Deny(attest.ReasonEventLogVariableGUID, "PCR 7, event %d of its own: authority %q is not under the image security database GUID: not that database", j, name)
		}
		if name == "vendor_db" {
			r.shimMarked, r.shimSeen = true, true
		}
	}
	if shimStateVars[name] {
		return r.shimStateVar(j, name, v.data)
	}
	a := authEvent{raw: name + "\x00" + string(v.guid[:]) + "\x00" + string(v.data), data: v.data}
	a.Variable, a.BeforeSeparator = name, before
	owner, cert, hash, ok := signatureEntry(v.data)
	if !ok {
		return attest.Deny(attest.ReasonEventLogInvalid, "PCR 7, event %d of its own: authority %q is neither a certificate nor a hash entry", j, name)
	}
	switch {
	case cert != nil:
		sum := sha256.Sum256(cert)
		a.SHA256 = hex.EncodeToString(sum[:])
		if c, err := x509.ParseCertificate(cert); err == nil {
			a.Subject = c.Subject.String()
		}
	default:
		a.Hash, a.SHA256 = true, hex.EncodeToString(hash)
	}
	if owner != nil {
		a.Owner = guidString(owner)
	} else if !before {
		// Only old shims measured a bare certificate (firmware measures
		// the EFI_SIGNATURE_DATA): this one is the shim's.
		r.shimMarked, r.shimSeen = true, true
	}
	a.By = attest.VerifierFirmware
	if r.shimMarked && !before {
		a.By = attest.VerifierShim
		r.shimAuthed = true
	}
	r.auths = append(r.auths, a)
	return nil
}

// shimStateVar reads one of the shim's state variables measured into
// PCR 7: each once, before any authority the shim measured (it measures
// its state before it verifies anything).
func (r *bootReader) shimStateVar(i int, name string, data []byte) error {
	key := name
	if name == "SBAT" {
		key = "SbatLevel" // the name before shim 15.4
	}
	if r.shimVars[key] {
		return attest.Deny(attest.ReasonEventLogVariableRepeated, "event %d: the shim's %s measured a second time", i, key)
	}
	if r.shimAuthed {
		return attest.Deny(attest.ReasonEventLogOutOfOrder, "PCR 7, event %d of its own: the shim's %s measured after an authority the shim measured (it measures its state first)", i, key)
	}
	r.shimVars[key] = true
	st := &r.shim
	switch key {
	case "SbatLevel":
		date, gens, err := ParseSBATLevel(data)
		if err != nil {
			return attest.Deny(attest.ReasonEventLogInvalid, "event %d: SbatLevel: %v", i, err)
		}
		st.SBATLevelKnown, st.SBATDate, st.SBAT = true, date, gens
		r.sbatSeen = true
	case "MokSBState":
		st.ValidationDisabled = len(data) > 0 && data[0] != 0
	case "MokListTrusted":
		if len(data) != 1 || data[0] > 1 {
			return attest.Deny(attest.ReasonEventLogUnexpected, "event %d: MokListTrusted is not 0 or 1", i)
		}
		st.MokListTrustedKnown, st.MokListTrustedOn = true, data[0] == 1
	}
	return nil
}

// pcr14 reads PCR 14's own sequence; see bootState. The label of a
// shim's PCR 14 event (the variable's name) is not measured, only the
// content's digest: so the shim's events must be PCR 14's first, in the
// shim's order, each once, or root could swap two labels (call MokListX's
// placeholder "MokList") or hide one.
func (r *bootReader) pcr14(es []tcg.Event) error {
	next, other := 0, false
	for i, e := range es {
		idx := shimPCR14Label(e)
		if idx < 0 {
			other = true
			continue
		}
		name := shimPCR14Order[idx]
		switch {
		case r.pcr14Seen[idx]:
			return attest.Deny(attest.ReasonEventLogVariableRepeated, "PCR 14, event %d of its own: the shim's %s logged a second time", i, name)
		case other:
			return attest.Deny(attest.ReasonEventLogOutOfOrder, "PCR 14, event %d of its own: the shim's %s after another event there (the shim's come first)", i, name)
		case idx < next || (next == 0 && idx != 0):
			return attest.Deny(attest.ReasonEventLogOutOfOrder, "PCR 14, event %d of its own: the shim's %s out of its order (%s)", i, name, strings.Join(shimPCR14Order, ", "))
		}
		r.pcr14Seen[idx], next, r.shimSeen = true, idx+1, true
		d := hex.EncodeToString(e.Digest)
		st := &r.shim
		switch name {
		case "MokList":
			st.MokList, st.MokListEmpty = d, bytes.Equal(e.Digest, placeholderDigest(r.bank))
		case "MokListX":
			st.MokListX, st.MokListXEmpty = d, bytes.Equal(e.Digest, placeholderDigest(r.bank))
		case "MokListTrusted":
			st.MokListTrusted = d
			for _, b := range []byte{0, 1} {
				if dataMatchesDigest([]byte{b}, e.Digest, r.bank) {
					if st.MokListTrustedKnown && st.MokListTrustedOn != (b == 1) {
						return attest.Deny(attest.ReasonEventLogUnexpected, "PCR 14, event %d of its own: MokListTrusted is not the value in PCR 7", i)
					}
					st.MokListTrustedKnown, st.MokListTrustedOn = true, b == 1
				}
			}
		}
	}
	return nil
}

// placeholderDigest is the digest of the shim's empty key list: one
// EFI_CERT_SHA256 entry of zeros owned by the shim (mok.c: "We always
// want to create our key databases").
func placeholderDigest(bank crypto.Hash) []byte {
	entry := append(append([]byte(nil), shimLockGUID[:]...), make([]byte, 32)...)
	h := bank.New()
	h.Write(oneEntryList(efiCertSHA256GUID, entry))
	return h.Sum(nil)
}

// oneEntryList is an EFI_SIGNATURE_LIST of one entry (owner GUID and
// data) of signature type typ.
func oneEntryList(typ, entry []byte) []byte {
	b := append([]byte(nil), typ...)
	b = binary.LittleEndian.AppendUint32(b, uint32(28+len(entry)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(entry)))
	return append(b, entry...)
}

// attribute finishes what bootState read of PCRs 7 and 14: who measured
// each authority, the repeats the verifiers never make, the list of
// authorities, and each boot application's possible signers (see the
// comment at the top of this file).
func (r *bootReader) attribute() error {
	bs := &r.bs
	shimRan := r.shimSeen
	seen := map[string]bool{}
	listed := map[string]bool{}
	for _, a := range r.auths {
		k := a.By + "\x00" + a.raw
		// The firmware measures each authority once (TCG PC Client PFP),
		// and so does every shim that measures its SbatLevel (15.4 on);
		// older shims measured each use.
		if seen[k] && (a.By == attest.VerifierFirmware || r.sbatSeen) {
			return attest.Deny(attest.ReasonEventLogVariableRepeated, "the %s measured authority %s (%s) twice: it measures each once", a.By, a.Variable, short(a.SHA256))
		}
		seen[k] = true
		id := fmt.Sprint(a.By, a.BeforeSeparator, a.Variable, a.key())
		if !listed[id] {
			listed[id] = true
			bs.Authorities = append(bs.Authorities, a.SecureBootAuthority)
		}
	}
	signers := func(keep func(a *authEvent) bool) []string {
		var out []string
		have := map[string]bool{}
		for i := range r.auths {
			a := &r.auths[i]
			if keep(a) && !have[a.key()] {
				have[a.key()] = true
				out = append(out, a.SHA256)
			}
		}
		return out
	}
	first := signers(func(a *authEvent) bool { return a.By == attest.VerifierFirmware && !a.BeforeSeparator })
	if len(first) == 0 {
		first = signers(func(a *authEvent) bool { return a.BeforeSeparator })
	}
	later := signers(func(a *authEvent) bool { return a.By == attest.VerifierFirmware })
	if shimRan {
		later = signers(func(a *authEvent) bool { return a.By == attest.VerifierShim })
	}
	secureBoot := bs.SecureBootKnown && bs.SecureBoot
	bs.AppVerifications = make([]attest.AppVerification, len(bs.BootApplications))
	for i := range bs.BootApplications {
		v := &bs.AppVerifications[i]
		switch {
		case !secureBoot:
		case i == attest.StageShim:
			v.Verifier, v.Signers = attest.VerifierFirmware, first
		case shimRan && r.shim.ValidationDisabled:
		case shimRan:
			v.Verifier, v.Signers = attest.VerifierShim, later
		default:
			v.Verifier, v.Signers = attest.VerifierFirmware, later
		}
	}
	// The first image the shim verified used the first authority it
	// measured: nothing was in its list before. Where the shim measured
	// its SbatLevel first, PCR 7's own order (which the quote proves) says
	// which authority that is — one root appends comes after it — so that
	// image's signer is known even when the shim used several.
	if shimRan && r.sbatSeen && len(later) > 1 {
		first := attest.StageBootloader
		if first < len(bs.BootApplications) && bs.AppVerifications[first].Verifier == attest.VerifierShim {
			var s1 string
			for i := range r.auths {
				if r.auths[i].By == attest.VerifierShim {
					s1 = r.auths[i].SHA256
					break
				}
			}
			for i, d := range bs.BootApplications {
				if d == bs.BootApplications[first] && bs.AppVerifications[i].Verifier == attest.VerifierShim {
					bs.AppVerifications[i].Signers = []string{s1}
				}
			}
		}
	}
	if !shimRan {
		return nil
	}
	if r.pcr14Replayed() && r.shimVars["MokSBState"] != r.pcr14Seen[2] {
		return attest.Deny(attest.ReasonEventLogUnexpected, "the shim measures MokSBState into PCR 7 and logs it into PCR 14; the log has it in only one")
	}
	if r.shim.MokList != "" {
		r.shim.MokListOnly = r.mokListOnly()
	}
	st := r.shim
	bs.ShimState = &st
	return nil
}

// pcr14Replayed reports whether PCR 14 has replayed events.
func (r *bootReader) pcr14Replayed() bool { return slices.Contains(r.bs.ReplayedPCRs, 14) }

// mokListOnly is the SHA256 of the certificate MokList holds alone, when
// its digest is that of a one-entry list of a certificate the shim
// measured as an authority; "" otherwise.
func (r *bootReader) mokListOnly() string {
	want, _ := hex.DecodeString(r.shim.MokList)
	for i := range r.auths {
		a := &r.auths[i]
		if a.By != attest.VerifierShim || a.Hash {
			continue
		}
		entry := a.data
		if a.Owner == "" {
			// A bare certificate: the shim mirrors it owned by itself.
			entry = append(append([]byte(nil), shimLockGUID[:]...), entry...)
		}
		h := r.bank.New()
		h.Write(oneEntryList(efiCertX509GUID, entry))
		if bytes.Equal(h.Sum(nil), want) {
			return a.SHA256
		}
	}
	return ""
}

// signatureEntry reads an authority's data: an EFI_SIGNATURE_DATA (the
// owner GUID, then an X.509 certificate in DER, or an image's SHA-256 or
// SHA-1 hash), or a bare DER certificate (old shims).
func signatureEntry(d []byte) (owner, cert, hash []byte, ok bool) {
	switch {
	case len(d) > 16 && isDERSequence(d[16:]):
		return d[:16], d[16:], nil, true
	case isDERSequence(d):
		return nil, d, nil, true
	case len(d) == 16+sha256.Size || len(d) == 16+20:
		return d[:16], nil, d[16:], true
	}
	return nil, nil, nil, false
}

// isDERSequence reports whether b is exactly one DER SEQUENCE (tag, then
// a definite length that covers the rest of b).
func isDERSequence(b []byte) bool {
	if len(b) < 2 || b[0] != 0x30 {
		return false
	}
	n, rest := int(b[1]), b[2:]
	if n >= 0x80 {
		k := n & 0x7f
		if k == 0 || k > 4 || len(rest) < k || rest[0] == 0 {
			return false
		}
		n = 0
		for _, c := range rest[:k] {
			n = n<<8 | int(c)
		}
		if n < 0x80 {
			return false
		}
		rest = rest[k:]
	}
	return n == len(rest)
}

// guidString formats a GUID as stored (the first three fields
// little-endian) the way it is written.
func guidString(g []byte) string {
	return fmt.Sprintf("%08x-%04x-%04x-%x-%x", binary.LittleEndian.Uint32(g[0:4]), binary.LittleEndian.Uint16(g[4:6]),
		binary.LittleEndian.Uint16(g[6:8]), g[8:10], g[10:16])
}

func short(hexDigest string) string {
	if len(hexDigest) > 12 {
		return hexDigest[:12] + "…"
	}
	return hexDigest
}

// Bounds of an SbatLevel: the variable is a few lines.
const (
	maxSBATLines     = 256
	maxSBATComponent = 64
	maxSBATBytes     = maxSBATLines * (maxSBATComponent + 16)
)

// ParseSBATLevel reads the shim's SbatLevel (SBAT.md): CSV lines, the
// first "sbat,<version>,<datestamp>", each other "<component>,<generation>"
// (the lowest generation of that component the shim still boots, at
// least 1); a trailing NUL is allowed. Each component once; at most
// maxSBATBytes and maxSBATLines. `nodeproof policy revoke --sbat-level`
// reads the same text (shim's SbatLevel_Variable.txt payloads).
func ParseSBATLevel(b []byte) (date string, gens map[string]int, err error) {
	if len(b) > maxSBATBytes {
		return "", nil, fmt.Errorf("%d bytes (at most %d)", len(b), maxSBATBytes)
	}
	s := strings.TrimRight(string(b), "\x00")
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) > maxSBATLines {
		return "", nil, fmt.Errorf("%d lines (at most %d)", len(lines), maxSBATLines)
	}
	head := strings.Split(lines[0], ",")
	if len(head) != 3 || head[0] != "sbat" || !digits(head[1]) || !digits(head[2]) {
		return "", nil, fmt.Errorf("first line %q is not sbat,<version>,<datestamp>", truncate(lines[0], 40))
	}
	gens = map[string]int{}
	for _, l := range lines[1:] {
		f := strings.Split(l, ",")
		if len(f) != 2 || !componentName(f[0]) || !digits(f[1]) {
			return "", nil, fmt.Errorf("line %q is not <component>,<generation>", truncate(l, 40))
		}
		g, err := strconv.Atoi(f[1])
		if err != nil || g < 1 || g > 1<<30 {
			return "", nil, fmt.Errorf("generation %q", truncate(f[1], 12))
		}
		if _, dup := gens[f[0]]; dup {
			return "", nil, fmt.Errorf("component %q twice", f[0])
		}
		gens[f[0]] = g
	}
	return head[2], gens, nil
}

func digits(s string) bool {
	if s == "" || len(s) > 12 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func componentName(s string) bool {
	if s == "" || len(s) > maxSBATComponent {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
