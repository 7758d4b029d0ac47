package api

import (
	"encoding/json"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
)

// TestKindedWire: a kind's message travels under its name and comes back
// as it went; a field neither the envelope's nor a kind's, a second kind's
// message, or a message of another kind than the request's is an error.
func TestKindedWire(t *testing.T) {
	req := ChallengeRequest{Kind: attest.KindTPM, Pool: "worker", KubeletPublicKey: []byte{1}, Request: json.RawMessage(`{"ekPublic":"AQ=="}`)}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"kind":"tpm","pool":"worker","kubeletPublicKey":"AQ==","tpm":{"ekPublic":"AQ=="}}`; string(b) != want {
		t.Fatalf("marshalled %s, want %s", b, want)
	}
	var back ChallengeRequest
	if err := json.Unmarshal(b, &back); err != nil || back.Kind != attest.KindTPM || string(back.Request) != `{"ekPublic":"AQ=="}` {
		t.Fatalf("unmarshalled %+v, %v", back, err)
	}
	ev := VerifyRequest{Session: "s", Kind: attest.KindGCEVTPM, Evidence: json.RawMessage(`{}`)}
	b, _ = json.Marshal(ev)
	var vr VerifyRequest
	if err := json.Unmarshal(b, &vr); err != nil || vr.Kind != attest.KindGCEVTPM || vr.Session != "s" {
		t.Fatalf("verify request %s came back as %+v, %v", b, vr, err)
	}
	ch := ChallengeResponse{Session: "s", Kind: attest.KindNitroTPM, Challenge: json.RawMessage(`{"nonce":"AQ=="}`)}
	b, _ = json.Marshal(ch)
	var cr ChallengeResponse
	if err := json.Unmarshal(b, &cr); err != nil || cr.Kind != attest.KindNitroTPM || string(cr.Challenge) != `{"nonce":"AQ=="}` {
		t.Fatalf("challenge response %s came back as %+v, %v", b, cr, err)
	}
	for name, body := range map[string]string{
		"unknown envelope field":  `{"kind":"tpm","pool":"w","kubeletPublicKey":"AQ==","Extra":1}`,
		"two kinds' messages":     `{"kind":"tpm","pool":"w","kubeletPublicKey":"AQ==","tpm":{},"gcp":{}}`,
		"another kind's message":  `{"kind":"tpm","pool":"w","kubeletPublicKey":"AQ==","gcp":{}}`,
		"not an object":           `[1]`,
		"envelope field mistyped": `{"kind":"tpm","pool":7}`,
	} {
		var r ChallengeRequest
		if err := json.Unmarshal([]byte(body), &r); err == nil {
			t.Errorf("%s: %s decoded as %+v", name, body, r)
		}
	}
	var v VerifyRequest
	if err := json.Unmarshal([]byte(`{"session":"s","tpm":{},"aws":{}}`), &v); err == nil {
		t.Error("a verify request with two kinds' evidence decoded")
	}
}
