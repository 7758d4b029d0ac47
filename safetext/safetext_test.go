package safetext_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/nodeproof/nodeproof/safetext"
)

func TestClean(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"printable ASCII as it is", "node worker-0 (pool worker): Error", "node worker-0 (pool worker): Error"},
		{"new lines and carriage returns", "first\nnodeproof: FORGED\r\n", "first nodeproof: FORGED  "},
		{"escape sequences and NUL", "\x1b[2Jred\x00", " [2Jred "},
		{"C1 controls", "a\u0085b\u009bc", "a b c"},
		{"right-to-left override", "report for \u202enode-1\u202c", "report for \ufffdnode-1\ufffd"},
		{"bidi isolates and marks", "\u2066a\u2067b\u2068c\u2069\u200e\u200f", "\ufffda\ufffdb\ufffdc\ufffd\ufffd\ufffd"},
		{"line and paragraph separators", "one\u2028two\u2029three", "one\ufffdtwo\ufffdthree"},
		{"zero-width characters", "wor\u200bker\u200c\u200d\u2060\ufeff", "wor\ufffdker\ufffd\ufffd\ufffd\ufffd"},
		{"tag characters", "a\U000e0041\U000e007fb", "a\ufffd\ufffdb"},
		{"soft hyphen and Arabic letter mark (Cf)", "a\u00adb\u061cc", "a\ufffdb\ufffdc"},
		{"private use and unassigned", "a\ue000b\U0010fffdc\u0378d", "a\ufffdb\ufffdc\ufffdd"},
		{"bytes that are not UTF-8", "a\xffb\xc3", "a\ufffdb\ufffd"},
		{"other scripts, marks and symbols kept", "nœud-é 節點 ✓ é\u00a0x", "nœud-é 節點 ✓ é\u00a0x"},
	}
	for _, c := range cases {
		if got := safetext.Clean(c.in); got != c.want {
			t.Errorf("%s: Clean(%q) = %q; want %q", c.name, c.in, got, c.want)
		}
	}
}

func TestCut(t *testing.T) {
	cases := []struct {
		name, in string
		n        int
		want     string
	}{
		{"short enough", "abc", 3, "abc"},
		{"cut with an ellipsis", "abcdef", 5, "ab…"},
		{"no room for the ellipsis", "abcdef", 2, "ab"},
		{"a character cut in two is dropped", "éééé", 6, "é…"},
		{"cleaned before it is measured", "a\u202eb", 4, "a…"},
		{"negative", "abc", -1, ""},
	}
	for _, c := range cases {
		got := safetext.Cut(c.in, c.n)
		if got != c.want || len(got) > max(c.n, 0) || !utf8.ValidString(got) {
			t.Errorf("%s: Cut(%q, %d) = %q; want %q", c.name, c.in, c.n, got, c.want)
		}
	}
}

type stringer string

func (s stringer) String() string { return string(s) }

// TestHandler: every string a log record carries is cleaned, whatever
// holds it.
func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(safetext.Handler(safetext.Handler(slog.NewJSONHandler(&buf, nil)))) // twice: one wrapper
	log = log.With("remote", "192.0.2.1\u202e").WithGroup("req\u2028")
	log.Warn("node report\u2029", "detail", "a\u202eb\nc", "err", errors.New("json: unknown field \"x\u200by\""),
		"addr", stringer("s\u2066"), "pools", []string{"w\u202e"}, slog.Group("g", "k\u2028", "v\u2029"), "n", 7)
	line := buf.String()
	var v map[string]any
	if err := json.Unmarshal([]byte(line), &v); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	for _, s := range strings.Split(line, "") {
		r, _ := utf8.DecodeRuneInString(s)
		if unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' {
			t.Fatalf("the log line keeps %U: %s", r, line)
		}
	}
	for _, want := range []string{`"msg":"node report\ufffd"`, `"remote":"192.0.2.1\ufffd"`, `"detail":"a\ufffdb c"`, `unknown field \"x\ufffdy\"`,
		`"addr":"s\ufffd"`, `"pools":["w\ufffd"]`, `"g":{"k\ufffd":"v\ufffd"}`, `"n":7`} {
		if !strings.Contains(strings.ReplaceAll(line, "\ufffd", `\ufffd`), want) {
			t.Errorf("the log line lacks %s: %s", want, line)
		}
	}
	if strings.Count(line, "\n") != 1 {
		t.Errorf("more than one line: %q", line)
	}
}

// FuzzClean: whatever comes in, Clean's result is valid UTF-8 with no
// control, format, separator, private-use or unassigned character, is
// Clean's own fixed point, keeps every graphic character in place, and
// Cut bounds it.
func FuzzClean(f *testing.F) {
	for _, s := range []string{"", "plain", "a\nb", "\u202e\u2028\u2029\u200b", "\xff\xfe", "節點", "\U000e0041"} {
		f.Add(s, 16)
	}
	f.Fuzz(func(t *testing.T, in string, n int) {
		got := safetext.Clean(in)
		if !utf8.ValidString(got) {
			t.Fatalf("Clean(%q) = %q: not UTF-8", in, got)
		}
		for _, r := range got {
			if r != '\ufffd' && r != ' ' && !unicode.IsGraphic(r) {
				t.Fatalf("Clean(%q) keeps %U", in, r)
			}
		}
		if again := safetext.Clean(got); again != got {
			t.Fatalf("Clean is not idempotent on %q: %q then %q", in, got, again)
		}
		if utf8.ValidString(in) && utf8.RuneCountInString(got) != utf8.RuneCountInString(in) {
			t.Fatalf("Clean(%q) = %q: characters added or lost", in, got)
		}
		n = n % 4096
		if c := safetext.Cut(in, n); len(c) > max(n, 0) || !utf8.ValidString(c) || !strings.HasPrefix(got, strings.TrimSuffix(c, "…")) {
			t.Fatalf("Cut(%q, %d) = %q", in, n, c)
		}
	})
}
