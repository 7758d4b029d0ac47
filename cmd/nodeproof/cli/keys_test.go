package cli

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/mcs/seal"
)

// TestKeysRotateSaysWhatItKept: `nodeproof keys rotate` with its defaults
// on a keyring whose key was made 25 hours ago keeps that key until a day
// after the new key takes over, and says so: which key, until when.
func TestKeysRotateSaysWhatItKept(t *testing.T) {
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	path := filepath.Join(t.TempDir(), "keys.json")
	old, err := seal.NewKey(now.Add(-25 * time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal([]seal.Key{old})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := rotateKeys(&out, path, seal.DefaultRetain, seal.DefaultActivateAfter, func() time.Time { return now }); err != nil {
		t.Fatal(err)
	}
	activation := now.Add(seal.DefaultActivateAfter)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("output:\n%s", out.String())
	}
	for _, want := range []string{hex.EncodeToString(old.ID), activation.Format(time.RFC3339), activation.Add(seal.DefaultRetain).Format(time.RFC3339)} {
		if !strings.Contains(lines[1], want) || !strings.HasPrefix(lines[1], "kept key") {
			t.Errorf("the kept line %q does not say %q", lines[1], want)
		}
	}
	k, err := seal.LoadOrCreate(path, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	box, err := k.Seal("p", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(box, seal.Prefix) {
		t.Fatalf("box %q", box)
	}
}
