package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// TestEnrollReset: a reinstalled instance's trust-on-first-use marker is
// cleared with `nodeproof enroll --reset`, so it may enrol once more; the
// command refuses to run without a key, and says to stop the server when
// the embedded store is held.
func TestEnrollReset(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const key = "aws-instance/123456789012/i-1234567890abcdef0"
	open := func() *boltstore.Store {
		st, err := boltstore.Open(filepath.Join(dir, "state.db"), time.Second, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := open()
	if err := st.CreateRecord(ctx, &store.Record{ID: "rec-1", NodeName: "n", Expires: time.Now().Add(time.Hour)},
		store.Once{Key: key, Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	// The server holds the store: the command says so.
	var stderr bytes.Buffer
	if code := Run(ctx, []string{"enroll", "--state-dir", dir, "--reset", key}, io.Discard, &stderr); code == 0 || !strings.Contains(stderr.String(), "stop the server") {
		t.Fatalf("enroll while the store is held: exit %d: %s", code, stderr.String())
	}
	st.Close()
	stderr.Reset()
	if code := Run(ctx, []string{"enroll", "--state-dir", dir}, io.Discard, &stderr); code == 0 {
		t.Fatal("enroll without --reset succeeded")
	}
	if code := Run(ctx, []string{"enroll", "--state-dir", dir, "--reset", key}, io.Discard, &stderr); code != 0 {
		t.Fatalf("enroll --reset: %s", stderr.String())
	}
	st = open()
	defer st.Close()
	if err := st.UseOnce(ctx, key, time.Now().Add(time.Hour)); errors.Is(err, store.ErrUsed) {
		t.Fatal("the marker is still set after --reset")
	} else if err != nil {
		t.Fatal(err)
	}
}
