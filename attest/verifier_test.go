package attest

import (
	"context"
	"encoding/json"
	"testing"
)

type seamReq struct {
	A int `json:"a"`
}

type seamEv struct {
	B string `json:"b"`
}

// TestSeam: a kind's typed steps behind attest.Verifier get their messages
// decoded strictly; a registry refuses a kind twice and leaves nil out.
func TestSeam(t *testing.T) {
	var gotReq *seamReq
	var gotEv *seamEv
	v := Seam(KindTPM, func(in ChallengeInput, r *seamReq) (any, *Session, error) {
		gotReq = r
		return struct{}{}, &Session{Kind: KindTPM}, in.AdmitClaimed("x")
	}, func(_ context.Context, _ *Session, e *seamEv) (*Claims, error) {
		gotEv = e
		return &Claims{Kind: KindTPM}, nil
	})
	if _, _, err := v.Challenge(context.Background(), ChallengeInput{Request: json.RawMessage(`{"a":3}`)}); err != nil || gotReq.A != 3 {
		t.Fatalf("challenge: %v, %+v", err, gotReq)
	}
	refused := Deny(ReasonRateLimited, "no")
	if _, _, err := v.Challenge(context.Background(), ChallengeInput{Request: json.RawMessage(`{}`), Admit: func(string) error { return refused }}); err != refused {
		t.Fatalf("Admit's refusal: got %v", err)
	}
	ev := v.NewEvidence()
	if err := json.Unmarshal([]byte(`{"b":"x"}`), ev); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(context.Background(), nil, ev); err != nil || gotEv.B != "x" {
		t.Fatalf("verify: %v, %+v", err, gotEv)
	}
	for name, ev := range map[string]any{"nil": nil, "another type": &seamReq{}, "a nil pointer": (*seamEv)(nil)} {
		if _, err := v.Verify(context.Background(), nil, ev); !isReason(err, ReasonMalformed) {
			t.Errorf("evidence %s: %v, want %s", name, err, ReasonMalformed)
		}
	}
	for name, raw := range map[string]string{"absent": "", "null": "null", "unknown field": `{"a":1,"z":2}`, "two values": `{"a":1} {}`, "mistyped": `{"a":"x"}`} {
		_, _, err := v.Challenge(context.Background(), ChallengeInput{Request: json.RawMessage(raw)})
		if r, _ := ReasonOf(err); r != ReasonMalformed {
			t.Errorf("%s request: %v, want %s", name, err, ReasonMalformed)
		}
	}
	if _, err := NewRegistry(v, v); err == nil {
		t.Error("a registry took one kind twice")
	}
	r, err := NewRegistry(v, nil)
	if err != nil || len(r.Kinds()) != 1 || r.Kinds()[0] != KindTPM {
		t.Errorf("registry %v, %v", r, err)
	}
}

func isReason(err error, r Reason) bool {
	got, _ := ReasonOf(err)
	return got == r
}
