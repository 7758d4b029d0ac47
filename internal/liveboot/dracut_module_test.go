package liveboot

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/nodeproof/nodeproof/internal/testenv"
)

// moduleRef is a file a dracut module-setup.sh installs from its own
// directory ("$moddir/NAME").
var moduleRef = regexp.MustCompile(`"\$moddir/([^"/$]+)"`)

// TestDracutModulesComplete checks, without dracut, that every file the
// dracut modules the live boot adds install from their directory is
// there, and that copyModule makes the scripts and Ignition's generator
// executable (the Go module zip keeps no modes; systemd skips a generator
// it cannot execute).
func TestDracutModulesComplete(t *testing.T) {
	ign, err := IgnitionDracutModule(context.Background(), testenv.IgnitionVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		fsys  fs.FS
		dir   string
		exec  []string
		extra map[string]bool // installed from elsewhere (the build adds them)
	}{
		{name: "30ignition", fsys: os.DirFS(ign), dir: ".", exec: []string{"ignition-generator", "ignition-kargs-helper.sh"}, extra: map[string]bool{"ignition": true}},
		{name: "50nodeproof", fsys: os.DirFS("../../deploy/node/dracut/50nodeproof"), dir: ".", exec: []string{"module-setup.sh", "nodeproof-persist-kubelet-key.sh"}, extra: map[string]bool{"nodeproof-agent": true}},
		{name: "99nodeproof-liveboot", fsys: liveBootModule, dir: "dracut/99nodeproof-liveboot", exec: []string{"module-setup.sh", "nodeproof-liveboot-report.sh", "nodeproof-liveboot-sysroot.sh", "nodeproof-liveboot-failed.sh"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			setup, err := fs.ReadFile(c.fsys, filepath.ToSlash(filepath.Join(c.dir, "module-setup.sh")))
			if err != nil {
				t.Fatal(err)
			}
			refs := moduleRef.FindAllStringSubmatch(string(setup), -1)
			if len(refs) == 0 {
				t.Fatal("module-setup.sh installs nothing from $moddir")
			}
			for _, m := range refs {
				if _, err := fs.Stat(c.fsys, filepath.ToSlash(filepath.Join(c.dir, m[1]))); err != nil && !c.extra[m[1]] {
					t.Errorf("module-setup.sh installs $moddir/%s: %v", m[1], err)
				}
			}
			dst := filepath.Join(t.TempDir(), c.name)
			if err := copyModule(c.fsys, c.dir, dst, map[string]bool{"ignition-generator": true}); err != nil {
				t.Fatal(err)
			}
			for _, f := range c.exec {
				fi, err := os.Stat(filepath.Join(dst, f))
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode().Perm()&0o111 != 0o111 {
					t.Errorf("%s copied with mode %v; want executable", f, fi.Mode().Perm())
				}
			}
		})
	}
}
