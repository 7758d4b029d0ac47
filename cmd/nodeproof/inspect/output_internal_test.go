package inspect

import "testing"

// TestCleanJSON: the document keeps its shape, numbers as written, and
// every string, keys too, is cleaned.
func TestCleanJSON(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"scalars", `[1,-2.5e300,18446744073709551617,true,false,null,"a"]`, `[1,-2.5e300,18446744073709551617,true,false,null,"a"]`},
		{"empty containers", `{"a":{},"b":[],"c":[{}]}`, `{"a":{},"b":[],"c":[{}]}`},
		{"nested", `{"a":[{"b":[1,{"c":"d"}]},2],"e":"f"}`, `{"a":[{"b":[1,{"c":"d"}]},2],"e":"f"}`},
		{"escapes cleaned", `{"m":"x\u001b[2J\ny\u2028z"}`, `{"m":"x [2J y\ufffdz"}`},
		{"a raw bidi override in a value and a key", "{\"k\u202e\":\"v\u202e\"}", `{"k\ufffd":"v\ufffd"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := cleanJSON([]byte(c.in))
			if err != nil {
				t.Fatal(err)
			}
			want, err := cleanJSON([]byte(c.want)) // the same encoding of U+FFFD
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("got %s, want %s", got, want)
			}
		})
	}
	if _, err := cleanJSON([]byte(`{"a":`)); err == nil {
		t.Error("a truncated document: no error")
	}
}
