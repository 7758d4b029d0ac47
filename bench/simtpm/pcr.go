package simtpm

import (
	"crypto"
	"crypto/sha1"
	"crypto/sha256"
	"fmt"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
)

// pcrBanks are a machine's PCRs 0-23 in the SHA-1 and SHA-256 banks.
// Machines booted from the same log share one (it is never written after
// the replay).
type pcrBanks struct {
	sha1   [numPCRs][]byte
	sha256 [numPCRs][]byte
}

// resetBanks are the PCRs after TPM2_Startup(CLEAR) at locality 0 in a PC
// Client TPM: PCRs 17-22 (the dynamic root of trust's) all ones, the
// others zero.
func resetBanks() *pcrBanks {
	b := &pcrBanks{}
	for i := range numPCRs {
		b.sha1[i] = make([]byte, sha1.Size)
		b.sha256[i] = make([]byte, sha256.Size)
		if i >= 17 && i <= 22 {
			for j := range b.sha1[i] {
				b.sha1[i][j] = 0xff
			}
			for j := range b.sha256[i] {
				b.sha256[i][j] = 0xff
			}
		}
	}
	return b
}

// replayLog extends every measured event of a TCG event log into fresh
// SHA-1 and SHA-256 banks exactly as internal/tpmtest.ExtendLog extends a
// TPM: events of type EV_NO_ACTION, of PCR 17 and up, or without a digest
// of the bank are skipped. An empty log leaves the banks at reset.
func replayLog(log []byte) (*pcrBanks, error) {
	b := resetBanks()
	if len(log) == 0 {
		return b, nil
	}
	el, err := tcg.ParseEventLog(log, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return nil, fmt.Errorf("simtpm: parse event log: %w", err)
	}
	for _, bank := range []struct {
		alg  register.HashAlg
		hash crypto.Hash
		pcrs *[numPCRs][]byte
	}{{register.HashSHA1, crypto.SHA1, &b.sha1}, {register.HashSHA256, crypto.SHA256, &b.sha256}} {
		for _, e := range el.Events(bank.alg) {
			if e.Type == tcg.NoAction || e.Index > 16 || len(e.Digest) == 0 {
				continue
			}
			if e.Index < 0 || len(e.Digest) != bank.hash.Size() {
				// TPM2_PCR_Extend refuses a digest of the wrong size.
				return nil, fmt.Errorf("simtpm: extend PCR %d: digest of %d bytes for %v", e.Index, len(e.Digest), bank.hash)
			}
			h := bank.hash.New()
			h.Write(bank.pcrs[e.Index])
			h.Write(e.Digest)
			bank.pcrs[e.Index] = h.Sum(nil)
		}
	}
	return b, nil
}
