package tpm

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest"
)

// MaxEventLogSize bounds the event log a node may send. Real logs are tens
// of kilobytes; the largest shipped with go-eventlog is 60 KiB.
const MaxEventLogSize = 1 << 20

// lastSRTMPCR is the last PCR a firmware (static root of trust) event log
// describes: 0-7 firmware, 8-15 boot loader and OS, 16 debug. PCRs 17-22
// belong to a dynamic root of trust with its own log, 23 to applications.
const lastSRTMPCR = 16

// replayLog parses a TCG PC Client event log and replays it against the
// quoted PCR values of one bank, returning only the events that replayed,
// and the boot phases systemd extended into PCR 11 after its log.
// Checks:
//   - the log parses (crypto-agile or SHA-1 format) and is within
//     MaxEventLogSize;
//   - for every quoted PCR 0-16 that has events, extending the events' digests
//     of this bank from the PCR's initial value (locality-aware for PCR 0)
//     gives exactly the quoted value. A PCR with no events in the log is
//     not established by the log, so nothing is read from it;
//   - but for PCR 11 the quoted value may also be what its logged events
//     extend to, extended by systemd-pcrphase's boot phases as systemd
//     makes them (pcr11Phases lists what is accepted; they are returned,
//     in order): they come after the firmware's log ended and are logged
//     nowhere it could send.
//
// The common case takes fastReplay; go-eventlog decides everything else.
//
// An empty log replays nothing: the boot state then knows nothing, and a
// policy that asks for any boot field refuses it.
func replayLog(raw []byte, bank crypto.Hash, quoted map[int][]byte) ([]tcg.Event, []string, error) {
	if len(raw) == 0 {
		return nil, nil, nil
	}
	if len(raw) > MaxEventLogSize {
		return nil, nil, attest.Deny(attest.ReasonEventLogInvalid, "event log of %d bytes exceeds %d", len(raw), MaxEventLogSize)
	}
	if events, ok := fastReplay(raw, bank, quoted); ok {
		return events, nil, nil
	}
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return nil, nil, attest.Deny(attest.ReasonEventLogInvalid, "tpm.eventLog does not parse as a TCG PC Client event log")
	}
	mrs := make([]register.MR, 0, len(quoted))
	at11 := -1
	for _, i := range sortedIndexes(quoted) {
		if i > lastSRTMPCR {
			continue
		}
		if i == 11 {
			at11 = len(mrs)
		}
		mrs = append(mrs, register.PCR{Index: i, Digest: quoted[i], DigestAlg: bank})
	}
	mismatch := attest.Deny(attest.ReasonEventLogReplay, "tpm.eventLog does not replay to the quoted PCR values")
	events, err := el.Verify(mrs)
	if err == nil {
		return events, nil, nil
	}
	if at11 < 0 {
		return nil, nil, mismatch
	}
	logged, ok := impliedPCRs(el, bank)[11]
	if !ok {
		return nil, nil, mismatch
	}
	phases, ok := pcr11Phases(logged, quoted[11], bank)
	if !ok {
		return nil, nil, mismatch
	}
	mrs[at11] = register.PCR{Index: 11, Digest: logged, DigestAlg: bank}
	if events, err = el.Verify(mrs); err != nil {
		return nil, nil, mismatch
	}
	return events, phases, nil
}

// dataMatchesDigest reports whether data hashes to digest in bank's hash.
func dataMatchesDigest(data, digest []byte, bank crypto.Hash) bool {
	if bank == crypto.SHA256 {
		sum := sha256.Sum256(data)
		return bytes.Equal(sum[:], digest)
	}
	h := bank.New()
	h.Write(data)
	return bytes.Equal(h.Sum(nil), digest)
}

func sortedIndexes(m map[int][]byte) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	return keys
}

// LogBootState is the boot state an event log tells by itself, in bank
// (crypto.SHA256, crypto.SHA384 or crypto.SHA1): the log is replayed against the PCR
// values its own events imply, since no quote vouches for them, and then
// read by the same state machine the verifier runs (separators, order,
// each variable once). Use it only on a log from a machine you trust —
// to learn a policy from it (`nodeproof policy learn`) — never to admit
// a machine: anyone can write a log that agrees with itself.
func LogBootState(raw []byte, bank crypto.Hash) (attest.BootState, error) {
	if bank != crypto.SHA256 && bank != crypto.SHA1 && bank != crypto.SHA384 {
		return attest.BootState{}, fmt.Errorf("tpm: bank %v: want SHA-256, SHA-384 or SHA-1", bank)
	}
	if len(raw) == 0 || len(raw) > MaxEventLogSize {
		return attest.BootState{}, attest.Deny(attest.ReasonEventLogInvalid, "event log of %d bytes: want 1 to %d", len(raw), MaxEventLogSize)
	}
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return attest.BootState{}, attest.Deny(attest.ReasonEventLogInvalid, "the event log does not parse as a TCG PC Client event log: %v", err)
	}
	events, _, err := replayLog(raw, bank, impliedPCRs(el, bank))
	if err != nil {
		return attest.BootState{}, err
	}
	return bootState(events, bank)
}

// LogPCRs are the PCR values (hex, by index, PCRs 0-16) a quote of the
// machine that wrote the log would hold if the log is whole: what its
// events extend to, and the reset value (zeros) for a PCR it has no
// events in. For `policy learn` and `policy check --event-log` on a log
// from a machine the operator trusts, like LogBootState; never to admit
// a machine.
func LogPCRs(raw []byte, bank crypto.Hash) (map[int]string, error) {
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return nil, attest.Deny(attest.ReasonEventLogInvalid, "the event log does not parse as a TCG PC Client event log: %v", err)
	}
	implied := impliedPCRs(el, bank)
	out := map[int]string{}
	for i := 0; i <= lastSRTMPCR; i++ {
		v, ok := implied[i]
		if !ok {
			v = make([]byte, bank.Size())
		}
		out[i] = hex.EncodeToString(v)
	}
	return out, nil
}

// impliedPCRs are the values of the SRTM PCRs (0-16) that el's events in
// bank extend from a fresh TPM, for the PCRs el measures: what a quote
// would hold if the log were true. Nothing vouches for them.
func impliedPCRs(el *tcg.EventLog, bank crypto.Hash) map[int][]byte {
	alg := map[crypto.Hash]register.HashAlg{crypto.SHA1: register.HashSHA1, crypto.SHA256: register.HashSHA256, crypto.SHA384: register.HashSHA384}[bank]
	implied := map[int][]byte{}
	for _, e := range el.Events(alg) {
		if e.Type == tcg.NoAction || e.Index > lastSRTMPCR || len(e.Digest) != bank.Size() {
			continue
		}
		cur, ok := implied[e.Index]
		if !ok {
			cur = make([]byte, bank.Size())
		}
		h := bank.New()
		h.Write(cur)
		h.Write(e.Digest)
		implied[e.Index] = h.Sum(nil)
	}
	return implied
}

// LogDump is a machine's event log as `nodeproof-agent --dump-evidence`
// writes it, for `nodeproof policy learn --evidence` on a machine the
// operator trusts.
type LogDump struct {
	// Kind is "tpm".
	Kind string `json:"kind"`
	// EventLog is the raw TCG event log (binary_bios_measurements).
	EventLog []byte `json:"eventLog"`
}
