package seal

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testClock is a clock the test moves.
type testClock struct{ now time.Time }

func (c *testClock) Now() time.Time          { return c.now }
func (c *testClock) advance(d time.Duration) { c.now = c.now.Add(d) }

// ringAt is a keyring file at path holding keys, loaded with clock.
func ringAt(t *testing.T, path string, clock func() time.Time, keys ...Key) *Keyring {
	t.Helper()
	b, err := json.Marshal(keys)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := LoadOrCreate(path, clock)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustKey(t *testing.T, created time.Time) Key {
	t.Helper()
	k, err := NewKey(created)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mustSeal(t *testing.T, r *Keyring, what string) string {
	t.Helper()
	box, err := r.Seal("session", []byte(what))
	if err != nil {
		t.Fatal(err)
	}
	return box
}

func opens(r *Keyring, box string) bool {
	_, err := r.Open("session", box)
	return err == nil
}

// TestRotateRetiresFromLastSeal: a key is retired from when a newer key
// took over sealing, not from its creation. A key made 25 hours ago and
// rotated with the defaults is kept a day past the new key's activation,
// and the key that seals now is never dropped, whatever its age.
func TestRotateRetiresFromLastSeal(t *testing.T) {
	c := &testClock{t0}
	path := filepath.Join(t.TempDir(), "keys.json")
	ancient := mustKey(t, t0.Add(-100*time.Hour))
	old := mustKey(t, t0.Add(-25*time.Hour))
	old.Active = t0.Add(-99 * time.Hour) // staged long ago
	r := ringAt(t, path, c.Now, old, ancient)
	box := mustSeal(t, r, "sealed just before the rotation")

	rot, err := r.Rotate(DefaultRetain, DefaultActivateAfter)
	if err != nil {
		t.Fatal(err)
	}
	activation := t0.Add(DefaultActivateAfter)
	if !rot.New.SealsFrom.Equal(activation) {
		t.Errorf("new key seals from %v, want %v", rot.New.SealsFrom, activation)
	}
	if len(rot.Kept) != 1 || rot.Kept[0].ID != hexID(old) || !rot.Kept[0].SealsUntil.Equal(activation) || !rot.Kept[0].KeptUntil.Equal(activation.Add(DefaultRetain)) {
		t.Errorf("kept %+v, want the 25-hour-old key until a day after %v", rot.Kept, activation)
	}
	if len(rot.Dropped) != 1 || rot.Dropped[0].ID != hexID(ancient) {
		t.Errorf("dropped %+v, want the key retired 99 hours ago", rot.Dropped)
	}
	// Until activation the old key still seals: a replica that has not
	// reloaded the file opens what this one seals now.
	stale, err := New([]Key{old}, c.Now)
	if err != nil {
		t.Fatal(err)
	}
	if b := mustSeal(t, r, "staged"); !opens(stale, b) {
		t.Error("a key staged for later sealed before its activation")
	}
	steps := []struct {
		name  string
		at    time.Time
		opens bool
	}{
		{"right after the rotation", t0, true},
		{"after activation", activation.Add(time.Second), true},
		{"a minute before retention ends", activation.Add(DefaultRetain - time.Minute), true},
	}
	for _, s := range steps {
		c.now = s.at
		if got := opens(r, box); got != s.opens {
			t.Errorf("%s: opens = %v, want %v", s.name, got, s.opens)
		}
	}
	if b := mustSeal(t, r, "after activation"); opens(stale, b) {
		t.Error("the new key does not seal after its activation")
	}
	// The next rotation, a day past activation, drops it.
	c.now = activation.Add(DefaultRetain)
	rot, err = r.Rotate(DefaultRetain, DefaultActivateAfter)
	if err != nil {
		t.Fatal(err)
	}
	if opens(r, box) || len(rot.Dropped) != 1 || rot.Dropped[0].ID != hexID(old) {
		t.Errorf("a key retired for a day was kept: dropped %+v", rot.Dropped)
	}
}

func hexID(k Key) string { return fmt.Sprintf("%x", k.ID) }

// TestRotateZeroRetain: --retain 0 with no staged activation drops the
// old key at once (the emergency rotation of a leaked key); with a staged
// activation it keeps the key that seals until the new one takes over.
func TestRotateZeroRetain(t *testing.T) {
	cases := []struct {
		name     string
		activate time.Duration
		keepsOld bool
	}{
		{"at once", 0, false},
		{"staged", time.Minute, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &testClock{t0}
			r := ringAt(t, filepath.Join(t.TempDir(), "keys.json"), c.Now, mustKey(t, t0.Add(-time.Hour)))
			box := mustSeal(t, r, "x")
			if _, err := r.Rotate(0, tc.activate); err != nil {
				t.Fatal(err)
			}
			if got := opens(r, box); got != tc.keepsOld {
				t.Fatalf("old box opens = %v, want %v", got, tc.keepsOld)
			}
		})
	}
}

// TestSealNeverUsesStagedKey: a keyring whose only keys are staged for
// later seals nothing (a replica that has not reloaded could not open
// it) until the first of them is active.
func TestSealNeverUsesStagedKey(t *testing.T) {
	c := &testClock{t0}
	k := mustKey(t, t0)
	k.Active = t0.Add(time.Minute)
	r, err := New([]Key{k}, c.Now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Seal("session", []byte("x")); !errors.Is(err, ErrNoActiveKey) {
		t.Fatalf("Seal before activation: %v, want ErrNoActiveKey", err)
	}
	c.advance(time.Minute)
	if b := mustSeal(t, r, "x"); !opens(r, b) {
		t.Fatal("the key does not seal at its activation")
	}
}

// TestReloadHoldsDroppedKey: a replica whose keyring file loses a key that
// still seals (a file written by an older release, or by hand, holding
// only a key staged for later) keeps sealing with it until the file's key
// is active, keeps opening with it for its max life after that, and then
// forgets it. Without a max life it takes the file as it is.
func TestReloadHoldsDroppedKey(t *testing.T) {
	const maxLife = 15 * time.Minute
	for _, hold := range []bool{true, false} {
		name := "without a max life"
		if hold {
			name = "with a max life"
		}
		t.Run(name, func(t *testing.T) {
			c := &testClock{t0}
			path := filepath.Join(t.TempDir(), "keys.json")
			old := mustKey(t, t0.Add(-30*time.Hour))
			r := ringAt(t, path, c.Now, old)
			if hold {
				r.SetMaxLife(maxLife)
			}
			box := mustSeal(t, r, "in flight")
			staged := mustKey(t, t0)
			staged.Active = t0.Add(2 * time.Minute)
			other := ringAt(t, path, c.Now, staged) // the file now holds only the staged key
			if changed, err := r.Reload(); err != nil || !changed {
				t.Fatalf("Reload: %v %v", changed, err)
			}
			if !hold {
				if opens(r, box) {
					t.Fatal("a keyring without a max life kept a key its file dropped")
				}
				if _, err := r.Seal("session", []byte("x")); !errors.Is(err, ErrNoActiveKey) {
					t.Fatalf("Seal with only a staged key: %v", err)
				}
				return
			}
			if h := r.Held(); len(h) != 1 || h[0].ID != hexID(old) || !h[0].KeptUntil.Equal(staged.Active.Add(maxLife)) {
				t.Fatalf("held %+v, want the old key until %v", h, staged.Active.Add(maxLife))
			}
			// Before the staged key is active the held key seals: the
			// other replicas, which have the old key, open it.
			b := mustSeal(t, r, "before activation")
			if opens(other, b) || !opens(r, b) || !opens(r, box) {
				t.Fatal("before activation the held key must seal and open")
			}
			c.now = staged.Active
			if b := mustSeal(t, r, "after activation"); !opens(other, b) {
				t.Fatal("after activation the file's key must seal")
			}
			c.now = staged.Active.Add(maxLife - time.Second)
			if !opens(r, box) {
				t.Fatal("the held key stopped opening before its max life was over")
			}
			c.now = staged.Active.Add(maxLife)
			if opens(r, box) {
				t.Fatal("the held key still opens after its max life")
			}
			if changed, err := r.Reload(); err != nil || changed || len(r.Held()) != 0 {
				t.Fatalf("second Reload: %v %v, held %v", changed, err, r.Held())
			}
		})
	}
}
