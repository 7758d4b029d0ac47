package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strings"

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

// The envelopes without their methods: what json marshals as the
// envelope's own fields (the kind's message is `json:"-"`).
type (
	challengeRequest  ChallengeRequest
	challengeResponse ChallengeResponse
	verifyRequest     VerifyRequest
)

// jsonFields are the names json gives v's fields (a struct).
func jsonFields(v any) []string {
	t := reflect.TypeOf(v)
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "-" && name != "" {
			names = append(names, name)
		}
	}
	return names
}

// MarshalJSON puts Request under the kind's name.
func (r ChallengeRequest) MarshalJSON() ([]byte, error) {
	return marshalKinded(challengeRequest(r), r.Kind, r.Request)
}

// UnmarshalJSON takes the message under the kind's name as Request; any
// other field not the envelope's is an error.
func (r *ChallengeRequest) UnmarshalJSON(data []byte) error {
	var env challengeRequest
	kind, msg, err := unmarshalKinded(data, &env, jsonFields(env))
	if err != nil {
		return err
	}
	if kind != "" && kind != env.Kind {
		return fmt.Errorf("json: a %q message in a request of kind %q", kind, env.Kind)
	}
	*r = ChallengeRequest(env)
	r.Request = msg
	return nil
}

// MarshalJSON puts Challenge under the kind's name.
func (r ChallengeResponse) MarshalJSON() ([]byte, error) {
	return marshalKinded(challengeResponse(r), r.Kind, r.Challenge)
}

// UnmarshalJSON takes the message under the kind's name as Challenge.
func (r *ChallengeResponse) UnmarshalJSON(data []byte) error {
	var env challengeResponse
	kind, msg, err := unmarshalKinded(data, &env, jsonFields(env))
	if err != nil {
		return err
	}
	if env.Kind == "" {
		env.Kind = kind
	} else if kind != "" && kind != env.Kind {
		return fmt.Errorf("json: a %q challenge in a response of kind %q", kind, env.Kind)
	}
	*r = ChallengeResponse(env)
	r.Challenge = msg
	return nil
}

// MarshalJSON puts Evidence under Kind's name.
func (r VerifyRequest) MarshalJSON() ([]byte, error) {
	return marshalKinded(verifyRequest(r), r.Kind, r.Evidence)
}

// UnmarshalJSON takes the one field not the envelope's as the evidence of
// the kind it names.
func (r *VerifyRequest) UnmarshalJSON(data []byte) error {
	var env verifyRequest
	kind, msg, err := unmarshalKinded(data, &env, jsonFields(env))
	if err != nil {
		return err
	}
	*r = VerifyRequest(env)
	r.Kind, r.Evidence = kind, msg
	return nil
}
