package systemtest_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// runCLI runs `nodeproof args...` and returns its exit code and output.
func runCLI(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := cli.Run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestFaultStoreBackupCLI: `nodeproof store backup` while the server runs
// (through its socket: the server holds the store's lock) writes a
// consistent copy holding what was enrolled; `store check` answers
// through the server; `store restore` refuses while it runs.
func TestFaultStoreBackupCLI(t *testing.T) {
	e := newAttackEnv(t)
	if got := e.honestMachine(t, "tpm", "127.0.0.2"); got != "attested and fetched" {
		t.Fatal(got)
	}
	out := filepath.Join(t.TempDir(), "backup.db")
	code, stdout, stderr := runCLI("store", "backup", "--state-dir", e.stateDir, "--out", out)
	if code != 0 {
		t.Fatalf("store backup: exit %d\n%s%s", code, stdout, stderr)
	}
	t.Log(strings.TrimSpace(stdout))
	if got := e.honestMachine(t, "gcp", "127.0.0.3"); got != "attested and fetched" { // after the backup
		t.Fatal(got)
	}
	rep, err := boltstore.Check(out, time.Second)
	got := fmt.Sprintf("consistent, %d enrolment(s)", rep.Buckets["bindings"])
	if err != nil {
		got = err.Error()
	}
	attacktable.Check(t, "store", "`nodeproof store backup` while the server runs and machines enrol", "consistent, 1 enrolment(s)", got)
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("backup file mode: %v %v", fi, err)
	}
	if code, stdout, stderr := runCLI("store", "check", "--state-dir", e.stateDir); code != 0 || !strings.Contains(stdout, "bindings=2") {
		t.Errorf("store check through the server: exit %d\n%s%s", code, stdout, stderr)
	}
	if code, _, _ := runCLI("store", "restore", "--state-dir", e.stateDir, "--from", out); code == 0 {
		t.Error("store restore under a running server was not refused")
	}
}

// TestFaultStoreRestoreCLI: a server whose state.db was truncated to 0
// refuses to start, naming the file and how to restore it; `store check`
// says it is damaged; `store restore` from a backup brings it back.
func TestFaultStoreRestoreCLI(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	st, err := boltstore.Open(path, time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := st.Enrol(context.Background(), &store.Record{ID: "r1", NodeName: "worker-1", Pool: "worker", Identity: "tpm-ek:1",
		KubeletKeySHA256: []byte{1}, CreatedAt: now, Expires: now.Add(time.Hour)}, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	backup := filepath.Join(t.TempDir(), "backup.db")
	if code, stdout, stderr := runCLI("store", "backup", "--state-dir", dir, "--out", backup); code != 0 {
		t.Fatalf("offline backup: exit %d\n%s%s", code, stdout, stderr)
	}
	os.Truncate(path, 0)

	c := serve.Config{StateDir: dir, Clock: time.Now}
	_, err = c.OpenStore(false)
	got := "started"
	if err != nil {
		got = "refused"
		if strings.Contains(err.Error(), path) && strings.Contains(err.Error(), "nodeproof store restore --state-dir "+dir) {
			got = "refused, naming the file and the restore command"
		}
	}
	attacktable.Check(t, "store", "the server starts on a state.db truncated to 0 bytes", "refused, naming the file and the restore command", got)
	if code, _, stderr := runCLI("store", "check", "--state-dir", dir); code != 1 || !strings.Contains(stderr, path) {
		t.Errorf("store check of a damaged store: exit %d: %s", code, stderr)
	}
	code, stdout, stderr := runCLI("store", "restore", "--state-dir", dir, "--from", backup)
	if code != 0 {
		t.Fatalf("store restore: exit %d\n%s%s", code, stdout, stderr)
	}
	t.Log(strings.TrimSpace(stdout))
	st, err = boltstore.Open(path, time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Binding(context.Background(), "worker-1"); err != nil {
		t.Fatalf("after the restore: %v", err)
	}
}
