// Package uki says what systemd-stub measures of a unified kernel image
// (UKI) into PCR 11, and what PCR 11 then holds: the events and the value
// systemd-measure predicts, for a UKI without a .pcrsig section.
//
// systemd-stub (systemd 252, Debian bookworm's linuxx64.efi.stub) looks up
// the sections it knows (Sections252, in that order) and, for each one
// the image has and that it measures (all but .pcrsig), extends PCR 11
// twice, with EV_IPL events: first the SHA-256 of the section's name with
// its terminating NUL, then the SHA-256 of the section's content as loaded
// in memory (its VirtualSize bytes). attest/bootimage reads a UKI's
// sections from the file; this package is only the arithmetic, with no PE
// parsing, so that the verifier's side can use it without a PE reader.
package uki

import (
	"crypto/sha256"
	"fmt"
	"strings"
)

// PCR is the PCR systemd-stub measures a UKI's sections into.
const PCR = 11

// Sections252 are the section names systemd-stub 252 knows, in the order
// it measures them (src/fundamental/tpm-pcr.c's unified_sections, v252):
// later versions add .uname, .sbat, .ucode and more, which 252 neither
// reads nor measures.
var Sections252 = []string{".linux", ".osrel", ".cmdline", ".initrd", ".splash", ".dtb", ".pcrsig", ".pcrpkey"}

// Measured252 says whether systemd-stub 252 measures a section it knows:
// all but .pcrsig (the signature of the expected PCR values cannot be an
// input of them).
func Measured252(name string) bool { return name != ".pcrsig" }

// Section is one measured section: its name and the SHA-256 of its
// content as the stub measures it.
type Section struct {
	Name   string
	SHA256 []byte
}

// Event is one PCR 11 extension: its SHA-256 digest and what it is (a
// section's name, a section's content, or a word of a boot phase).
type Event struct {
	// Section is the section's name ("" for a phase's word); Content is
	// false for the name's event, true for the content's.
	Section string
	Content bool
	// Phase is the word of a boot phase (systemd-pcrphase), or "".
	Phase  string
	Digest []byte
}

// NameDigest is the digest of a section name's event: SHA-256 of the name
// and its terminating NUL.
func NameDigest(name string) []byte {
	s := sha256.Sum256(append([]byte(name), 0))
	return s[:]
}

// Events are the PCR 11 events the stub extends for sections, which must
// be the measured sections of one UKI in the stub's order (Sections252,
// each at most once, no .pcrsig): for each, its name's event, then its
// content's. It refuses sections out of that order, unknown, repeated, or
// with a digest that is not SHA-256's size.
func Events(sections []Section) ([]Event, error) {
	var out []Event
	next := 0
	for _, s := range sections {
		i := indexOf(s.Name)
		switch {
		case i < 0:
			return nil, fmt.Errorf("uki: systemd-stub 252 does not measure a section %q", s.Name)
		case !Measured252(s.Name):
			return nil, fmt.Errorf("uki: systemd-stub 252 does not measure %s", s.Name)
		case i < next:
			return nil, fmt.Errorf("uki: %s repeated or out of the stub's order (%v)", s.Name, Sections252)
		case len(s.SHA256) != sha256.Size:
			return nil, fmt.Errorf("uki: %s: a digest of %d bytes, not SHA-256", s.Name, len(s.SHA256))
		}
		next = i + 1
		out = append(out,
			Event{Section: s.Name, Digest: NameDigest(s.Name)},
			Event{Section: s.Name, Content: true, Digest: append([]byte(nil), s.SHA256...)})
	}
	return out, nil
}

// Phases are the boot phases systemd-pcrphase (systemd 252 and later, on
// a system systemd-stub booted) extends into PCR 11 after the stub's own
// measurements, in this order, each as the hash of the word (UTF-8, no
// NUL): in the initrd (systemd-pcrphase-initrd.service) enter-initrd at
// its start and leave-initrd before the switch to the real root; in the
// real root sysinit, then ready, and shutdown and final on the way down
// (systemd's docs/TPM2_PCR_MEASUREMENTS.md; Debian 12's systemd-pcrphase
// checked against swtpm: attest/tpm's TestSystemdPCRPhase). They are in
// no log the firmware keeps.
var Phases = []string{"enter-initrd", "leave-initrd", "sysinit", "ready", "shutdown", "final"}

// PhaseEvents are the events systemd-pcrphase extends into PCR 11 on the
// way to phase, its words separated by colons ("enter-initrd",
// "enter-initrd:leave-initrd:sysinit:ready"): each word's SHA-256 (without
// a NUL), in order; empty words are skipped ("" is no phase: the stub's
// events alone). A systemd 252 initrd extends "enter-initrd" when the
// stub said it measured the sections (the StubPcrKernelImage variable).
func PhaseEvents(phase string) []Event {
	var out []Event
	for _, w := range strings.Split(phase, ":") {
		if w == "" {
			continue
		}
		s := sha256.Sum256([]byte(w))
		out = append(out, Event{Phase: w, Digest: s[:]})
	}
	return out
}

// PCR11 is the SHA-256 PCR 11 holds after the stub measured sections
// (Events) and the boot reached phase (PhaseEvents; "" for none), from
// its reset value (zeros), when nothing else extended it: what
// systemd-measure 252 calculates for the sha256 bank and that phase.
func PCR11(sections []Section, phase string) ([]byte, error) {
	events, err := Events(sections)
	if err != nil {
		return nil, err
	}
	return Replay(make([]byte, sha256.Size), append(events, PhaseEvents(phase)...)), nil
}

// Replay extends pcr (SHA-256) with each event's digest, in order.
func Replay(pcr []byte, events []Event) []byte {
	v := append([]byte(nil), pcr...)
	for _, e := range events {
		h := sha256.New()
		h.Write(v)
		h.Write(e.Digest)
		v = h.Sum(nil)
	}
	return v
}

func indexOf(name string) int {
	for i, n := range Sections252 {
		if n == name {
			return i
		}
	}
	return -1
}
