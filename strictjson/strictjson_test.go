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
	deep := strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)
	if err := CheckNames([]byte(deep)); err == nil {
		t.Error("nesting beyond MaxDepth passed")
	}
}

// FuzzCheckNames: on any input, CheckNames never panics; what it passes,
// encoding/json decodes into a map with as many keys per object as the
// input names (no member dropped by a repeat).
func FuzzCheckNames(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":1,"A":2}`, `[{"x":{"y":[1,2]}}]`, `{"k":1,"` + "\u212a" + `":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := CheckNames(b); err != nil || !json.Valid(b) {
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) != nil {
			return
		}
		// Count the top level's names with the Decoder.
		dec := json.NewDecoder(strings.NewReader(string(b)))
		n, depth := 0, 0
		wantKey := false
		for {
			tok, err := dec.Token()
			if err != nil {
				break
			}
			switch v := tok.(type) {
			case json.Delim:
				if v == '{' || v == '[' {
					if depth == 1 {
						wantKey = true
					}
					depth++
					if depth == 1 {
						wantKey = v == '{'
					}
				} else {
					depth--
					if depth == 1 {
						wantKey = true
					}
				}
			case string:
				if depth == 1 && wantKey {
					n++
					wantKey = false
					continue
				}
				if depth == 1 {
					wantKey = true
				}
			default:
				if depth == 1 {
					wantKey = true
				}
			}
		}
		if n != len(m) {
			t.Fatalf("passed %s: %d names, decoded %d", b, n, len(m))
		}
	})
}
