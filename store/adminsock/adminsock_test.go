package adminsock_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/adminsock"
	"github.com/nodeproof/nodeproof/store/boltstore"
	"github.com/nodeproof/nodeproof/store/storetest"
)

// served is a bolt store with one enrolment, served on its admin socket,
// and a client of it.
func served(t *testing.T) (*boltstore.Store, *adminsock.Client, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, "state.db"), time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := storetest.Record(storetest.ID(1), "worker-1", time.Now().Truncate(time.Second))
	if err := st.Enrol(context.Background(), r, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	path := adminsock.Path(dir)
	// A socket a dead server left is replaced.
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	srv, err := adminsock.Listen(path, st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { srv.Close() })
	c, err := adminsock.Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return st, c, path
}

// TestAdminSocket: the operators' operations reach the server's store
// (the store itself shows them), the store's errors keep their kind, the
// server's own operations are refused, and the socket is 0600.
func TestAdminSocket(t *testing.T) {
	st, c, path := served(t)
	ctx := context.Background()
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode %v, %v; want a 0600 socket", fi.Mode(), err)
	}
	identity := "ek:" + storetest.ID(1)

	ban, err := c.Ban(ctx, store.Ban{NodeName: "worker-1", By: "alice", Reason: "stolen", At: time.Now()})
	if err != nil || ban.Identity != identity || ban.By != "alice" {
		t.Fatalf("Ban over the socket = %+v, %v", ban, err)
	}
	if b, err := st.Binding(ctx, "worker-1"); err != nil || b.Revoked == nil || b.Revoked.By != "alice" {
		t.Fatalf("the server's store after the ban: %+v, %v", b, err)
	}
	if _, err := c.Release(ctx, "worker-1", store.Act{By: "bob", Reason: "RMA"}); err != nil {
		t.Fatal(err)
	}
	if h, err := st.History(ctx, "worker-1"); err != nil || len(h.Released) != 1 || h.Released[0].Act.By != "bob" {
		t.Fatalf("the server's history after the release: %+v, %v", h, err)
	}
	if _, err := c.Binding(ctx, "worker-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Binding of a released name over the socket: %v, want ErrNotFound", err)
	}
	bans, err := c.Bans(ctx)
	if err != nil || len(bans) != 1 {
		t.Fatalf("Bans = %v, %v", bans, err)
	}
	if _, err := c.Adopt(ctx, "legacy-1", store.Act{By: "carol"}); err != nil {
		t.Fatal(err)
	}
	if hs, err := c.Histories(ctx); err != nil || len(hs) != 2 {
		t.Fatalf("Histories = %v, %v", hs, err)
	}
	if recs, err := c.RecordsForNode(ctx, "worker-1"); err != nil || len(recs) != 1 {
		t.Fatalf("RecordsForNode = %v, %v", recs, err)
	}
	if _, err := c.Unban(ctx, identity); err != nil {
		t.Fatal(err)
	}
	if _, err := st.BanOf(ctx, identity); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the server's store after Unban: %v", err)
	}
	if _, err := c.Unban(ctx, identity); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Unban again: %v, want ErrNotFound", err)
	}

	// The server's own operations are not an operator's: the Client has
	// none of them, and the socket refuses them to any other client.
	if _, ok := any(c).(store.Store); ok {
		t.Error("the Client is a whole store.Store: it serves the server's own operations")
	}
	for _, op := range []string{"Enrol", "CreateRecord", "ConsumeRecord", "UseOnce", "UpdateStatus", "GC"} {
		if _, err := adminsockRaw(t, path, op); !errors.Is(err, adminsock.ErrNotServed) {
			t.Errorf("%s over the admin socket: %v, want ErrNotServed", op, err)
		}
	}
}

// adminsockRaw posts to /v1/op as another client would (not through the
// Client's methods).
func adminsockRaw(t *testing.T, path, op string) (string, error) {
	t.Helper()
	c, err := adminsock.Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return "", adminsock.Call(context.Background(), c, op)
}

// TestDialNoServer: no server, no client (the commands then open the file).
func TestDialNoServer(t *testing.T) {
	if _, err := adminsock.Dial(context.Background(), filepath.Join(t.TempDir(), adminsock.SocketName)); err == nil {
		t.Fatal("Dial of a socket nobody serves succeeded")
	}
}

// TestLongStateDir: a state directory whose socket path is longer than a
// unix socket address holds (108 bytes) still gets its admin socket, and
// operators reach it.
func TestLongStateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := boltstore.Open(filepath.Join(dir, "state.db"), time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := storetest.Record(storetest.ID(2), "worker-2", time.Now().Truncate(time.Second))
	if err := st.Enrol(context.Background(), r, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	path := adminsock.Path(dir)
	if len(path) <= 108 {
		t.Fatalf("the test's path is only %d bytes", len(path))
	}
	srv, err := adminsock.Listen(path, st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("Listen at a %d-byte path: %v", len(path), err)
	}
	go srv.Serve()
	if fi, err := os.Stat(path); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the socket at its own path: %v, %v", fi, err)
	}
	c, err := adminsock.Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if b, err := c.Binding(context.Background(), "worker-2"); err != nil || b.NodeName != "worker-2" {
		t.Fatalf("Binding over the socket: %+v, %v", b, err)
	}
	srv.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("Close left the socket: %v", err)
	}
}
