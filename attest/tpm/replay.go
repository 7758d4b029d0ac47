package tpm

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"

	"github.com/google/go-eventlog/tcg"
)

// fastReplay is the common case of replayLog without allocation per event:
// a crypto-agile (TCG PC Client, "Spec ID Event03") log whose events
// replay exactly to the quoted PCRs. It returns ok only then; for anything
// else (a SHA-1-format log, an algorithm other than SHA-1/256/384, any
// structural oddity, any PCR that does not replay) it returns !ok and
// go-eventlog decides, with its parser, its replay and its workarounds for
// known firmware bugs. So the fast path can only ever accept what the
// library accepts, and the differential test and fuzz target in
// replay_test.go hold it to giving the library's events.
//
// It exists because parsing and replaying with go-eventlog copied every
// event and allocated a hash per extend: a fifth of the whole verification
// (BenchmarkTPMAttestation).
func fastReplay(raw []byte, bank crypto.Hash, quoted map[int][]byte) ([]tcg.Event, bool) {
	algs, rest, ok := specIDAlgs(raw)
	if !ok {
		return nil, false
	}
	want := tpmAlgID(bank)
	if want == 0 {
		return nil, false
	}
	var (
		state    [lastSRTMPCR + 1][]byte // nil until the first extend
		buf      [lastSRTMPCR + 1][64]byte
		locality byte
		seen     [lastSRTMPCR + 1]bool
		events   = make([]tcg.Event, 0, len(raw)/128)
	)
	size := bank.Size()
	for len(rest) > 0 {
		if len(rest) < 12 {
			return nil, false
		}
		index := binary.LittleEndian.Uint32(rest[0:4])
		typ := tcg.EventType(binary.LittleEndian.Uint32(rest[4:8]))
		if index == 0xFFFFFFFF {
			break // padding, as the library allows
		}
		n := binary.LittleEndian.Uint32(rest[8:12])
		rest = rest[12:]
		var digest []byte
		for i := uint32(0); i < n; i++ {
			if len(rest) < 2 {
				return nil, false
			}
			id := binary.LittleEndian.Uint16(rest)
			dsize, known := algs[id]
			if !known || len(rest) < 2+int(dsize) {
				return nil, false
			}
			if id == want && digest == nil {
				digest = rest[2 : 2+dsize]
			}
			rest = rest[2+dsize:]
		}
		if len(rest) < 4 {
			return nil, false
		}
		dataLen := binary.LittleEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(dataLen) > uint64(len(rest)) {
			return nil, false
		}
		data := rest[:dataLen:dataLen]
		rest = rest[dataLen:]

		if index > lastSRTMPCR {
			continue
		}
		q, isQuoted := quoted[int(index)]
		if !isQuoted {
			continue
		}
		switch {
		case typ == tcg.NoAction:
			if index == 0 && len(data) == 17 && bytes.HasPrefix(data, []byte("StartupLocality")) {
				locality = data[16]
			}
			continue
		case typ == tcg.EFIHCRTMEvent:
			if state[index] != nil {
				return nil, false
			}
			state[index] = make([]byte, size)
			state[index][size-1] = 4
		}
		if len(digest) != size || len(q) != size {
			return nil, false
		}
		b := buf[index][:0]
		if state[index] == nil {
			b = append(b, make([]byte, size)...)
			if index == 0 {
				b[size-1] = locality
			}
		} else {
			b = append(b, state[index]...)
		}
		b = append(b, digest...)
		state[index] = extendHash(bank, b)
		seen[index] = true
		events = append(events, tcg.Event{Index: int(index), Type: typ, Data: data, Digest: digest})
	}
	for i, ok := range seen {
		if ok && !bytes.Equal(state[i], quoted[i]) {
			return nil, false
		}
	}
	return events, true
}

func extendHash(bank crypto.Hash, b []byte) []byte {
	switch bank {
	case crypto.SHA256:
		s := sha256.Sum256(b)
		return s[:]
	case crypto.SHA384:
		s := sha512.Sum384(b)
		return s[:]
	}
	h := bank.New()
	h.Write(b)
	return h.Sum(nil)
}

func tpmAlgID(h crypto.Hash) uint16 {
	switch h {
	case crypto.SHA1:
		return 0x0004
	case crypto.SHA256:
		return 0x000B
	case crypto.SHA384:
		return 0x000C
	}
	return 0
}

// specIDAlgs reads the first event of a crypto-agile log (a SHA-1-format
// EV_NO_ACTION event holding the Spec ID Event03 structure, version 2.0)
// and returns the digest sizes it declares, by algorithm, and the rest of
// the log. Any other first event: !ok.
func specIDAlgs(raw []byte) (map[uint16]uint16, []byte, bool) {
	if len(raw) < 32 {
		return nil, nil, false
	}
	if binary.LittleEndian.Uint32(raw[4:8]) != uint32(tcg.NoAction) {
		return nil, nil, false
	}
	size := binary.LittleEndian.Uint32(raw[28:32])
	if uint64(size) > uint64(len(raw)-32) {
		return nil, nil, false
	}
	d := raw[32 : 32+size]
	rest := raw[32+size:]
	const hdr = 16 + 4 + 4 + 4 // signature, platform class, versions+uintn, numAlgs
	if len(d) < hdr || !bytes.Equal(d[:16], []byte("Spec ID Event03\x00")) || d[21] != 2 || d[20] != 0 {
		return nil, nil, false
	}
	num := binary.LittleEndian.Uint32(d[24:28])
	d = d[hdr:]
	if uint64(num)*4 > uint64(len(d)) {
		return nil, nil, false
	}
	algs := make(map[uint16]uint16, num)
	for i := uint32(0); i < num; i++ {
		id, sz := binary.LittleEndian.Uint16(d), binary.LittleEndian.Uint16(d[2:])
		switch {
		case id == 0x0004 && sz == 20, id == 0x000B && sz == 32, id == 0x000C && sz == 48:
		default:
			return nil, nil, false
		}
		algs[id] = sz
		d = d[4:]
	}
	if len(d) < 1 || int(d[0]) != len(d)-1 || len(algs) == 0 {
		return nil, nil, false
	}
	return algs, rest, true
}
