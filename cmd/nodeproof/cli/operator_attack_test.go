package cli

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store/adminsock"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

func runCLI(args ...string) (string, int) {
	var out, errb bytes.Buffer
	code := Run(context.Background(), args, &out, &errb)
	return out.String() + errb.String(), code
}

// impostor listens on dir's admin.sock, as a user who could write to the
// state directory would, and counts what it is sent.
func impostor(t *testing.T, dir string) *atomic.Int64 {
	t.Helper()
	ln, err := net.Listen("unix", adminsock.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.Write([]byte(`{}`)) // "done", as a fake server would say
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return &got
}

// TestOperatorAttacksStateDirAndSocket: the state directory is refused by
// serve when others can write to it, and the operator's commands send
// nothing to an admin socket in such a directory, or to one another user
// owns; they never fall back to the file behind it either.
func TestOperatorAttacksStateDirAndSocket(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test gives a socket to another user (chown): run it as root (CI does)")
	}
	newState := func(mode os.FileMode) string {
		dir := filepath.Join(t.TempDir(), "state")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		st, err := boltstore.Open(filepath.Join(dir, serve.StoreFile), time.Second, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		st.Close()
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		return dir
	}

	// serve on a world-writable state directory.
	open := newState(0o777)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := Run(ctx, []string{"serve", "--policy-none", "--state-dir", open,
		"--server-basedir", "../../../deploy/examples/bootstrap", "--bootstrap-kubeconfig", "../../../deploy/examples/bootstrap-kubeconfig",
		"--listen", "127.0.0.1", "--secure-port", "0", "--insecure-port", "0", "--hosts", "127.0.0.1"}, &out, &errb)
	got := "started"
	if code != 0 && strings.Contains(errb.String(), "state dir refused") && strings.Contains(errb.String(), "chmod go-w") {
		got = "refused, naming the fix"
		if _, err := os.Stat(filepath.Join(open, "certs")); err == nil {
			got = "refused, but wrote its CA first"
		}
	}
	attacktable.Check(t, "operator", "serve on a state directory others can write to (0777)", "refused, naming the fix", got)

	revoke := func(dir string) (string, int) {
		return runCLI("revoke", "worker-1", "--state-dir", dir, "--reason", "stolen")
	}
	row := func(attack string, dir string, sent *atomic.Int64) {
		t.Helper()
		out, code := revoke(dir)
		got := "revoke printed success"
		switch {
		case code == 0:
		case sent.Load() > 0:
			got = "refused, after sending the request"
		case strings.Contains(out, "refusing the admin socket"):
			got = "refused, nothing sent"
		default:
			got = "failed otherwise: " + out
		}
		attacktable.Check(t, "operator", attack, "refused, nothing sent", got)
	}
	// An impostor's socket in a directory others can write to.
	row("nodeproof revoke to an admin.sock swapped into a world-writable state directory", open, impostor(t, open))

	// A socket another user owns, in a private directory.
	private := newState(0o700)
	sent := impostor(t, private)
	if err := os.Chown(adminsock.Path(private), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	row("nodeproof revoke to an admin.sock another user owns", private, sent)
}

// TestOperatorAttacksBackupLinks: `store backup` writes through no link —
// not a planted OUT.tmp, not OUT itself.
func TestOperatorAttacksBackupLinks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := boltstore.Open(filepath.Join(dir, serve.StoreFile), time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	outDir := t.TempDir()
	victim := filepath.Join(outDir, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	untouched := func() bool {
		b, err := os.ReadFile(victim)
		return err == nil && string(b) == "precious"
	}
	out := filepath.Join(outDir, "backup.db")
	if err := os.Symlink(victim, out+".tmp"); err != nil {
		t.Fatal(err)
	}
	msg, code := runCLI("store", "backup", "--state-dir", dir, "--out", out)
	got := "wrote through the link"
	if untouched() {
		got = "link not followed"
		if code != 0 {
			got = "link not followed, but no backup: " + msg
		} else if _, err := boltstore.Check(out, time.Second); err != nil {
			got = "link not followed, but the backup does not check"
		}
	}
	attacktable.Check(t, "operator", "store backup OUT with OUT.tmp a planted link to another file", "link not followed", got)

	linked := filepath.Join(outDir, "linked.db")
	if err := os.Symlink(victim, linked); err != nil {
		t.Fatal(err)
	}
	msg, code = runCLI("store", "backup", "--state-dir", dir, "--out", linked)
	got = "wrote through the link"
	if untouched() {
		got = "refused, naming it"
		if code == 0 || !strings.Contains(msg, "not a regular file") {
			got = "not followed, but " + msg
		}
	}
	attacktable.Check(t, "operator", "store backup OUT with OUT a link to another file", "refused, naming it", got)
}
