package tpm_test

import (
	"bytes"
	"crypto"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// What root on a booted machine can do to the log it sends, without
// breaking the replay: reorder events across PCRs (the quote proves each
// PCR's own sequence, never how PCRs interleave), relabel any event's type
// (types are not measured) and append events to any PCR (after boot,
// root extends PCRs 0-15 from userspace). These are the transformations
// TestBootStateOnlyWhatTheQuoteProves and FuzzBootStateTransforms apply.

// agileLog is a crypto-agile log split into its header and events; ok is
// false for a log of another format or of digests of other algorithms.
func agileLog(raw []byte) (header []byte, events []rawEvent, ok bool) {
	if len(raw) < 32 {
		return nil, nil, false
	}
	hsize := 32 + int(binary.LittleEndian.Uint32(raw[28:32]))
	if hsize > len(raw) || binary.LittleEndian.Uint32(raw[4:8]) != 3 /* EV_NO_ACTION */ {
		return nil, nil, false
	}
	header, rest := raw[:hsize], raw[hsize:]
	for len(rest) > 0 {
		if len(rest) < 12 {
			return nil, nil, false
		}
		e := rawEvent{pcr: binary.LittleEndian.Uint32(rest), typ: binary.LittleEndian.Uint32(rest[4:])}
		n := binary.LittleEndian.Uint32(rest[8:])
		rest = rest[12:]
		for range n {
			if len(rest) < 2 {
				return nil, nil, false
			}
			alg := binary.LittleEndian.Uint16(rest)
			size := map[uint16]int{0x0004: 20, 0x000B: 32, 0x000C: 48}[alg]
			if size == 0 || len(rest) < 2+size {
				return nil, nil, false
			}
			e.digests, rest = append(e.digests, algDigest{alg, rest[2 : 2+size]}), rest[2+size:]
		}
		if len(rest) < 4 {
			return nil, nil, false
		}
		size := binary.LittleEndian.Uint32(rest)
		if uint64(size) > uint64(len(rest)-4) {
			return nil, nil, false
		}
		e.data, rest = rest[4:4+size], rest[4+size:]
		events = append(events, e)
	}
	return header, events, true
}

const evNoAction = 0x00000003

// eventTypes are the types root relabels events with: every type the
// TCG PC Client profile names that a log extends (not EV_NO_ACTION, which
// is not extended: relabelling to or from it breaks the replay).
var eventTypes = []uint32{0x00000001, 0x00000002, 0x00000004, 0x00000005, 0x00000006, 0x00000007, 0x00000008, 0x00000009,
	0x0000000A, 0x0000000B, 0x0000000C, 0x0000000D, 0x0000000E, 0x0000000F, 0x00000010, 0x00000011, 0x00000012,
	0x80000001, 0x80000002, 0x80000003, 0x80000004, 0x80000005, 0x80000006, 0x80000007, 0x80000008, 0x80000009,
	0x8000000A, 0x8000000B, 0x8000000C, 0x800000E0}

// transform is one of root's rewritings of a log.
type transform struct {
	reorder, relabel bool
	appends          int // events appended to PCRs
}

// apply rewrites events with r: a random interleaving that keeps each
// PCR's own order, random types, and events appended after each PCR's
// last — copies of any real boot's events (known is every log's: an
// allowed kernel, a separator, an authority, a GRUB command or file, a
// Secure Boot variable: whatever some boot measured, which is what a
// policy allows), into the PCR they were measured in or any PCR 0-15, or
// digests never seen.
func (tf transform) apply(r *rand.Rand, events, known []rawEvent) []rawEvent {
	out := append([]rawEvent(nil), events...)
	for range tf.appends {
		var e rawEvent
		switch r.IntN(4) {
		case 0:
			e = image(fmt.Sprint("appended ", r.Int()))
			e.pcr = uint32(r.IntN(16))
		case 1:
			e = known[r.IntN(len(known))]
			e.pcr = uint32(r.IntN(16))
		default:
			e = known[r.IntN(len(known))]
		}
		if e.typ == evNoAction || e.pcr > 15 {
			continue
		}
		e.digests = append([]algDigest(nil), e.digests...)
		out = append(out, e)
	}
	if tf.relabel {
		for i := range out {
			if out[i].typ != evNoAction {
				out[i].typ = eventTypes[r.IntN(len(eventTypes))]
			}
		}
	}
	if tf.reorder {
		// A random merge of the PCRs' sequences: each PCR's events stay in
		// their order, the PCRs interleave at random. Events of PCRs a quote
		// does not cover stay where they are relative to each other too.
		per := map[uint32][]rawEvent{}
		var pcrs []uint32
		for _, e := range out {
			if _, ok := per[e.pcr]; !ok {
				pcrs = append(pcrs, e.pcr)
			}
			per[e.pcr] = append(per[e.pcr], e)
		}
		merged := make([]rawEvent, 0, len(out))
		for len(merged) < len(out) {
			p := pcrs[r.IntN(len(pcrs))]
			if len(per[p]) == 0 {
				continue
			}
			merged, per[p] = append(merged, per[p][0]), per[p][1:]
		}
		out = merged
	}
	return out
}

// judgement is what a log gets: its boot state and the verifier's
// refusal, and each policy's refusal.
type judgement struct {
	boot    attest.BootState
	err     error
	refused []bool
}

func judge(raw []byte, pols []*policy.Policy) judgement {
	bs, err := tpm.LogBootState(raw, crypto.SHA256)
	j := judgement{boot: bs, err: err, refused: make([]bool, len(pols))}
	claims := &attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{EKTrust: "ca:vendor", EKKind: attest.EKKindRSA2048, PCRBank: "sha256", Boot: bs}}
	for i, p := range pols {
		j.refused[i] = err != nil || p.Evaluate("w", claims) != nil
	}
	return j
}

// transformCorpus is every crypto-agile real log whose boot state reads,
// and the policies judged: for each, the pool `policy learn` writes from
// it by default and with --digests.
type transformCorpus struct {
	names  []string
	logs   [][]byte
	known  []rawEvent // every log's events
	pols   []*policy.Policy
	polsOf []string
}

func loadTransformCorpus(t testing.TB) *transformCorpus {
	t.Helper()
	logs, err := firmwaretestdata.Logs()
	if err != nil {
		t.Fatal(err)
	}
	c := &transformCorpus{}
	for _, l := range logs {
		_, events, ok := agileLog(l.Raw)
		if !ok {
			continue
		}
		bs, err := tpm.LogBootState(l.Raw, crypto.SHA256)
		if err != nil {
			continue
		}
		c.names, c.logs, c.known = append(c.names, l.Name), append(c.logs, l.Raw), append(c.known, events...)
		for _, digests := range []bool{false, true} {
			doc, _, err := policy.Learn(nil, "w", policy.Learned{EKTrust: "ca:vendor", Bank: "sha256", Boot: bs,
				Root: &policy.EKRoot{Name: "vendor", Dir: "/unused"}, NodeNames: "requested", Digests: digests})
			if err != nil {
				continue
			}
			p, err := policy.Parse(doc)
			if err != nil {
				t.Fatalf("%s: the learned policy does not parse: %v", l.Name, err)
			}
			c.pols, c.polsOf = append(c.pols, p), append(c.polsOf, fmt.Sprintf("learned from %s (digests %v)", l.Name, digests))
		}
	}
	if len(c.logs) < 15 || len(c.pols) < 2*10 {
		t.Fatalf("%d logs and %d learned policies: the corpus shrank", len(c.logs), len(c.pols))
	}
	// Boots that differ from a real one in one measurement — another
	// image in PCR 2 or 4, another file in PCR 9, another command line in
	// PCR 8 — as the firmware measured them: what the policies learned
	// from the real one refuse, and what root then tries to rescue.
	for i, n := 0, len(c.logs); i < n; i++ {
		header, events, _ := agileLog(c.logs[i])
		for j, e := range events {
			var v rawEvent
			switch {
			case (e.pcr == 4 || e.pcr == 2 || e.pcr == 9) && e.typ != evNoAction && !selfMeasured(e):
				v = image(fmt.Sprintf("another image %d", j))
				v.pcr, v.typ, v.data = e.pcr, e.typ, e.data
			case e.pcr == 8 && bytes.Contains(e.data, []byte("linux")) && selfMeasuredText(e):
				text := string(bytes.TrimRight(e.data, "\x00")) + " init=/bin/sh"
				_, measuredText, _ := strings.Cut(text, " ")
				v = like(e, 8, e.typ, []byte(text), []byte(measuredText))
			default:
				continue
			}
			edited := append([]rawEvent(nil), events...)
			edited[j] = v
			c.names, c.logs = append(c.names, fmt.Sprintf("%s, event %d replaced", c.names[i], j)), append(c.logs, joinLog(header, edited))
		}
	}
	return c
}

// selfMeasured reports whether e's SHA-256 digest is its data's hash.
func selfMeasured(e rawEvent) bool {
	for _, d := range e.digests {
		if d.alg == 0x000B {
			return bytes.Equal(d.digest, hashOf(0x000B, e.data))
		}
	}
	return false
}

// selfMeasuredText reports a GRUB event whose digest is the hash of its
// text after a label ending in a space.
func selfMeasuredText(e rawEvent) bool {
	_, text, ok := strings.Cut(string(bytes.TrimRight(e.data, "\x00")), " ")
	for _, d := range e.digests {
		if d.alg == 0x000B {
			return ok && bytes.Equal(d.digest, hashOf(0x000B, []byte(text)))
		}
	}
	return false
}

// checkTransform applies tf to log i and holds the property: reordering
// and relabelling change nothing (the same boot state, the same refusal);
// appending never turns a refusal into an admission, by the verifier or
// by any policy.
func (c *transformCorpus) checkTransform(t *testing.T, r *rand.Rand, i int, base judgement, tf transform) {
	t.Helper()
	header, events, _ := agileLog(c.logs[i])
	got := judge(joinLog(header, tf.apply(r, events, c.known)), c.pols)
	if tf.appends == 0 {
		if !reflect.DeepEqual(got.boot, base.boot) || fmt.Sprint(attacktableReason(got.err)) != fmt.Sprint(attacktableReason(base.err)) {
			t.Fatalf("%s, %+v: the boot state changed:\n got %+v (%v)\nwant %+v (%v)", c.names[i], tf, got.boot, got.err, base.boot, base.err)
		}
	}
	for p := range c.pols {
		if base.refused[p] && !got.refused[p] {
			t.Fatalf("%s, %+v: refused by the policy %s, admitted after root's transformation", c.names[i], tf, c.polsOf[p])
		}
	}
}

func attacktableReason(err error) attest.Reason {
	r, _ := attest.ReasonOf(err)
	return r
}

// TestBootStateOnlyWhatTheQuoteProves: the verdict is a function of each
// PCR's own sequence of digests. For every crypto-agile log in
// firmware-testdata (the live boots' included) and every policy `policy
// learn` writes from any of them: reordering the log across PCRs and
// relabelling every event's type leave the boot state and every verdict
// exactly as they were; appending events to any PCR (copies of the boot's
// own measurements, or unknown digests), alone or with both, never turns
// a refusal into an admission.
func TestBootStateOnlyWhatTheQuoteProves(t *testing.T) {
	c := loadTransformCorpus(t)
	r := rand.New(rand.NewPCG(1, 2))
	rounds := 12
	if testing.Short() {
		rounds = 3
	}
	admitted, refused := 0, 0
	for i := range c.logs {
		base := judge(c.logs[i], c.pols)
		for _, ref := range base.refused {
			if ref {
				refused++
			} else {
				admitted++
			}
		}
		for range rounds {
			for _, tf := range []transform{{reorder: true}, {relabel: true}, {reorder: true, relabel: true},
				{appends: 1 + r.IntN(3)}, {reorder: true, relabel: true, appends: 1 + r.IntN(6)}} {
				c.checkTransform(t, r, i, base, tf)
			}
		}
	}
	// The property means something only if the corpus has both.
	if admitted < len(c.logs) || refused < len(c.logs)*len(c.pols)/2 {
		t.Fatalf("%d admissions and %d refusals among the logs and policies", admitted, refused)
	}
	t.Logf("%d logs, %d policies: %d admitted, %d refused, each transformed %d ways", len(c.logs), len(c.pols), admitted, refused, rounds*5)
}

// FuzzBootStateTransforms is the property of
// TestBootStateOnlyWhatTheQuoteProves, the fuzzer choosing the log, the
// transformation and its randomness.
func FuzzBootStateTransforms(f *testing.F) {
	c := loadTransformCorpus(f)
	bases := make([]judgement, len(c.logs))
	for i := range c.logs {
		bases[i] = judge(c.logs[i], c.pols)
	}
	for i := range c.logs {
		f.Add(uint8(i), uint8(3), uint8(0), uint64(i))
		f.Add(uint8(i), uint8(7), uint8(4), uint64(i)*7)
	}
	f.Fuzz(func(t *testing.T, log, ops, appends uint8, seed uint64) {
		i := int(log) % len(c.logs)
		tf := transform{reorder: ops&1 != 0, relabel: ops&2 != 0, appends: int(appends % 8)}
		c.checkTransform(t, rand.New(rand.NewPCG(seed, uint64(ops))), i, bases[i], tf)
	})
}

// TestBootStateOnlyWhatTheQuoteProvesSHA384: the same reader serves the
// cloud kinds (identity/gcevtpm and identity/nitrotpm replay their logs
// through QuoteResult.ReplayBoot), NitroTPM's in the SHA-384 bank. For
// every corpus log that carries SHA-384 digests, reordering across PCRs
// and relabelling event types leave the SHA-384 boot state exactly as it
// was.
func TestBootStateOnlyWhatTheQuoteProvesSHA384(t *testing.T) {
	c := loadTransformCorpus(t)
	r := rand.New(rand.NewPCG(3, 4))
	n := 0
	for i, raw := range c.logs {
		_, events, _ := agileLog(raw)
		if !slices.ContainsFunc(events, func(e rawEvent) bool {
			return slices.ContainsFunc(e.digests, func(d algDigest) bool { return d.alg == 0x000C })
		}) {
			continue // no SHA-384 bank in this log
		}
		base, err := tpm.LogBootState(raw, crypto.SHA384)
		if err != nil {
			continue // its SHA-384 bank does not read (refused as the SHA-256 one is)
		}
		n++
		header, _, _ := agileLog(raw)
		for range 6 {
			for _, tf := range []transform{{reorder: true}, {relabel: true}, {reorder: true, relabel: true}} {
				got, gerr := tpm.LogBootState(joinLog(header, tf.apply(r, events, c.known)), crypto.SHA384)
				if gerr != nil || !reflect.DeepEqual(got, base) {
					t.Fatalf("%s, %+v: the SHA-384 boot state changed:\n got %+v (%v)\nwant %+v", c.names[i], tf, got, gerr, base)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no corpus log carries SHA-384 digests: the property would hold vacuously")
	}
	t.Logf("%d logs with a SHA-384 bank, each transformed 18 ways", n)
}
