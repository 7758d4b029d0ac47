package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadAKState: the kept AK's file is read whole or not at all; a file
// that is missing is nothing to say, and one that is torn, foreign or too
// large is said and ignored (the run makes a new AK and writes a good
// file).
func TestLoadAKState(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := saveAKState(good, akState{AK: []byte{1, 2, 3}, Ticket: "np1.x"}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(good); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("saved with %v, %v; want 0600", fi, err)
	}
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name       string
		path       string
		wantAK     bool
		wantTicket string
		wantNote   string
	}{
		{name: "written by the agent", path: good, wantAK: true, wantTicket: "np1.x"},
		{name: "missing", path: filepath.Join(dir, "none.json")},
		{name: "torn", path: write("torn.json", `{"ak":"AQID`), wantNote: "does not decode"},
		{name: "no AK", path: write("empty.json", `{"ticket":"np1.x"}`), wantNote: "does not decode"},
		{name: "too large", path: write("large.json", `{"ak":"`+strings.Repeat("A", maxAKState)+`"}`), wantNote: "over"},
		{name: "a directory", path: dir, wantNote: "making a new one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, note := loadAKState(tc.path)
			if (len(st.AK) > 0) != tc.wantAK || st.Ticket != tc.wantTicket {
				t.Errorf("read AK %d bytes, ticket %q; want AK %v, ticket %q", len(st.AK), st.Ticket, tc.wantAK, tc.wantTicket)
			}
			if tc.wantNote == "" && note != "" || !strings.Contains(note, tc.wantNote) {
				t.Errorf("note %q, want one saying %q", note, tc.wantNote)
			}
		})
	}
}
