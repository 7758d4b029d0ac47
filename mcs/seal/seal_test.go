package seal

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

func TestSealOpen(t *testing.T) {
	now := t0
	clock := func() time.Time { return now }
	path := filepath.Join(t.TempDir(), "keys.json")
	r, err := LoadOrCreate(path, clock)
	if err != nil {
		t.Fatal(err)
	}
	box, err := r.Seal("session", []byte("secret state"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := LoadOrCreate(filepath.Join(t.TempDir(), "other.json"), clock)
	if err != nil {
		t.Fatal(err)
	}
	flip := func(s string, i int) string {
		b := []byte(s)
		b[i] ^= 1
		return string(b)
	}
	cases := []struct {
		name, purpose, box string
		ring               *Keyring
		ok                 bool
	}{
		{"honest", "session", box, r, true},
		{"another purpose", "config-token", box, r, false},
		{"another server's keys", "session", box, other, false},
		{"tampered ciphertext", "session", flip(box, len(box)-3), r, false},
		{"tampered key ID", "session", flip(box, 5), r, false},
		{"truncated", "session", box[:20], r, false},
		{"no prefix", "session", strings.TrimPrefix(box, Prefix), r, false},
		{"oversized", "session", Prefix + strings.Repeat("A", MaxBox), r, false},
		{"not base64", "session", Prefix + "!!!!", r, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pt, err := tc.ring.Open(tc.purpose, tc.box)
			if tc.ok {
				if err != nil || string(pt) != "secret state" {
					t.Fatalf("open: %q %v", pt, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %q, %v; want ErrInvalid", pt, err)
			}
		})
	}
	// The keyring survives a restart, and a rotation keeps old boxes opening
	// until the old key is past retention.
	again, err := LoadOrCreate(path, clock)
	if err != nil {
		t.Fatal(err)
	}
	now = t0.Add(time.Hour)
	if _, err := again.Rotate(24*time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := again.Open("session", box); err != nil {
		t.Fatalf("box from before rotation: %v", err)
	}
	fresh, _ := again.Seal("session", []byte("x"))
	if _, err := r.Open("session", fresh); err == nil {
		t.Fatal("a keyring without the new key opened its box")
	}
	now = t0.Add(48 * time.Hour)
	if _, err := again.Rotate(24*time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := again.Open("session", box); !errors.Is(err, ErrInvalid) {
		t.Fatal("a box sealed by a retired key still opens")
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("keyring file mode %v %v", fi.Mode(), err)
	}
}

// TestStagedRotationAcrossReplicas: two replicas share a keyring file; one
// rotates with a delayed activation. Until the other has reloaded, both
// still seal with the old key, so neither hands out a box the other
// cannot open; after activation both seal with the new one.
func TestStagedRotationAcrossReplicas(t *testing.T) {
	now := t0
	clock := func() time.Time { return now }
	path := filepath.Join(t.TempDir(), "keys.json")
	a, err := LoadOrCreate(path, clock)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreate(path, clock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Rotate(24*time.Hour, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	// b has not reloaded yet: it must open what a seals now.
	box, err := a.Seal("session", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Open("session", box); err != nil {
		t.Fatalf("a sealed with a key that is not active yet: %v", err)
	}
	if changed, err := b.Reload(); err != nil || !changed {
		t.Fatalf("Reload: %v %v", changed, err)
	}
	if changed, err := b.Reload(); err != nil || changed {
		t.Fatalf("second Reload: %v %v", changed, err)
	}
	now = t0.Add(3 * time.Minute)
	box, err = b.Seal("session", []byte("y"))
	if err != nil {
		t.Fatal(err)
	}
	stale, err := New(a.fileKeys()[1:], clock) // a replica that never got the new key
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stale.Open("session", box); !errors.Is(err, ErrInvalid) {
		t.Fatal("after activation the new key should seal")
	}
	if _, err := a.Open("session", box); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reload(); err == nil {
		t.Fatal("a malformed keyring file was accepted")
	}
	if _, err := b.Open("session", box); err != nil {
		t.Fatal("a failed Reload changed the keys")
	}
}

func FuzzOpen(f *testing.F) {
	r, err := New([]Key{{ID: make([]byte, 8), Secret: make([]byte, 32)}}, time.Now)
	if err != nil {
		f.Fatal(err)
	}
	box, _ := r.Seal("p", []byte("x"))
	f.Add(box)
	f.Fuzz(func(t *testing.T, s string) {
		if pt, err := r.Open("p", s); err == nil && string(pt) != "x" {
			// Only a genuine box opens; its content is what was sealed.
			t.Fatalf("forged box opened to %q", pt)
		}
	})
}
