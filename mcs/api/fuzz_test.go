package api

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzKindedEnvelopes feeds the three envelopes that carry a kind's
// message any bytes. Properties: a body that decodes has at most one
// kind's message, of the envelope's kind when it names one, and marshals
// back to a body that decodes to the same envelope and message.
func FuzzKindedEnvelopes(f *testing.F) {
	for _, s := range []string{
		`{"kind":"tpm","pool":"worker","kubeletPublicKey":"AQ==","tpm":{"ekPublic":"AQ=="}}`,
		`{"kind":"gce-vtpm","pool":"worker","kubeletPublicKey":"AQ==","nodeName":"n","purpose":"reattest","gce-vtpm":{}}`,
		`{"session":"np1.AAAA","expires":"2026-11-26T00:00:00Z","kind":"aws-nitrotpm","aws-nitrotpm":{"nonce":"AQ=="}}`,
		`{"session":"np1.AAAA","kubeletKeyProof":"AQ==","gcp":{"token":"x"}}`,
		`{"session":"s","tpm":{},"aws":{}}`,
		`{"kind":"tpm","Kind":"gcp"}`,
	} {
		f.Add(uint8(0), []byte(s))
		f.Add(uint8(1), []byte(s))
		f.Add(uint8(2), []byte(s))
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		switch which % 3 {
		case 0:
			var r ChallengeRequest
			if json.Unmarshal(body, &r) != nil {
				return
			}
			b, err := json.Marshal(r)
			if err != nil {
				if kindName.MatchString(string(r.Kind)) || len(r.Request) == 0 {
					t.Fatalf("%+v decoded from %q does not marshal: %v", r, body, err)
				}
				return
			}
			var back ChallengeRequest
			if err := json.Unmarshal(b, &back); err != nil || back.Kind != r.Kind || back.Pool != r.Pool || !sameJSON(back.Request, r.Request) {
				t.Fatalf("%q → %+v → %s → %+v, %v", body, r, b, back, err)
			}
		case 1:
			var r ChallengeResponse
			if json.Unmarshal(body, &r) != nil {
				return
			}
			if len(r.Challenge) > 0 && r.Kind == "" {
				t.Fatalf("a challenge without its kind from %q", body)
			}
		case 2:
			var r VerifyRequest
			if json.Unmarshal(body, &r) != nil {
				return
			}
			if (r.Kind == "") != (r.Evidence == nil) {
				t.Fatalf("kind %q with evidence %q from %q", r.Kind, r.Evidence, body)
			}
			if r.Kind != "" && !kindName.MatchString(string(r.Kind)) {
				t.Fatalf("evidence under %q, not a kind's name", r.Kind)
			}
		}
	})
}

// sameJSON reports whether a and b are the same JSON value (json.Marshal
// escapes HTML characters in a raw message: the bytes may differ).
func sameJSON(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}
