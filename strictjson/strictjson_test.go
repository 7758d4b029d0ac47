package strictjson

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestCheckNames: repeated names are refused at any depth, as
// encoding/json would match them; distinct names, arrays of objects and
// values that look like names pass.
func TestCheckNames(t *testing.T) {
	cases := []struct {
		name string
		in   string
		dup  bool
	}{
		{"distinct", `{"a":1,"b":{"a":2},"c":[{"a":1},{"a":2}]}`, false},
		{"a value spelt like a key", `{"a":"a","b":"A"}`, false},
		{"exact repeat", `{"a":1,"a":2}`, true},
		{"case variant", `{"tpm":{},"TPM":{}}`, true},
		{"nested case variant", `{"tpm":{"ekPub":"x","EKPub":"y"}}`, true},
		{"in an array's object", `[{"x":1},{"x":1,"X":2}]`, true},
		{"after a nested object", `{"a":{"b":1},"A":2}`, true},
		{"kelvin sign folds to k", "{\"k\":1,\"\u212a\":2}", true},
		{"long s folds to s", "{\"s\":1,\"\u017f\":2}", true},
		{"an escaped spelling of the same name", `{"tpm":1,"t\u0070m":2}`, true},
		{"an escaped quote inside a name", `{"a\"b":1,"a\"B":2}`, true},
		{"a value ending in a backslash", `{"a":"x\\","A":1}`, true},
		{"a scalar", `"x"`, false},
		{"empty object", `{}`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckNames([]byte(c.in))
			if c.dup != errors.Is(err, ErrDuplicateName) || (!c.dup && err != nil) {
				t.Errorf("CheckNames(%s) = %v; want duplicate %v", c.in, err, c.dup)
			}
		})
	}
	for _, bad := range []string{`{"a":"unterminated`, `]`, `{"a":1}}`} {
		if err := CheckNames([]byte(bad)); err == nil && json.Valid([]byte(bad)) {
			t.Errorf("CheckNames(%s) passed malformed JSON that json.Valid accepts", bad)
		}
	}
	deep := strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)
	if err := CheckNames([]byte(deep)); err == nil {
		t.Error("nesting beyond MaxDepth passed")
	}
}

// FuzzCheckNames: on any input, CheckNames never panics; on well-formed
// JSON it finds a repeated name exactly when a reference walk over
// encoding/json's own tokens does (no name missed, none invented).
func FuzzCheckNames(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":1,"A":2}`, `[{"x":{"y":[1,2]}}]`, `{"k":1,"` + "\u212a" + `":2}`, `{"a\"":1,"b":"\\"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := CheckNames(b)
		if !json.Valid(b) {
			return
		}
		want, rerr := referenceDuplicate(b)
		if rerr != nil {
			return // deeper than the reference walks
		}
		if got := errors.Is(err, ErrDuplicateName); got != want {
			t.Fatalf("CheckNames(%s) = %v; the reference walk finds a repeated name: %v", b, err, want)
		}
	})
}

// referenceDuplicate walks b's tokens with encoding/json's Decoder and
// reports whether an object names a member twice, as strings.EqualFold
// compares.
func referenceDuplicate(b []byte) (bool, error) {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	type frame struct {
		object, wantKey bool
		names           []string
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return false, nil // the end
		}
		if len(stack) > MaxDepth {
			return false, errors.New("too deep")
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if s, ok := tok.(string); ok && top != nil && top.object && top.wantKey {
			for _, n := range top.names {
				if strings.EqualFold(n, s) {
					return true, nil
				}
			}
			top.names, top.wantKey = append(top.names, s), false
			continue
		}
		if top != nil && top.object {
			top.wantKey = true
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, &frame{object: tok == json.Delim('{'), wantKey: tok == json.Delim('{')})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].wantKey = true
			}
		}
	}
}
