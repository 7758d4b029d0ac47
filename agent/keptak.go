package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/fsutil"
)

// DefaultAKState is where a re-attesting agent keeps its TPM's
// attestation key between runs (--ak-state): the AK as the TPM wrapped it
// (only this TPM can load it) and the server's ticket for it. With it, a
// re-attestation loads the AK and quotes: no key generation, and while
// the ticket holds, no credential activation (docs/tpm.md, "A kept AK").
const DefaultAKState = "/var/lib/nodeproof/tpm-ak.json"

// maxAKState bounds the file read (an AK blob is under 1 KB, a ticket
// under 1 KB).
const maxAKState = 64 << 10

// akState is the file at SourceOptions.AKState.
type akState struct {
	// AK is tpm.Collector.KeepAK's blob.
	AK []byte `json:"ak"`
	// Ticket is the server's ticket for that AK ("" none yet).
	Ticket string `json:"ticket,omitempty"`
}

// loadAKState reads the kept AK; a missing, oversized or torn file is
// none (the run makes a new AK and writes a good file), and what was
// wrong with it is said.
func loadAKState(path string) (akState, string) {
	var st akState
	b, err := fsutil.ReadFileMax(path, maxAKState)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return st, ""
	case errors.Is(err, fsutil.ErrTooLarge):
		return st, fmt.Sprintf("kept AK %s is over %d bytes; making a new one", path, maxAKState)
	case err != nil:
		return st, fmt.Sprintf("kept AK %s: %v; making a new one", path, err)
	}
	if err := json.Unmarshal(b, &st); err != nil || len(st.AK) == 0 {
		return akState{}, fmt.Sprintf("kept AK %s does not decode; making a new one", path)
	}
	return st, ""
}

// saveAKState writes the kept AK atomically (0600, its directory 0700).
func saveAKState(path string, st akState) error { return saveState(path, st) }

// keptAK opens coll's AK state at path: the options that load the kept
// AK, and, once coll is open, the ticket to send and the Keep that writes
// the file after an accepted attestation.
type keptAK struct {
	path string
	st   akState
	// note says what happened to a kept AK, for the console ("" nothing
	// to say).
	note string
}

func openKeptAK(path string) *keptAK {
	k := &keptAK{path: path}
	k.st, k.note = loadAKState(path)
	return k
}

// ticket is the ticket to send: the kept one when coll loaded the kept
// AK, else none.
func (k *keptAK) ticket(coll *tpm.Collector) string {
	kept, err := coll.KeptAK()
	if err != nil {
		k.note = fmt.Sprintf("the kept AK in %s did not load (%v: another TPM's, or this TPM was cleared); made a new one", k.path, err)
	}
	if !kept {
		return ""
	}
	return k.st.Ticket
}

// keep is TPMEvidence.Keep: the AK and the newest ticket for it, written
// when they changed.
func (k *keptAK) keep(coll *tpm.Collector) func(string) error {
	return func(ticket string) error {
		kept, _ := coll.KeptAK()
		if ticket == "" && kept {
			ticket = k.st.Ticket
		}
		blob, err := coll.KeepAK()
		if err != nil {
			return err
		}
		if bytes.Equal(blob, k.st.AK) && ticket == k.st.Ticket {
			return nil
		}
		st := akState{AK: blob, Ticket: ticket}
		if err := saveAKState(k.path, st); err != nil {
			return err
		}
		k.st = st
		return nil
	}
}
