package tpm

import (
	"bytes"
	"crypto"
	"slices"

	"github.com/nodeproof/nodeproof/attest/uki"
)

// pcr11Phases reports whether quoted is logged (the value PCR 11's logged
// events extend to) extended by a run of systemd's boot phases as systemd
// makes them, and which: a non-empty prefix of uki.Phases, or of its
// real-root part (sysinit onwards: an initrd without systemd). They come
// after the firmware's log ended (systemd 252 keeps no log of them), so
// they are read from the quoted value itself. Nothing else is accepted:
// a phase out of order, twice, an administrator's own word or any other
// unlogged extension leaves PCR 11 not replayed.
// Matching the quote is as strong as replaying a log: the quoted value
// is a hash chain through logged, then each word.
func pcr11Phases(logged, quoted []byte, bank crypto.Hash) ([]string, bool) {
	if len(logged) != bank.Size() || len(quoted) != bank.Size() {
		return nil, false
	}
	for _, start := range []int{0, slices.Index(uki.Phases, "sysinit")} {
		v := logged
		for k := start; k < len(uki.Phases); k++ {
			w := bank.New()
			w.Write([]byte(uki.Phases[k]))
			h := bank.New()
			h.Write(v)
			h.Write(w.Sum(nil))
			v = h.Sum(nil)
			if bytes.Equal(v, quoted) {
				return slices.Clone(uki.Phases[start : k+1]), true
			}
		}
	}
	return nil, false
}
