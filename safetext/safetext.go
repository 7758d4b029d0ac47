// Package safetext makes text that came from outside — what a node
// reports, the names in a CSR, a client's request, an error that quotes
// any of them — safe to put into a log line or a Kubernetes Event: it can
// neither forge a line nor hide or reorder what a reader sees.
//
// Clean is the one rule; Cut bounds a length on top of it; Handler
// applies it to every log record of a slog.Logger, and the Event
// recorders apply it to every Event (store/kubestore.SafeRecorder), so no
// call site has to remember it.
package safetext

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Clean returns s with every character that could forge or disguise
// text replaced:
//   - control characters (category Cc: new lines, carriage returns,
//     escape sequences, NUL) by a space;
//   - format characters (category Cf: the bidi controls U+202A–U+202E
//     and U+2066–U+2069, the marks U+200E and U+200F, zero-width spaces
//     and joiners U+200B–U+200D, U+2060, U+FEFF, the tag characters),
//     the line and paragraph separators U+2028 and U+2029 (Zl, Zp),
//     private-use (Co) and unassigned (Cn) code points, and bytes that
//     are not UTF-8, by U+FFFD, so that a reader sees something was
//     there.
//
// Everything else — letters, marks, digits, punctuation, symbols and
// spaces in any script (unicode.IsGraphic) — is kept. Text that is all
// printable ASCII is returned as it is, without a copy.
func Clean(s string) string {
	i := 0
	for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f {
		i++
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			b.WriteRune(utf8.RuneError)
		case unicode.IsControl(r):
			b.WriteByte(' ')
		case !unicode.IsGraphic(r):
			b.WriteRune(utf8.RuneError)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// Cut is Clean(s) cut to at most n bytes, on a character boundary,
// ending in "…" when something was cut (and n leaves room for it).
func Cut(s string, n int) string {
	s = Clean(s)
	if len(s) <= n {
		return s
	}
	const more = "…"
	n, tail := max(n, 0), ""
	if n >= len(more) {
		n, tail = n-len(more), more
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + tail
}
