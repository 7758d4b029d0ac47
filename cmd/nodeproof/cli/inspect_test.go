package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// TestInspectCommand: flags in, the inspect library out, on an embedded
// store (the cluster's story is in internal/e2e's lifetime test).
func TestInspectCommand(t *testing.T) {
	dir, empty := t.TempDir(), t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, serve.StoreFile), time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string // a line it starts with
		stderr string // what the refusal says
	}{
		{"list, empty store", []string{"inspect", "--state-dir", dir}, 0, "NODE  POOL  KIND", ""},
		{"list as json", []string{"inspect", "-o", "json", "--state-dir", dir}, 0, `{`, ""},
		{"unknown node", []string{"inspect", "worker-9", "--state-dir", dir}, 1, "", "no binding and no record for this node name"},
		{"unknown format", []string{"inspect", "-o", "xml", "--state-dir", dir}, 1, "", `output "xml": want table, json or yaml`},
		{"two nodes", []string{"inspect", "a", "b", "--state-dir", dir}, 2, "", "at most one NODE"},
		{"pool from a bootstrap directory", []string{"inspect", "pool", "worker", "--server-basedir", "../../../deploy/examples/bootstrap"}, 0, "MACHINECONFIG", ""},
		{"unknown pool", []string{"inspect", "pool", "nope", "--server-basedir", "../../../deploy/examples/bootstrap"}, 1, "", `no MachineConfigPool "nope"`},
		{"pool and a node", []string{"inspect", "pool", "worker", "extra", "--server-basedir", dir}, 2, "", "at most one NODE, pool NAME or secureboot-ca"},
		{"a state directory without a store (a mistyped --state-dir)", []string{"inspect", "--state-dir", empty}, 1, "", "no store in --state-dir " + empty},
		{"bad policy", []string{"inspect", "--policy", dir + "/none.yaml", "--state-dir", dir}, 1, "", "none.yaml"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Run(context.Background(), c.args, &out, &errb)
			if _, err := os.Stat(filepath.Join(empty, serve.StoreFile)); err == nil {
				t.Fatal("a read-only command made a store")
			}
			if code != c.code || !strings.HasPrefix(out.String(), c.stdout) || !strings.Contains(errb.String(), c.stderr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q…, …%q…", code, out.String(), errb.String(), c.code, c.stdout, c.stderr)
			}
		})
	}
}
