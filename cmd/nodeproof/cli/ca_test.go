package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/internal/attacktable"
)

// TestOperatorAttacksCAViews: `ca show` is a view in directory mode — it
// makes nothing in an empty state directory (it says how to), and on a
// made one it writes nothing, whatever flags an operator tries; the
// serving certificate's names change only by `ca rotate --serving-only
// --hosts`, never by `ca create` with other names (refused, naming the
// command that does), and `ca rotate` without --hosts keeps them.
func TestOperatorAttacksCAViews(t *testing.T) {
	run := func(args ...string) (string, int) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), args, &out, &errb)
		return out.String() + errb.String(), code
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if out, code := run("ca", "show", "--state-dir", state); code == 0 || !strings.Contains(out, "ca create") {
		t.Errorf("ca show on an empty state directory: exit %d\n%s; want a refusal that says how to make them", code, out)
	}
	if _, err := os.Stat(filepath.Join(state, "certs")); err == nil {
		t.Error("ca show made the certs directory")
	}
	if out, code := run("ca", "create", "--state-dir", state, "--hosts", "api-int.example.com,10.0.0.5"); code != 0 {
		t.Fatalf("ca create: exit %d\n%s", code, out)
	}
	snapshot := func() string {
		var b strings.Builder
		filepath.WalkDir(filepath.Join(state, "certs"), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, _ := d.Info()
			target, _ := os.Readlink(p)
			b.WriteString(p + " " + info.ModTime().String() + " " + target + "\n")
			return nil
		})
		return b.String()
	}
	before := snapshot()
	row := func(attack, want string, args ...string) {
		t.Helper()
		run(args...)
		got := "changed nothing"
		if after := snapshot(); after != before {
			got = "rewrote the state directory"
		}
		attacktable.Check(t, "operator", attack, want, got)
	}
	if out, code := run("ca", "show", "--state-dir", state); code != 0 || !strings.Contains(out, "api-int.example.com") {
		t.Errorf("ca show: exit %d\n%s; want the serving certificate's names", code, out)
	}
	row("ca show in directory mode", "changed nothing", "ca", "show", "--state-dir", state)
	row("ca (no action: show) with --print-bundle", "changed nothing", "ca", "--state-dir", state, "--print-bundle")
	row("ca show --hosts localhost (an operator's habit from the old ca)", "changed nothing", "ca", "show", "--state-dir", state, "--hosts", "localhost")
	row("ca create with other names than the serving certificate's", "changed nothing", "ca", "create", "--state-dir", state, "--hosts", "localhost")
	if out, _ := run("ca", "create", "--state-dir", state, "--hosts", "localhost"); !strings.Contains(out, "ca rotate --serving-only --hosts") {
		t.Errorf("ca create with other names does not say how to change them: %s", out)
	}
	if out, code := run("ca", "rotate", "--serving-only", "--state-dir", state); code != 0 || !strings.Contains(out, "api-int.example.com") || !strings.Contains(out, "10.0.0.5") {
		t.Errorf("ca rotate --serving-only without --hosts: exit %d\n%s; want the certificate's own names kept", code, out)
	}
	if out, code := run("ca", "rotate", "--serving-only", "--state-dir", state, "--hosts", "api-int.example.com"); code != 0 || !strings.Contains(out, "tls.crt for [api-int.example.com]\n") {
		t.Errorf("ca rotate --serving-only --hosts api-int.example.com: exit %d\n%s; want that name alone", code, out)
	}
}
