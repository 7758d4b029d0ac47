package api

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
)

// typedEv and typedReq are the verify body as it was decoded before the
// seam: the kind's evidence a typed field of the envelope (the baseline).
type typedEv struct {
	EventLog []byte `json:"eventLog"`
	Quotes   []byte `json:"quotes"`
}

type typedReq struct {
	Session string   `json:"session"`
	TPM     *typedEv `json:"tpm,omitempty"`
}

// body is a verify body with a 1 MiB event log, the largest the server takes.
func body() []byte {
	b, _ := json.Marshal(typedReq{Session: "np1.AAAA", TPM: &typedEv{EventLog: bytes.Repeat([]byte{7}, 1<<20), Quotes: make([]byte, 300)}})
	return b
}

// BenchmarkVerifyBodyTyped is the baseline: one strict decode into typed
// fields.
func BenchmarkVerifyBodyTyped(b *testing.B) {
	in := body()
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		var r typedReq
		dec := json.NewDecoder(bytes.NewReader(in))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyBodyKinded is the envelope as the server decodes it now,
// then the kind's evidence decoded strictly (attest.DecodeEvidence): one
// more copy of the evidence (2.1x the baseline's bytes for a 1 MiB log).
func BenchmarkVerifyBodyKinded(b *testing.B) {
	in := body()
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		var r VerifyRequest
		dec := json.NewDecoder(bytes.NewReader(in))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			b.Fatal(err)
		}
		var ev typedEv
		if err := attest.DecodeEvidence(r.Evidence, "tpm", &ev); err != nil {
			b.Fatal(err)
		}
	}
}
