package mcs

import (
	"fmt"
	"net/http"
	"reflect"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// verifyBody is the type a verify body decodes into, in one strict pass:
// the envelope's fields (api.VerifyRequest's) and, for every kind the
// server verifies, the kind's evidence (Verifier.NewEvidence) under the
// kind's name. The evidence — an event log of up to 1 MiB — is read once,
// with no copy of its JSON, as when the kinds were fields of the envelope;
// and nothing in mcs names a kind.
type verifyBody struct {
	t     reflect.Type
	kinds []attest.Kind // field 2+i holds kinds[i]'s evidence
}

// newVerifyBody makes the verify body of the kinds in reg.
func newVerifyBody(reg attest.Registry) (*verifyBody, error) {
	fields := []reflect.StructField{
		{Name: "Session", Type: reflect.TypeFor[string](), Tag: `json:"session"`},
		{Name: "KubeletKeyProof", Type: reflect.TypeFor[[]byte](), Tag: `json:"kubeletKeyProof,omitempty"`},
	}
	vb := &verifyBody{}
	for i, k := range reg.Kinds() {
		t := reflect.TypeOf(reg[k].NewEvidence())
		if t == nil || t.Kind() != reflect.Pointer {
			return nil, fmt.Errorf("mcs: the %s verifier's evidence is not a pointer", k)
		}
		fields = append(fields, reflect.StructField{Name: fmt.Sprintf("Kind%d", i), Type: t, Tag: reflect.StructTag(fmt.Sprintf(`json:%q`, string(k)+",omitempty"))})
		vb.kinds = append(vb.kinds, k)
	}
	vb.t = reflect.StructOf(fields)
	return vb, nil
}

// decode reads a verify body (decodeBody: bounded, strict) and returns
// its envelope (Kind set to the kind whose evidence it carries, "" for
// none) and the evidence. A kind's message the server does not verify is
// an unknown field (MalformedRequest); two kinds' evidence is too.
func (vb *verifyBody) decode(w http.ResponseWriter, r *http.Request) (*api.VerifyRequest, any, error) {
	v := reflect.New(vb.t)
	if err := decodeBody(w, r, api.MaxVerifyBody, v.Interface()); err != nil {
		return nil, nil, err
	}
	e := v.Elem()
	req := &api.VerifyRequest{Session: e.Field(0).String(), KubeletKeyProof: e.Field(1).Bytes()}
	var ev any
	for i, k := range vb.kinds {
		f := e.Field(2 + i)
		if f.IsNil() {
			continue
		}
		if req.Kind != "" {
			return nil, nil, deny(attest.ReasonMalformedRequest, "body: evidence of two kinds (%s and %s)", req.Kind, k)
		}
		req.Kind, ev = k, f.Interface()
	}
	return req, ev, nil
}
