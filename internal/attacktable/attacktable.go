// Package attacktable makes the attack tests one table. Each attack test
// calls Check with the attack it ran, the refusal it expected and the
// outcome it got: Check fails the test when they differ and logs a row,
// which `make attacks` collects from `go test -json` output
// (cmd/attacktable) and prints as one table, so the table is exactly what
// the tests asserted in that run.
package attacktable

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
)

// Marker starts a row in the test log.
const Marker = "ATTACK-ROW "

// Row is one attack and its outcome.
type Row struct {
	// Area groups rows: TPM, GCP, AWS, MCS, network, approver, ...
	Area string `json:"area"`
	// Attack says what the attacker did.
	Attack string `json:"attack"`
	// Want is the expected refusal (a reason, or a status and reason).
	Want string `json:"want"`
	// Got is what the server or verifier answered.
	Got string `json:"got"`
	// OK is Got == Want.
	OK bool `json:"ok"`
}

// Check records the row and fails t unless got == want.
func Check(t testing.TB, area, attack, want, got string) {
	t.Helper()
	r := Row{Area: area, Attack: attack, Want: want, Got: got, OK: got == want}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(Marker + string(b))
	if !r.OK {
		t.Errorf("attack %q (%s): got %q, want %q", attack, area, got, want)
	}
}

// Parse returns the row a log line carries, if it carries one.
func Parse(line string) (Row, bool) {
	i := strings.Index(line, Marker)
	if i < 0 {
		return Row{}, false
	}
	var r Row
	if err := json.Unmarshal([]byte(strings.TrimSpace(line[i+len(Marker):])), &r); err != nil {
		return Row{}, false
	}
	return r, true
}

// Outcome is how an error shows in the table: its typed reason,
// "accepted" for none, or "untyped: …" for an error without a reason.
func Outcome(err error) string {
	if err == nil {
		return "accepted"
	}
	if r, ok := attest.ReasonOf(err); ok {
		return string(r)
	}
	return "untyped: " + err.Error()
}

// CheckRefusal is Check for a refusal that must carry reason want.
func CheckRefusal(t testing.TB, area, attack string, want attest.Reason, err error) {
	t.Helper()
	Check(t, area, attack, string(want), Outcome(err))
}
