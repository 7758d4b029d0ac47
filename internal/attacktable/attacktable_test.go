package attacktable

import (
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what was logged and whether it
// failed.
type recorder struct {
	testing.TB
	logs   []string
	failed bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Log(args ...any)       { r.logs = append(r.logs, args[0].(string)) }
func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Fatal(...any)          { r.failed = true }

func TestCheck(t *testing.T) {
	cases := []struct {
		name      string
		want, got string
		fails     bool
	}{
		{"refused as expected", "403 TokenAlreadyUsed", "403 TokenAlreadyUsed", false},
		{"refused for another reason", "403 TokenAlreadyUsed", "403 TokenInvalid", true},
		{"accepted", "403 TokenAlreadyUsed", "200", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			Check(r, "MCS", "config token | replayed", tc.want, tc.got)
			if r.failed != tc.fails {
				t.Fatalf("failed = %v, want %v", r.failed, tc.fails)
			}
			if len(r.logs) != 1 {
				t.Fatalf("%d log lines, want 1", len(r.logs))
			}
			row, ok := Parse("    attacks_test.go:12: " + r.logs[0])
			if !ok || row.Attack != "config token | replayed" || row.Want != tc.want || row.Got != tc.got || row.OK == tc.fails {
				t.Fatalf("parsed %+v, %v", row, ok)
			}
		})
	}
	if _, ok := Parse("an ordinary log line"); ok {
		t.Fatal("an ordinary line parsed as a row")
	}
	if _, ok := Parse(strings.TrimSpace(Marker) + " {not json"); ok {
		t.Fatal("a broken row parsed")
	}
}
