package boltstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/store"
)

// TestRestoreAttacksCarryWhatWasDone: a backup from before an operator's
// revocation, release or adoption, or before a config token was spent or
// a CSR approved, is restored: the restore carries each of them into the
// restored store (a ban is lifted only by unban, a spent secret is never
// re-armed, a released name never goes back), says so, and names the
// machines that enrol again and the bans lifted since that are in force
// again.
func TestRestoreAttacksCarryWhatWasDone(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	clock := &fakeClock{t0}
	s, err := Open(path, time.Second, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := enrolOne(s, i); err != nil {
			t.Fatal(err)
		}
	}
	// Banned before the backup, unbanned after: the backup's ban returns.
	if _, err := s.Ban(ctx, store.Ban{Identity: "tpm-ek:00004", Reason: "lost", At: t0}); err != nil {
		t.Fatal(err)
	}
	backup := backupTo(t, s, filepath.Join(dir, "backup.db"))
	// After the backup: a revocation, a release, an adoption, a spent
	// config token, an approved CSR, an unban and a new enrolment.
	if _, err := s.Revoke(ctx, "node-00000", "stolen", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "node-00001", store.Act{At: t0.Add(2 * time.Minute), By: "ops", Reason: "moved"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Adopt(ctx, "legacy-1", store.Act{At: t0.Add(3 * time.Minute), By: "ops"}); err != nil {
		t.Fatal(err)
	}
	if err := s.UseOnce(ctx, "config-token/abc", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.ConsumeRecord(ctx, "rec-00002", "csr-1", t0.Add(4*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Unban(ctx, "tpm-ek:00004"); err != nil {
		t.Fatal(err)
	}
	if err := enrolOne(s, 7); err != nil {
		t.Fatal(err)
	}
	s.Close()

	res, err := Restore(path, backup, RestoreOptions{Lock: time.Second, Now: t0.Add(5 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, time.Second, (&fakeClock{t0.Add(5 * time.Minute)}).Now)
	if err != nil {
		t.Fatalf("the restored store does not open: %v", err)
	}
	defer s.Close()
	row := func(attack, want, got string) { attacktable.Check(t, "store", attack, want, got) }

	got := "ban lifted"
	if b, err := s.BanOf(ctx, "tpm-ek:00000"); err == nil && b.Reason == "stolen" {
		if bd, err := s.Binding(ctx, "node-00000"); err == nil && bd.Revoked != nil {
			got = "ban kept, binding revoked"
		}
	}
	row("store restore of a backup from before a revocation", "ban kept, binding revoked", got)

	got = "token re-armed"
	if used, err := s.IsUsed(ctx, "config-token/abc"); err == nil && used {
		got = "still spent"
	}
	row("store restore of a backup from before a config token was spent", "still spent", got)

	got = "approvable again"
	if err := s.ConsumeRecord(ctx, "rec-00002", "csr-2", t0.Add(6*time.Minute)); errors.Is(err, store.ErrConsumed) {
		got = "still consumed"
	}
	row("store restore of a backup from before a CSR was approved with a record", "still consumed", got)

	got = "name back to the released identity"
	if _, err := s.Binding(ctx, "node-00001"); errors.Is(err, store.ErrNotFound) {
		if h, err := s.History(ctx, "node-00001"); err == nil && len(h.Released) == 1 && h.Released[0].Act.By == "ops" {
			got = "stays released, history kept"
		}
	}
	row("store restore of a backup from before a name was released", "stays released, history kept", got)

	got = "adoption undone"
	if h, err := s.History(ctx, "legacy-1"); err == nil && h.Adopted != nil {
		got = "adoption kept"
	}
	row("store restore of a backup from before a name was adopted", "adoption kept", got)

	got = "unban kept (ban lifted silently)"
	if _, err := s.BanOf(ctx, "tpm-ek:00004"); err == nil && len(res.Carried.Rebanned) == 1 {
		got = "banned again, named"
	}
	row("store restore of a backup from before an unban", "banned again, named", got)

	c := res.Carried
	if len(c.Bans) != 1 || len(c.Releases) != 1 || !c.Releases[0].Unbound || len(c.Adoptions) != 1 || len(c.Consumed) != 1 || c.Markers != 1 {
		t.Errorf("carried %+v; want one ban, one release (unbound), one adoption, one consumed record, one marker", c)
	}
	if len(c.Lost) != 1 || c.Lost[0] != "node-00007" {
		t.Errorf("lost %v; want [node-00007]", c.Lost)
	}
}

// TestRestoreAttacksUnreadableStore: a store that is there but cannot be read
// (garbage where the pages were) may hold bans made after the backup that
// nobody can name: the restore refuses (ErrCannotCarry) unless forced,
// and a forced one says nothing was carried.
func TestRestoreAttacksUnreadableStore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s, err := Open(path, time.Second, (&fakeClock{t0}).Now)
	if err != nil {
		t.Fatal(err)
	}
	backup := backupTo(t, s, filepath.Join(dir, "backup.db"))
	s.Close()
	if err := os.WriteFile(path, bytes.Repeat([]byte{0xA5}, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	got := "restored, undoing what it could not read"
	if _, err := Restore(path, backup, RestoreOptions{Lock: time.Second, Now: t0}); errors.Is(err, ErrCannotCarry) {
		got = "refused without --force"
	}
	attacktable.Check(t, "store", "store restore over a store that cannot be read (its later bans cannot be named)", "refused without --force", got)
	res, err := Restore(path, backup, RestoreOptions{Lock: time.Second, Now: t0, Force: true})
	if err != nil || res.NotCarried == nil {
		t.Fatalf("forced restore: %+v, %v; want it restored, saying nothing was carried", res, err)
	}
}

// backupTo writes s's backup to path and returns path.
func backupTo(t *testing.T, s *Store, path string) string {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Backup(f); err != nil || f.Close() != nil {
		t.Fatal(err)
	}
	return path
}
