package firmwaretestdata

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"unicode/utf16"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
)

// ReadSecureBoot sets e's Authorities, Signers, SbatLevel, MokList,
// MokListX and MokListTrusted from a log's SHA-256 events, read with
// go-eventlog's parsers and crypto/x509 only (never nodeproof's own
// extraction, which TestFirmwareLogs checks against them):
//   - authorities: the PCR 7 EV_EFI_VARIABLE_AUTHORITY events but the
//     shim's SbatLevel and MokListTrusted, their certificate parsed by
//     go-eventlog (tcg.ParseUEFIVariableAuthority, bare certificates of
//     old shims included), each (by, variable, certificate) once; "by" is
//     the firmware before the first boot application ran (a PCR 4
//     application, or a PCR 2 one after PCR 2's separator: a TDX log's
//     shim) and the shim after it;
//   - signers, with Secure Boot on (e.SecureBoot "on"): the first boot
//     application's (the first of the boot chain: a TDX log's is in PCR
//     2) is the firmware's one authority, every later one's the shim's
//     one authority (a chain of one application, a UKI the firmware ran:
//     its one authority); a log where either measured more than one is an
//     error (write those by hand);
//   - the SbatLevel's text, and the digests of the PCR 14 EV_IPL events
//     whose data is "MokList", "MokListX" and "MokListTrusted".
func (e *Expected) ReadSecureBoot(raw []byte) error {
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return err
	}
	e.Authorities, e.Signers, e.SbatLevel, e.MokList, e.MokListX, e.MokListTrusted = nil, nil, "", "", "", ""
	apps, sep2, sep7 := 0, false, false
	seen := map[string]bool{}
	var firmware, shim []string
	for _, ev := range el.Events(register.HashSHA256) {
		switch {
		case ev.Type == tcg.Separator && ev.Index == 2:
			sep2 = true
		case ev.Type == tcg.Separator && ev.Index == 7:
			sep7 = true
		case ev.Type == tcg.EFIBootServicesApplication && (ev.Index == 4 || ev.Index == 2 && sep2):
			apps++
		case ev.Type == tcg.Ipl && ev.Index == 14:
			d := hex.EncodeToString(ev.Digest)
			switch string(ev.Data) {
			case "MokList\x00":
				e.MokList = d
			case "MokListX\x00":
				e.MokListX = d
			case "MokListTrusted\x00":
				e.MokListTrusted = d
			}
		case ev.Type == tcg.EFIVariableAuthority && ev.Index == 7:
			v, err := tcg.ParseUEFIVariableData(bytes.NewReader(ev.Data))
			if err != nil {
				return err
			}
			name := string(utf16.Decode(v.UnicodeName))
			switch name {
			case "SbatLevel":
				e.SbatLevel = string(v.VariableData)
				continue
			case "MokListTrusted":
				continue
			}
			a, err := tcg.ParseUEFIVariableAuthority(v)
			if err != nil && !errors.Is(err, tcg.ErrSigMissingGUID) {
				return fmt.Errorf("authority %q: %w", name, err)
			}
			if len(a.Certs) != 1 {
				return fmt.Errorf("authority %q holds %d certificates", name, len(a.Certs))
			}
			c := a.Certs[0]
			sum := sha256.Sum256(c.Raw)
			fp := hex.EncodeToString(sum[:])
			by := "firmware"
			if sep7 && apps > 0 {
				by = "shim"
			}
			if seen[by+name+fp] {
				continue
			}
			seen[by+name+fp] = true
			e.Authorities = append(e.Authorities, Authority{By: by, Variable: name, SHA256: fp, Subject: c.Subject.String()})
			if by == "firmware" {
				firmware = append(firmware, fp)
			} else {
				shim = append(shim, fp)
			}
		}
	}
	if e.SecureBoot != "on" {
		return nil
	}
	if len(firmware) == 1 && len(shim) == 0 && len(e.BootApplications) == 1 {
		e.Signers = firmware // one application the firmware ran (a UKI)
		return nil
	}
	if len(firmware) != 1 || len(shim) != 1 {
		return fmt.Errorf("%d firmware and %d shim authorities: write the signers by hand", len(firmware), len(shim))
	}
	for i := range e.BootApplications {
		if i == 0 {
			e.Signers = append(e.Signers, firmware[0])
		} else {
			e.Signers = append(e.Signers, shim[0])
		}
	}
	return nil
}
