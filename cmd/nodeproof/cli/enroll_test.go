package cli

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// TestRelease: `nodeproof release NODE` (and its alias `enroll --reset
// NODE`) frees a node name from the identity that owns it and says whose
// it was; it refuses a name no one owns, and says the file is locked when
// the embedded store is held by a process that serves no admin socket
// (TestOperatorsAgainstRunningServer is the one that does); `enroll
// --reset KEY` still clears a marker.
func TestRelease(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	open := func() *boltstore.Store {
		st, err := boltstore.Open(filepath.Join(dir, "state.db"), time.Second, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	enrol := func(st store.Store, id, node, identity string) {
		t.Helper()
		r := &store.Record{ID: id, NodeName: node, Pool: "worker", Kind: attest.KindTPM, Identity: identity,
			KubeletKeySHA256: make([]byte, 32), CreatedAt: time.Now(), Expires: time.Now().Add(time.Hour)}
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := Run(ctx, append(args, "--state-dir", dir), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	const key = "aws-instance/123456789012/i-1234567890abcdef0"
	st := open()
	enrol(st, "rec-1", "master-0", "tpm-ek:aaaa")
	enrol(st, "rec-2", "worker-1", "tpm-ek:bbbb")
	if err := st.UseOnce(ctx, key, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// Another process holds the store and answers on no socket: the
	// command says so.
	if code, _, stderr := run("release", "master-0"); code == 0 || !strings.Contains(stderr, "locked") {
		t.Fatalf("release while the store is held: exit %d: %s", code, stderr)
	}
	st.Close()

	for _, tc := range []struct {
		name       string
		args       []string
		wantCode   int
		wantOutput string
	}{
		{"no node", []string{"release"}, 2, "want NODE, got 0 arguments"},
		{"an unbound name", []string{"release", "nobody"}, 1, "not bound to any machine"},
		{"release", []string{"release", "--reason", "RMA", "master-0"}, 0, "it was bound to tpm-ek:aaaa (tpm evidence, pool worker"},
		{"released already", []string{"release", "master-0"}, 1, "not bound to any machine"},
		{"enroll without --reset", []string{"enroll"}, 2, "--reset NODE is required"},
		{"enroll --reset NODE", []string{"enroll", "--reset", "worker-1"}, 0, "it was bound to tpm-ek:bbbb"},
		{"enroll --reset KEY", []string{"enroll", "--reset", key}, 0, "cleared " + key},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(tc.args...)
			if code != tc.wantCode || !strings.Contains(stdout+stderr, tc.wantOutput) {
				t.Fatalf("exit %d, output %q %q; want exit %d and %q", code, stdout, stderr, tc.wantCode, tc.wantOutput)
			}
		})
	}
	st = open()
	defer st.Close()
	for _, node := range []string{"master-0", "worker-1"} {
		if _, err := st.Binding(ctx, node); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s is still bound: %v", node, err)
		}
	}
	// Another identity may now take master-0; the released one enrol anew.
	enrol(st, "rec-3", "master-0", "tpm-ek:cccc")
	enrol(st, "rec-4", "master-1", "tpm-ek:aaaa")
	if err := st.UseOnce(ctx, key, time.Now().Add(time.Hour)); err != nil {
		t.Fatalf("the marker is still set after --reset: %v", err)
	}
}
