package boltstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/store"
)

// fill enrols n nodes into the store at path (closed afterwards), so
// that its records span many pages.
func fill(t *testing.T, path string, n int) {
	t.Helper()
	s, err := Open(path, time.Second, (&fakeClock{t0}).Now)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range n {
		if err := enrolOne(s, i); err != nil {
			t.Fatal(err)
		}
	}
}

func enrolOne(s *Store, i int) error {
	r := rec(fmt.Sprintf("rec-%05d", i), fmt.Sprintf("node-%05d", i), t0)
	r.Identity = fmt.Sprintf("tpm-ek:%05d", i)
	r.Summary = string(bytes.Repeat([]byte("x"), 200))
	return s.Enrol(context.Background(), r, store.EnrolOptions{})
}

// pageOf returns the root page of bucket in the (closed) store at path.
func pageOf(t *testing.T, path string, bucket []byte) int64 {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var root int64
	db.View(func(tx *bolt.Tx) error {
		root = int64(tx.Bucket(bucket).Root())
		return nil
	})
	if root == 0 {
		t.Fatalf("bucket %s is inline", bucket)
	}
	return root
}

func overwrite(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func randomPage(t *testing.T) []byte {
	t.Helper()
	b := make([]byte, 4096)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// newestMeta returns the index of the meta page holding the last commit.
func newestMeta(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	m := ReadMetaPages(f, fi.Size())
	if !m[0].Valid || !m[1].Valid {
		t.Fatalf("meta pages %+v", m)
	}
	if m[0].Txid > m[1].Txid {
		return 0
	}
	return 1
}

// openOutcome opens the store at path and says how it went, as the attack
// table shows it: a refusal naming the file, an open store, or a panic.
func openOutcome(t *testing.T, path string) (outcome string, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			outcome, err = fmt.Sprintf("panic: %v", r), nil
		}
	}()
	s, err := Open(path, time.Second, (&fakeClock{t0}).Now)
	if err == nil {
		s.Close()
		return "opened", nil
	}
	var d *DamagedError
	if errors.As(err, &d) && d.Path == path {
		return "refused at start, naming the file", err
	}
	return "error: " + err.Error(), err
}

// TestFaultStoreDamage: a store file that is damaged where state existed
// is refused at start with an error that names the file (and is
// ErrDamaged), never opened as if it were empty or older, and never a
// panic; a fresh install starts.
func TestFaultStoreDamage(t *testing.T) {
	const nodes = 300
	cases := []struct {
		name   string
		damage func(t *testing.T, path string)
		want   string
	}{
		{"state.db truncated to 0 bytes", func(t *testing.T, path string) { os.Truncate(path, 0) }, "refused at start, naming the file"},
		{"state.db truncated to half", func(t *testing.T, path string) {
			fi, _ := os.Stat(path)
			os.Truncate(path, fi.Size()/2)
		}, "refused at start, naming the file"},
		{"state.db cut to its two meta pages", func(t *testing.T, path string) { os.Truncate(path, 2*4096) }, "refused at start, naming the file"},
		{"state.db deleted, its commit marker left", func(t *testing.T, path string) { os.Remove(path) }, "refused at start, naming the file"},
		{"a data page (the records' root) overwritten with random bytes", func(t *testing.T, path string) {
			overwrite(t, path, pageOf(t, path, bucketRecords)*4096, randomPage(t))
		}, "refused at start, naming the file"},
		{"a data page (the bindings' root) zeroed", func(t *testing.T, path string) {
			overwrite(t, path, pageOf(t, path, bucketBinds)*4096, make([]byte, 4096))
		}, "refused at start, naming the file"},
		{"the meta page of the last commit zeroed (bbolt rolls back one commit)", func(t *testing.T, path string) {
			overwrite(t, path, int64(newestMeta(t, path))*4096, make([]byte, 4096))
		}, "refused at start, naming the file"},
		{"the older meta page zeroed (nothing lost)", func(t *testing.T, path string) {
			overwrite(t, path, int64(1-newestMeta(t, path))*4096, make([]byte, 4096))
		}, "opened"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			fill(t, path, nodes)
			tc.damage(t, path)
			got, err := openOutcome(t, path)
			t.Logf("%s: %v", tc.name, err)
			attacktable.Check(t, "store", tc.name, tc.want, got)
			if got == "opened" {
				// Nothing of the last commit is lost.
				s, err := Open(path, time.Second, (&fakeClock{t0}).Now)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if _, err := s.Binding(context.Background(), fmt.Sprintf("node-%05d", nodes-1)); err != nil {
					t.Fatalf("the last enrolment: %v", err)
				}
				// The invalid meta page was rewritten at the start.
				if rep, err := s.Check(); err != nil || !rep.Meta[0].Valid || !rep.Meta[1].Valid {
					t.Fatalf("after the start: %+v %v", rep.Meta, err)
				}
			}
		})
	}
}

// TestFreshInstall: a state directory with no store starts; one whose
// store was created and never written to (a crash right after the first
// start) starts again; a store from before commit markers starts and gets
// one.
func TestFreshInstall(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	for i := range 2 {
		s, err := Open(path, time.Second, (&fakeClock{t0}).Now)
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		s.Close()
	}
	if _, err := os.Stat(path + ".new"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary file stayed: %v", err)
	}
	os.Remove(path + MarkerSuffix) // a store from an earlier release
	fill(t, path, 3)
	m, ok, err := readMarker(path)
	if err != nil || !ok || m.Txid == 0 {
		t.Fatalf("marker %+v %v %v", m, ok, err)
	}
	rep, err := Check(path, time.Second)
	if err != nil || rep.Txid != m.Txid || rep.Buckets[string(bucketRecords)] != 3 {
		t.Fatalf("check %+v %v (marker %d)", rep, err, m.Txid)
	}
}

// TestFaultDamageUnderARunningStore: damage that appears while the store
// is open (a page zeroed, the file truncated under bbolt's memory map)
// makes reads and writes fail with ErrDamaged; no panic or fault escapes.
func TestFaultDamageUnderARunningStore(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, path string, s *Store)
	}{
		{"a page zeroed", func(t *testing.T, path string, s *Store) {
			var root int64
			s.db.DB.View(func(tx *bolt.Tx) error { root = int64(tx.Bucket(bucketRecords).Root()); return nil })
			overwrite(t, path, root*4096, make([]byte, 4096))
		}},
		{"the file truncated under the memory map", func(t *testing.T, path string, s *Store) { os.Truncate(path, 2*4096) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			fill(t, path, 300)
			s, err := Open(path, time.Second, (&fakeClock{t0}).Now)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			tc.damage(t, path, s)
			ctx := context.Background()
			ops := []struct {
				name string
				op   func() error
			}{
				{"GetRecord", func() error { _, err := s.GetRecord(ctx, "rec-00150"); return err }},
				{"RecordsForNode", func() error { _, err := s.RecordsForNode(ctx, "node-00150"); return err }},
				{"GC", func() error { _, err := s.GC(ctx, t0); return err }},
				{"Check", func() error { _, err := s.Check(); return err }},
			}
			for _, o := range ops {
				got := func() (got string) {
					defer func() {
						if r := recover(); r != nil {
							got = fmt.Sprintf("panic: %v", r)
						}
					}()
					if err := o.op(); errors.Is(err, ErrDamaged) {
						return "ErrDamaged"
					} else {
						return fmt.Sprintf("%v", err)
					}
				}()
				attacktable.Check(t, "store", tc.name+" while the server runs: "+o.name, "ErrDamaged", got)
			}
		})
	}
}

// TestFaultBackupDuringWritesThenRestore: a backup taken while
// enrolments are being written is a consistent store (it passes every
// check); after state.db is lost (truncated to 0: the server refuses to
// start), restoring the backup gives back every enrolment it holds, and
// the store takes writes again. A restore while the store is open is
// refused.
func TestFaultBackupDuringWritesThenRestore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s, err := Open(path, time.Second, (&fakeClock{t0}).Now)
	if err != nil {
		t.Fatal(err)
	}
	var written atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := enrolOne(s, i); err != nil {
				t.Error(err)
				return
			}
			written.Add(1)
		}
	}()
	for written.Load() < 50 {
		time.Sleep(time.Millisecond)
	}
	backup := filepath.Join(dir, "backup.db")
	f, err := os.Create(backup)
	if err != nil {
		t.Fatal(err)
	}
	n, txid, err := s.Backup(f)
	if err != nil || f.Close() != nil {
		t.Fatal(err)
	}
	for written.Load() < 100 { // writes go on after the backup
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	t.Logf("backup of %d bytes at transaction %d, while %d enrolments were written", n, txid, written.Load())
	if _, err := Restore(path, backup, RestoreOptions{Lock: 100 * time.Millisecond, Now: t0}); err == nil {
		t.Error("a restore over a running store was not refused")
	}
	s.Close()

	rep, err := Check(backup, time.Second)
	if err != nil {
		t.Fatalf("the backup does not pass its check: %v", err)
	}
	inBackup := rep.Buckets[string(bucketBinds)]
	if rep.Txid != txid || inBackup == 0 || inBackup >= int(written.Load()) {
		t.Fatalf("backup at transaction %d (want %d) holds %d of %d enrolments", rep.Txid, txid, inBackup, written.Load())
	}
	os.Truncate(path, 0)
	if got, _ := openOutcome(t, path); got != "refused at start, naming the file" {
		t.Fatalf("a store truncated to 0: %s", got)
	}
	// Truncated to nothing, it holds nothing to carry: restored without
	// --force, saying nothing was carried.
	res, err := Restore(path, backup, RestoreOptions{Lock: time.Second, Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if res.NotCarried == nil {
		t.Error("a restore over an empty store does not say nothing was carried")
	}
	if _, err := os.Stat(res.Replaced); err != nil {
		t.Errorf("the damaged file was not kept: %v", err)
	}
	s, err = Open(path, time.Second, (&fakeClock{t0}).Now)
	got := "restored"
	if err != nil {
		got = "does not open: " + err.Error()
	} else {
		defer s.Close()
		bs, err := s.Bindings(context.Background())
		if err != nil || len(bs) != inBackup {
			got = fmt.Sprintf("%d enrolments of %d (%v)", len(bs), inBackup, err)
		} else if err := enrolOne(s, 100000); err != nil {
			got = "not writable: " + err.Error()
		}
	}
	attacktable.Check(t, "store", "a backup taken during enrolments, restored after state.db was truncated to 0", "restored", got)
}

// FuzzReadMetaPages feeds ReadMetaPages arbitrary file heads. Properties:
// it never panics; a page it calls valid has bbolt's magic, version and
// a checksum that matches; a file too short for a second page has no
// valid second page.
func FuzzReadMetaPages(f *testing.F) {
	path := filepath.Join(f.TempDir(), "state.db")
	s, err := Open(path, time.Second, (&fakeClock{t0}).Now)
	if err != nil {
		f.Fatal(err)
	}
	s.Close()
	real, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(real[:8192])
	f.Add(real[:100])
	f.Add(append(make([]byte, 4096), real[4096:8192]...))
	f.Fuzz(func(t *testing.T, b []byte) {
		m := ReadMetaPages(bytes.NewReader(b), int64(len(b)))
		if m[0].Valid {
			if _, _, _, ok := parseMeta(b); !ok {
				t.Fatal("page 0 valid but does not parse")
			}
		}
		if m[1].Valid && len(b) < 512+pageHeaderSize+metaSize {
			t.Fatalf("a second page in %d bytes", len(b))
		}
		for _, p := range m {
			if p.Valid && (p.Needs < 0 || p.Txid < 0) {
				t.Fatalf("meta %+v", p)
			}
		}
	})
}

// BenchmarkCommitMarker: what the commit marker and the panic guard add to
// a write (one small put per commit, fsync'd by bbolt as in production):
// "bbolt" is bbolt's own Update, "guarded" the store's (guard, marker
// write); compare the two in the same run.
func BenchmarkCommitMarker(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "state.db"), time.Second, (&fakeClock{t0}).Now)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	put := func(i int) func(*bolt.Tx) error {
		return func(tx *bolt.Tx) error { return tx.Bucket(bucketOnce).Put([]byte(fmt.Sprint(i)), []byte("x")) }
	}
	b.Run("bbolt", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if err := s.db.DB.Update(put(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guarded", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if err := s.db.Update(put(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
