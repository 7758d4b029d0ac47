package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// A kind's message travels beside the envelope's fields under the kind's
// name ({"kind":"tpm", …, "tpm":{…}}), so the envelope names no kind: a
// new kind is new in its own package, not here. Decoding is as strict as
// the envelope's own fields: a field neither the envelope's nor the
// kind's is refused, as is a second kind's.

// kindName is the shape of a kind's name on the wire.
var kindName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// Message marshals a kind's message for an envelope (the types of the
// kinds' packages always marshal; a failure panics).
func Message(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("api: a kind's message does not marshal: %v", err))
	}
	return b
}

// marshalKinded marshals env (the envelope, a type without custom
// marshalling) with msg under kind's name.
func marshalKinded(env any, kind attest.Kind, msg json.RawMessage) ([]byte, error) {
	b, err := json.Marshal(env)
	if err != nil || len(msg) == 0 {
		return b, err
	}
	if !kindName.MatchString(string(kind)) {
		return nil, fmt.Errorf("api: kind %q is not a kind's name", kind)
	}
	name, _ := json.Marshal(string(kind))
	var out bytes.Buffer
	out.Write(b[:len(b)-1]) // the envelope without its closing brace
	if len(b) > 2 {
		out.WriteByte(',')
	}
	out.Write(name)
	out.WriteByte(':')
	out.Write(msg)
	out.WriteByte('}')
	return out.Bytes(), nil
}

// unmarshalKinded decodes data into env (strictly: no unknown field) and
// returns the one field that is not env's: a kind's name and its message.
func unmarshalKinded(data []byte, env any, envFields []string) (attest.Kind, json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return "", nil, err
	}
	var kind attest.Kind
	var msg json.RawMessage
	rest := map[string]json.RawMessage{}
	for name, v := range fields {
		known := false
		for _, f := range envFields {
			if f == name {
				known = true
			}
		}
		switch {
		case known:
			rest[name] = v
		case !kindName.MatchString(name):
			return "", nil, fmt.Errorf("json: unknown field %q", name)
		case kind != "":
			return "", nil, fmt.Errorf("json: two kinds' messages (%q and %q)", kind, name)
		default:
			kind, msg = attest.Kind(name), v
		}
	}
	b, err := json.Marshal(rest)
	if err != nil {
		return "", nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(env); err != nil {
		return "", nil, err
	}
	return kind, msg, nil
}

type challengeRequest struct {
	Kind             attest.Kind    `json:"kind"`
	Pool             string         `json:"pool"`
	KubeletPublicKey []byte         `json:"kubeletPublicKey"`
	NodeName         string         `json:"nodeName,omitempty"`
	Purpose          attest.Purpose `json:"purpose,omitempty"`
}

var challengeRequestFields = []string{"kind", "pool", "kubeletPublicKey", "nodeName", "purpose"}

// MarshalJSON puts Request under the kind's name.
func (r ChallengeRequest) MarshalJSON() ([]byte, error) {
	return marshalKinded(challengeRequest{r.Kind, r.Pool, r.KubeletPublicKey, r.NodeName, r.Purpose}, r.Kind, r.Request)
}

// UnmarshalJSON takes the message under the kind's name as Request; any
// other field not the envelope's is an error.
func (r *ChallengeRequest) UnmarshalJSON(data []byte) error {
	var env challengeRequest
	kind, msg, err := unmarshalKinded(data, &env, challengeRequestFields)
	if err != nil {
		return err
	}
	if kind != "" && kind != env.Kind {
		return fmt.Errorf("json: a %q message in a request of kind %q", kind, env.Kind)
	}
	*r = ChallengeRequest{Kind: env.Kind, Pool: env.Pool, KubeletPublicKey: env.KubeletPublicKey, NodeName: env.NodeName, Purpose: env.Purpose, Request: msg}
	return nil
}

type challengeResponse struct {
	Session string      `json:"session"`
	Expires time.Time   `json:"expires"`
	Kind    attest.Kind `json:"kind,omitempty"`
}

var challengeResponseFields = []string{"session", "expires", "kind"}

// MarshalJSON puts Challenge under the kind's name.
func (r ChallengeResponse) MarshalJSON() ([]byte, error) {
	return marshalKinded(challengeResponse{r.Session, r.Expires, r.Kind}, r.Kind, r.Challenge)
}

// UnmarshalJSON takes the message under the kind's name as Challenge.
func (r *ChallengeResponse) UnmarshalJSON(data []byte) error {
	var env challengeResponse
	kind, msg, err := unmarshalKinded(data, &env, challengeResponseFields)
	if err != nil {
		return err
	}
	if env.Kind == "" {
		env.Kind = kind
	} else if kind != "" && kind != env.Kind {
		return fmt.Errorf("json: a %q challenge in a response of kind %q", kind, env.Kind)
	}
	*r = ChallengeResponse{Session: env.Session, Expires: env.Expires, Kind: env.Kind, Challenge: msg}
	return nil
}

type verifyRequest struct {
	Session         string `json:"session"`
	KubeletKeyProof []byte `json:"kubeletKeyProof,omitempty"`
}

var verifyRequestFields = []string{"session", "kubeletKeyProof"}

// MarshalJSON puts Evidence under Kind's name.
func (r VerifyRequest) MarshalJSON() ([]byte, error) {
	return marshalKinded(verifyRequest{r.Session, r.KubeletKeyProof}, r.Kind, r.Evidence)
}

// UnmarshalJSON takes the one field not the envelope's as the evidence of
// the kind it names.
func (r *VerifyRequest) UnmarshalJSON(data []byte) error {
	var env verifyRequest
	kind, msg, err := unmarshalKinded(data, &env, verifyRequestFields)
	if err != nil {
		return err
	}
	*r = VerifyRequest{Session: env.Session, KubeletKeyProof: env.KubeletKeyProof, Kind: kind, Evidence: msg}
	return nil
}
