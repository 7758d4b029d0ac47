// Package strictjson checks what encoding/json lets pass silently: an
// object that names a member twice. encoding/json keeps the last value of
// a repeated name, and matches names to struct fields without regard to
// case, so {"tpm": A, "TPM": B} decodes B over A — whichever a reader
// looks at, the other part of the input was read by nothing. CheckNames
// refuses such input before it is decoded.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrDuplicateName: an object names a member twice, exactly or as
// encoding/json would match it (case-insensitively, Unicode simple
// folding).
var ErrDuplicateName = errors.New("a member named twice")

// MaxDepth bounds the nesting CheckNames follows (encoding/json's own
// limit is 10000).
const MaxDepth = 1000

// CheckNames reads data, one JSON value, and refuses an object in it that
// names a member twice (ErrDuplicateName), comparing names as
// encoding/json matches them to fields, and nesting deeper than MaxDepth.
// It reads data in place and fast — only the structure and the objects'
// names are looked at, strings are skipped with bytes.IndexByte, no value
// is copied — and does not check the rest of the syntax: malformed JSON
// either fails here (ErrMalformed) or passes to the decoder that reads it
// next, which refuses it. On well-formed JSON it is exact.
func CheckNames(data []byte) error {
	type frame struct {
		object bool
		names  map[string]struct{}
	}
	var stack []frame
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '{', '[':
			if len(stack) >= MaxDepth {
				return fmt.Errorf("strictjson: nested deeper than %d", MaxDepth)
			}
			f := frame{object: data[i] == '{'}
			if f.object {
				f.names = map[string]struct{}{}
			}
			stack = append(stack, f)
		case '}', ']':
			if len(stack) == 0 {
				return ErrMalformed
			}
			stack = stack[:len(stack)-1]
		case '"':
			end := stringEnd(data, i)
			if end < 0 {
				return ErrMalformed
			}
			// In well-formed JSON, a string followed by ':' is an
			// object's member name, and only that.
			if top := len(stack) - 1; top >= 0 && stack[top].object && nextIsColon(data, end+1) {
				var name string
				if err := json.Unmarshal(data[i:end+1], &name); err != nil {
					return fmt.Errorf("%w: a member name: %v", ErrMalformed, err)
				}
				k := fold(name)
				if _, dup := stack[top].names[k]; dup {
					return fmt.Errorf("%w: %q", ErrDuplicateName, name)
				}
				stack[top].names[k] = struct{}{}
			}
			i = end
		}
	}
	return nil
}

// ErrMalformed: data is not JSON (CheckNames found it out).
var ErrMalformed = errors.New("strictjson: malformed JSON")

// stringEnd is the index of the quote that closes the string opening at
// data[start], or -1 if it never closes: the next quote not escaped by an
// odd run of backslashes.
func stringEnd(data []byte, start int) int {
	for j := start + 1; j < len(data); {
		q := bytes.IndexByte(data[j:], '"')
		if q < 0 {
			return -1
		}
		j += q
		n := 0
		for k := j - 1; k > start && data[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return j
		}
		j++
	}
	return -1
}

// nextIsColon says whether the first byte from i that is not JSON white
// space is ':'.
func nextIsColon(data []byte, i int) bool {
	for ; i < len(data); i++ {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
		case ':':
			return true
		default:
			return false
		}
	}
	return false
}

// fold is s with each rune replaced by the least rune of its Unicode
// simple-folding orbit: fold(a) == fold(b) exactly when strings.EqualFold
// (and encoding/json's name matching) says a and b are the same name.
func fold(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == utf8.RuneError {
			b.WriteRune(r)
			continue
		}
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}
