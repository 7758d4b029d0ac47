package mcs

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// testEv is a kind's evidence in these tests.
type testEv struct {
	EventLog []byte `json:"eventLog"`
	Quotes   []byte `json:"quotes"`
}

func testRegistry(t testing.TB) attest.Registry {
	t.Helper()
	mk := func(k attest.Kind) attest.Verifier {
		return attest.Seam(k, func(attest.ChallengeInput, *struct{}) (any, *attest.Session, error) { return nil, nil, nil },
			func(context.Context, *attest.Session, *testEv) (*attest.Claims, error) { return nil, nil })
	}
	r, err := attest.NewRegistry(mk(attest.KindTPM), mk(attest.KindGCEVTPM))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func decodeVerify(t testing.TB, vb *verifyBody, body []byte) (*api.VerifyRequest, any, error) {
	r := httptest.NewRequest("POST", api.PathVerify, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return vb.decode(httptest.NewRecorder(), r)
}

// TestVerifyBody: a verify body carries the evidence of one kind the
// server verifies, decoded strictly into the kind's type with its
// envelope; a kind it does not verify, two kinds, an unknown field at any
// depth are MalformedRequest; none is a body without evidence.
func TestVerifyBody(t *testing.T) {
	vb, err := newVerifyBody(testRegistry(t))
	if err != nil {
		t.Fatal(err)
	}
	req, ev, err := decodeVerify(t, vb, []byte(`{"session":"s","kubeletKeyProof":"AQ==","gce-vtpm":{"eventLog":"AAE="}}`))
	if err != nil || req.Session != "s" || !bytes.Equal(req.KubeletKeyProof, []byte{1}) || req.Kind != attest.KindGCEVTPM {
		t.Fatalf("%+v, %v", req, err)
	}
	if e, ok := ev.(*testEv); !ok || !bytes.Equal(e.EventLog, []byte{0, 1}) {
		t.Fatalf("evidence %#v", ev)
	}
	if req, ev, err := decodeVerify(t, vb, []byte(`{"session":"s","tpm":null}`)); err != nil || req.Kind != "" || ev != nil {
		t.Fatalf("null evidence: %+v %v %v", req, ev, err)
	}
	for name, body := range map[string]string{
		"a kind the server does not verify": `{"session":"s","gcp":{}}`,
		"two kinds' evidence":               `{"session":"s","tpm":{},"gce-vtpm":{}}`,
		"an unknown field in the evidence":  `{"session":"s","tpm":{"eventLog":"","extra":1}}`,
		"an unknown envelope field":         `{"session":"s","Kind":"tpm"}`,
	} {
		_, _, err := decodeVerify(t, vb, []byte(body))
		if r, _ := attest.ReasonOf(err); r != attest.ReasonMalformedRequest {
			t.Errorf("%s: %v, want %s", name, err, attest.ReasonMalformedRequest)
		}
	}
}

// largeBody is a verify body with a 1 MiB event log, the largest the
// server takes.
func largeBody(b *testing.B) []byte {
	body, err := json.Marshal(api.VerifyRequest{Session: "np1.AAAA", Kind: attest.KindTPM,
		Evidence: api.Message(&testEv{EventLog: bytes.Repeat([]byte{7}, 1<<20), Quotes: make([]byte, 300)})})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// BenchmarkVerifyBody is a verify body decoded as the server does
// (verifyBody: one strict pass); BenchmarkVerifyBodyTyped the baseline, a
// strict decode into a struct whose field is the kind's evidence, as
// before the seam; BenchmarkVerifyBodyRaw the envelope with the evidence
// as raw JSON, decoded strictly after (api.VerifyRequest,
// attest.DecodeEvidence), which the seam would cost without verifyBody.
func BenchmarkVerifyBody(b *testing.B) {
	vb, err := newVerifyBody(testRegistry(b))
	if err != nil {
		b.Fatal(err)
	}
	body := largeBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := decodeVerify(b, vb, body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyBodyTyped(b *testing.B) {
	body := largeBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var v struct {
			Session string  `json:"session"`
			TPM     *testEv `json:"tpm"`
		}
		r := httptest.NewRequest("POST", api.PathVerify, bytes.NewReader(body))
		if err := decodeBody(httptest.NewRecorder(), r, api.MaxVerifyBody, &v); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyBodyRaw(b *testing.B) {
	body := largeBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var v api.VerifyRequest
		r := httptest.NewRequest("POST", api.PathVerify, bytes.NewReader(body))
		if err := decodeBody(httptest.NewRecorder(), r, api.MaxVerifyBody, &v); err != nil {
			b.Fatal(err)
		}
		var ev testEv
		if err := attest.DecodeEvidence(v.Evidence, "tpm evidence", &ev); err != nil {
			b.Fatal(err)
		}
	}
}

// TestVerifyBodyAttacksNamedTwice: a body that spells a member twice — a
// kind's evidence as "tpm" and "TPM", a field inside it in two cases, the
// session twice — would have encoding/json merge the two (the last value
// of each field wins); it is MalformedRequest, never merged.
func TestVerifyBodyAttacksNamedTwice(t *testing.T) {
	vb, err := newVerifyBody(testRegistry(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ attack, body string }{
		{"verify body: a kind's evidence given twice, as tpm and TPM", `{"session":"s","tpm":{"eventLog":"AAE="},"TPM":{"quotes":"AQ=="}}`},
		{"verify body: an evidence field given twice in two cases", `{"session":"s","tpm":{"eventLog":"AAE=","EventLog":"AQ=="}}`},
		{"verify body: the session given twice", `{"session":"a","session":"b","tpm":{}}`},
	} {
		_, _, err := decodeVerify(t, vb, []byte(c.body))
		attacktable.CheckRefusal(t, "input", c.attack, attest.ReasonMalformedRequest, err)
	}
}
