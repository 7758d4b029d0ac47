package adminsock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/store/boltstore"
)

// TestKeeper: through the socket, a backup of the running store is a
// store that passes every check and holds its enrolment, and the check
// reports the store; a check that finds damage is a DamagedError naming
// the file.
func TestKeeper(t *testing.T) {
	_, c, sock := served(t)
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.Backup(ctx, f); err != nil || n == 0 || f.Close() != nil {
		t.Fatalf("backup: %d bytes, %v", n, err)
	}
	rep, err := boltstore.Check(out, time.Second)
	if err != nil || rep.Buckets["bindings"] != 1 {
		t.Fatalf("the backup: %+v %v", rep, err)
	}
	path := filepath.Join(filepath.Dir(sock), "state.db")
	if rep, err := c.Check(ctx, path); err != nil || rep.Buckets["bindings"] != 1 {
		t.Fatalf("check: %+v %v", rep, err)
	}
	os.Truncate(path, 2*4096) // under the running store
	var d *boltstore.DamagedError
	if _, err := c.Check(ctx, path); !errors.As(err, &d) || d.Path != path {
		t.Fatalf("check of a truncated store: %v", err)
	}
}
