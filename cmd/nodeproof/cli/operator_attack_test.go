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

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store"
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
		dir := stateWithStore(t, nil)
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
	dir := stateWithStore(t, nil)
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

// TestOperatorAttacksRevokeIdentity: `revoke --identity` bans only an
// identity in the one spelling the server writes; a near miss (upper-case
// hash, a GCP project ID, a typo) is refused, never "revoked" while the
// machine stays unbanned; an identity the server has never seen needs
// --not-enrolled; the output says whether it is enrolled.
func TestOperatorAttacksRevokeIdentity(t *testing.T) {
	ek := strings.Repeat("3f", 32)
	enrolled := "tpm-ek:" + ek
	dir := stateWithStore(t, func(st *boltstore.Store) error {
		now := time.Now()
		r := &store.Record{ID: "rec-1", NodeName: "worker-1", Pool: "worker", Kind: attest.KindTPM, Identity: enrolled,
			KubeletKeySHA256: []byte{1}, CreatedAt: now, Expires: now.Add(time.Hour)}
		return st.Enrol(context.Background(), r, store.EnrolOptions{})
	})
	banned := func(id string) bool {
		st, err := boltstore.Open(filepath.Join(dir, serve.StoreFile), time.Second, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		_, err = st.BanOf(context.Background(), id)
		return err == nil
	}
	cases := []struct {
		attack, id string
		extra      []string
	}{
		{"revoke --identity with the EK hash in upper case", "tpm-ek:" + strings.ToUpper(ek), nil},
		{"revoke --identity with a GCP project ID for its number", "gcp:my-project/us-central1-a/4567890123456789", nil},
		{"revoke --identity with a typo in the kind", "tmp-ek:" + ek, nil},
		{"revoke --identity of an identity never seen, without --not-enrolled", "tpm-ek:" + strings.Repeat("aa", 32), nil},
	}
	for _, c := range cases {
		out, code := runCLI(append([]string{"revoke", "--identity", c.id, "--state-dir", dir, "--reason", "stolen"}, c.extra...)...)
		got := "refused, saying why"
		switch {
		case code == 0 || strings.Contains(out, "revoked at"):
			got = "printed revoked"
		case banned(c.id) || banned(strings.ToLower(c.id)):
			got = "refused, but banned"
		case !strings.Contains(out, "--identity") && !strings.Contains(out, "never seen"):
			got = "refused without saying why: " + out
		}
		attacktable.Check(t, "operator", c.attack, "refused, saying why", got)
	}
	if out, code := runCLI("revoke", "--identity", "tpm-ek:"+strings.ToUpper(ek), "--state-dir", dir); code == 0 || !strings.Contains(out, enrolled) {
		t.Errorf("upper-case hash: exit %d, %s; want the canonical spelling named", code, out)
	}
	unseen := "tpm-ek:" + strings.Repeat("aa", 32)
	if out, code := runCLI("revoke", "--identity", unseen, "--not-enrolled", "--state-dir", dir); code != 0 || !strings.Contains(out, "not enrolled") || !banned(unseen) {
		t.Errorf("revoke --not-enrolled: exit %d, %s; want it banned and said not enrolled", code, out)
	}
	if out, code := runCLI("revoke", "--identity", enrolled, "--state-dir", dir); code != 0 || !strings.Contains(out, "enrolled as node worker-1") || !banned(enrolled) {
		t.Errorf("revoke --identity of the enrolled machine: exit %d, %s; want it banned and said enrolled as node worker-1", code, out)
	}
	if out, code := runCLI("unban", "--identity", "TPM-EK:"+ek, "--state-dir", dir); code == 0 || !banned(enrolled) {
		t.Errorf("unban with a non-canonical identity: exit %d, %s; want refused, the ban kept", code, out)
	}
}

// stateWithStore is a new state directory (0700) holding a store, which
// fill (if not nil) writes to first.
func stateWithStore(t *testing.T, fill func(*boltstore.Store) error) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := boltstore.Open(filepath.Join(dir, serve.StoreFile), time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if fill != nil {
		if err := fill(st); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
