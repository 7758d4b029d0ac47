package boltstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/store"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func openTemp(t *testing.T, c *fakeClock) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "state.db"), time.Second, c.Now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func rec(id, node string, created time.Time) *store.Record {
	return &store.Record{ID: id, NodeName: node, Pool: "worker", KubeletKeySHA256: []byte{1, 2, 3}, CreatedAt: created, Expires: created.Add(time.Hour)}
}

func TestRecords(t *testing.T) {
	ctx := context.Background()
	c := &fakeClock{t0}
	s := openTemp(t, c)
	if err := s.CreateRecord(ctx, rec("a", "node-1", t0), store.Once{Key: "session-1", Expires: t0.Add(5 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		op   func() error
		want error
	}{
		{"same session again stores nothing", func() error {
			return s.CreateRecord(ctx, rec("b", "node-1", t0), store.Once{Key: "session-1", Expires: t0.Add(time.Minute)})
		}, store.ErrUsed},
		{"same ID again", func() error {
			return s.CreateRecord(ctx, rec("a", "node-2", t0), store.Once{Key: "session-2", Expires: t0.Add(time.Minute)})
		}, store.ErrExists},
		{"a marker among several already set stores nothing", func() error {
			return s.CreateRecord(ctx, rec("d", "node-1", t0), store.Once{Key: "instance-9", Expires: t0.Add(time.Hour)}, store.Once{Key: "session-1", Expires: t0.Add(time.Minute)})
		}, store.ErrUsed},
		{"a second record for the node", func() error {
			return s.CreateRecord(ctx, rec("c", "node-1", t0.Add(time.Second)), store.Once{Key: "session-3", Expires: t0.Add(time.Minute)})
		}, nil},
		{"consume", func() error { return s.ConsumeRecord(ctx, "a", "csr-1", t0) }, nil},
		{"consume twice", func() error { return s.ConsumeRecord(ctx, "a", "csr-2", t0) }, store.ErrConsumed},
		{"consume unknown", func() error { return s.ConsumeRecord(ctx, "zz", "csr-2", t0) }, store.ErrNotFound},
		{"use once", func() error { return s.UseOnce(ctx, "token-1", t0.Add(time.Minute)) }, nil},
		{"use twice", func() error { return s.UseOnce(ctx, "token-1", t0.Add(time.Minute)) }, store.ErrUsed},
		{"release then use", func() error {
			if err := s.ReleaseOnce(ctx, "token-1"); err != nil {
				return err
			}
			return s.UseOnce(ctx, "token-1", t0.Add(time.Minute))
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.op(); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := s.GetRecord(ctx, "b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused record was stored: %v", err)
	}
	rs, err := s.RecordsForNode(ctx, "node-1")
	if err != nil || len(rs) != 2 || rs[0].ID != "c" || rs[1].ConsumedBy != "csr-1" {
		t.Fatalf("records for node-1: %+v %v", rs, err)
	}
	if rs, _ := s.RecordsForNode(ctx, "node-"); len(rs) != 0 {
		t.Fatalf("prefix of a node name matched: %+v", rs)
	}
}

func TestMarkersExpireAndGC(t *testing.T) {
	ctx := context.Background()
	c := &fakeClock{t0}
	s := openTemp(t, c)
	if err := s.UseOnce(ctx, "k", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateRecord(ctx, rec("r", "n", t0)); err != nil {
		t.Fatal(err)
	}
	c.now = t0.Add(2 * time.Minute)
	if err := s.UseOnce(ctx, "k", c.now.Add(time.Minute)); err != nil {
		t.Fatalf("an expired marker still blocks: %v", err)
	}
	n, err := s.GC(ctx, t0.Add(2*time.Hour))
	if err != nil || n != 2 {
		t.Fatalf("GC removed %d (%v), want the marker and the record", n, err)
	}
	if _, err := s.GetRecord(ctx, "r"); !errors.Is(err, store.ErrNotFound) {
		t.Fatal("expired record survived GC")
	}
	if rs, _ := s.RecordsForNode(ctx, "n"); len(rs) != 0 {
		t.Fatal("node index kept an expired record")
	}
}

// TestSurvivesKill9: a child process writes records as fast as it can and
// prints each ID once CreateRecord returned; the parent kills it with
// SIGKILL mid-stream. Every printed ID must be in the store afterwards.
func TestSurvivesKill9(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKill9Writer$")
	cmd.Env = append(os.Environ(), "BOLTSTORE_WRITER="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if line := sc.Text(); len(line) > 4 && line[:4] == "rec-" {
			acked = append(acked, line)
		}
		if len(acked) == 200 {
			cmd.Process.Signal(syscall.SIGKILL)
			break
		}
	}
	cmd.Wait()
	if len(acked) < 200 {
		t.Fatalf("writer acknowledged only %d records", len(acked))
	}
	s, err := Open(path, time.Second, time.Now)
	if err != nil {
		t.Fatalf("store does not reopen after kill -9: %v", err)
	}
	defer s.Close()
	for _, id := range acked {
		if _, err := s.GetRecord(context.Background(), id); err != nil {
			t.Fatalf("acknowledged record %s lost: %v", id, err)
		}
	}
}

// TestKill9Writer is the child of TestSurvivesKill9.
func TestKill9Writer(t *testing.T) {
	path := os.Getenv("BOLTSTORE_WRITER")
	if path == "" {
		return // only meaningful as TestSurvivesKill9's child
	}
	s, err := Open(path, time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		id := "rec-" + strconv.Itoa(i)
		now := time.Now()
		if err := s.CreateRecord(context.Background(), rec(id, "n"+strconv.Itoa(i%7), now), store.Once{Key: "once-" + id, Expires: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		fmt.Println(id)
	}
}

// TestHeldStoreNamesItsHolder: a store another process holds is refused
// with who holds it (its pid and command line, from /proc/locks), not a
// bare timeout.
func TestHeldStoreNamesItsHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path, time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = Open(path, 100*time.Millisecond, time.Now)
	if err == nil {
		t.Fatal("a held store opened twice")
	}
	if want := fmt.Sprintf("pid %d (", os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("held store: %v; want the holder named (%q)", err, want)
	}
}
