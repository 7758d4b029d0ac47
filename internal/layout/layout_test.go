// Package layout_test holds docs/architecture.md's floors against the
// code: a package may import packages on its own floor or below, never
// above. Tests are left out (a test may reach anywhere to set a scene).
// It also holds what a newcomer reads first: every package has a doc
// comment, every markdown link stays inside the repository and resolves,
// and docs/README.md indexes every page of docs/.
package layout_test

import (
	"encoding/json"
	"io"
	"os/exec"
	"path"
	"strings"
	"testing"
)

const module = "github.com/nodeproof/nodeproof"

// floors, by top-level directory, or by a deeper one that stands on a
// floor of its own (docs/architecture.md): the longest that holds a
// package names its floor.
var floors = map[string]int{
	"attest": 1, "pemcert": 1, "fsutil": 1, "firmware-testdata": 1, "safetext": 1, "strictjson": 1, "leader": 1, "metrics": 1, "reload": 1, "kubeletboot": 1,
	"identity": 2, "store": 2, "internal": 2,
	"mcs": 3, "approver": 3,
	// The whole system in one process, for tests and demos: it builds on
	// the servers; the commands and benches build on it.
	"agent": 4, "systemtest": 4,
	"cmd": 5, "bench": 5, "deploy": 5, "hack": 5,
}

func floorOf(t *testing.T, pkg string) (string, int) {
	t.Helper()
	rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
	for dir := rel; dir != "." && dir != ""; dir = path.Dir(dir) {
		if f, ok := floors[dir]; ok {
			return dir, f
		}
	}
	top, _, _ := strings.Cut(rel, "/")
	t.Errorf("%s: top-level directory %q has no floor in docs/architecture.md (add it there and here)", pkg, top)
	return top, 0
}

// pkg is what the tests read of a package (go list -json).
type pkg struct {
	ImportPath, Dir, Name              string
	Imports                            []string
	GoFiles, TestGoFiles, XTestGoFiles []string
}

// packages lists the module's packages.
func packages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Dir,Name,Imports,GoFiles,TestGoFiles,XTestGoFiles", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 40 {
		t.Fatalf("go list named %d packages; the module has more", len(pkgs))
	}
	return pkgs
}

func TestImportsRunDown(t *testing.T) {
	for _, p := range packages(t) {
		top, f := floorOf(t, p.ImportPath)
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			itop, fi := floorOf(t, imp)
			if fi > f {
				t.Errorf("%s (%s, floor %d) imports %s (%s, floor %d): an import that runs up", p.ImportPath, top, f, imp, itop, fi)
			}
		}
	}
}
