package tpm

import (
	"crypto"
	"slices"
	"testing"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// pcrsOf computes the SHA-256 PCR values a log's own digests extend to
// from a fresh TPM (locality 0; events for PCR > 16 and EV_NO_ACTION
// skipped), with go-eventlog's unverified event list, so that replay has
// something to succeed against.
func pcrsOf(raw []byte) map[int][]byte {
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return nil
	}
	pcrs := impliedPCRs(el, crypto.SHA256)
	for i := 0; i <= lastSRTMPCR; i++ {
		if pcrs[i] == nil {
			pcrs[i] = make([]byte, 32) // quoted, never extended
		}
	}
	return pcrs
}

// libraryReplay is the authoritative path: go-eventlog's parse and replay.
func libraryReplay(raw []byte, quoted map[int][]byte) ([]tcg.Event, error) {
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return nil, err
	}
	var mrs []register.MR
	for _, i := range sortedIndexes(quoted) {
		if i <= lastSRTMPCR {
			mrs = append(mrs, register.PCR{Index: i, Digest: quoted[i], DigestAlg: crypto.SHA256})
		}
	}
	return el.Verify(mrs)
}

// sameAsLibrary fails when the fast path accepts what the library refuses,
// or returns other events.
func sameAsLibrary(t *testing.T, raw []byte, quoted map[int][]byte) (fastOK bool) {
	t.Helper()
	fast, ok := fastReplay(raw, crypto.SHA256, quoted)
	if !ok {
		return false
	}
	lib, err := libraryReplay(raw, quoted)
	if err != nil {
		t.Fatalf("fast path accepted a log the library refuses: %v", err)
	}
	if len(fast) != len(lib) {
		t.Fatalf("fast path gave %d events, library %d", len(fast), len(lib))
	}
	for i := range fast {
		f, l := fast[i], lib[i]
		if f.Index != l.Index || f.Type != l.Type || !slices.Equal(f.Data, l.Data) || !slices.Equal(f.Digest, l.Digest) {
			t.Fatalf("event %d differs: fast %d/%v, library %d/%v", i, f.Index, f.Type, l.Index, l.Type)
		}
	}
	return true
}

// TestFastReplayMatchesLibrary runs every real firmware log through both
// paths, with the PCR values the log implies and with one PCR changed.
func TestFastReplayMatchesLibrary(t *testing.T) {
	logs, err := firmwaretestdata.Logs()
	if err != nil {
		t.Fatal(err)
	}
	fastOn := 0
	for _, l := range logs {
		t.Run(l.Name, func(t *testing.T) {
			pcrs := pcrsOf(l.Raw)
			if pcrs == nil {
				return
			}
			if sameAsLibrary(t, l.Raw, pcrs) {
				fastOn++
			}
			pcrs[7] = make([]byte, 32)
			if _, ok := fastReplay(l.Raw, crypto.SHA256, pcrs); ok && len(l.Expected.BootApplications) > 0 {
				t.Fatal("fast path accepted a changed PCR 7")
			}
		})
	}
	// Every crypto-agile log that replays at locality 0 takes the fast path.
	if fastOn < 15 {
		t.Fatalf("fast path taken for only %d logs", fastOn)
	}
}

func FuzzFastReplay(f *testing.F) {
	// Small seeds keep the fuzzer fast: host-gmes whole (959 bytes) and the
	// first events of two real logs (the spec ID event and some PCR 0-7
	// events); the mutator grows them.
	f.Add(firmwaretestdata.MustLog("host-gmes"))
	f.Add(firmwaretestdata.MustLog("rhel8-uefi")[:2048])
	f.Add(firmwaretestdata.MustLog("cos-85-amd-sev")[:2048])
	f.Fuzz(func(t *testing.T, raw []byte) {
		sameAsLibrary(t, raw, pcrsOf(raw))
		sameAsLibrary(t, raw, map[int][]byte{0: make([]byte, 32), 7: make([]byte, 32)})
	})
}
