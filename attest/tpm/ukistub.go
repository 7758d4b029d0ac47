package tpm

import (
	"encoding/hex"
	"slices"

	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest"
)

// UKISectionOrder is the order in which systemd-stub measures a unified
// kernel image's sections into PCR 11: the union of systemd's releases'
// canonical lists (252: .linux .osrel .cmdline .initrd .splash .dtb
// .pcrpkey; later releases insert .ucode, .uname and .sbat), so that
// each release's order is a subsequence of it. .pcrsig is never measured
// (it signs the measurements).
var UKISectionOrder = []string{".linux", ".osrel", ".cmdline", ".initrd", ".ucode", ".splash", ".dtb", ".uname", ".sbat", ".pcrpkey"}

// pcr11 reads what systemd-stub measured of the UKI it ran, from PCR 11's
// own sequence alone (nothing is read from the events' types or their
// descriptions, which are not measured). systemd-stub extends, for each
// section it knows, first the hash of the section's name with its NUL,
// then the hash of its content. The sections are known
// (UKISectionsKnown) only when:
//   - PCR 11 replayed (its quoted value is what its events extend to);
//   - its sequence is exactly such pairs: an event whose digest is the
//     hash of a name in UKISectionOrder with its NUL, then one whose
//     digest is not any such name's hash (the content);
//   - the names come in UKISectionOrder, each once (a section measured
//     twice, or out of order, is not what a stub does: root appending
//     to PCR 11 after boot cannot re-measure a section);
//   - .linux is among them.
//
// Anything else leaves them unknown, not refused: a pool that judges a
// UKI (tpm.uki) refuses unknown sections, and other pools do not read
// them. (systemd's own later PCR 11 measurements — systemd-pcrphase's
// boot phases, made after the firmware's log ended — are read from the
// quoted value when the log is replayed: pcr11Phases.)
func (r *bootReader) pcr11(es []tcg.Event) {
	if len(es) == 0 || !slices.Contains(r.bs.ReplayedPCRs, 11) || len(es)%2 != 0 {
		return
	}
	var sections []attest.MeasuredFile
	next := 0 // the position in UKISectionOrder the next name must be at or after
	for j := 0; j < len(es); j += 2 {
		at := r.sectionName(es[j])
		if at < next || r.sectionName(es[j+1]) >= 0 {
			return
		}
		sections = append(sections, attest.MeasuredFile{Path: UKISectionOrder[at], Digest: hex.EncodeToString(es[j+1].Digest)})
		next = at + 1
	}
	if sections[0].Path != ".linux" {
		return
	}
	r.bs.UKISections, r.bs.UKISectionsKnown = sections, true
}

// sectionName returns the position in UKISectionOrder of the section
// name e's digest measures (the name with its NUL), or -1.
func (r *bootReader) sectionName(e tcg.Event) int {
	for i, name := range UKISectionOrder {
		if r.is(e, append([]byte(name), 0)) {
			return i
		}
	}
	return -1
}
