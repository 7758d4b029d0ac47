// Package layout_test holds docs/architecture.md's floors against the
// code: a package may import packages on its own floor or below, never
// above. Tests are left out (a test may reach anywhere to set a scene).
package layout_test

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/nodeproof/nodeproof"

// floors, by top-level directory (docs/architecture.md).
var floors = map[string]int{
	"attest": 1, "pemcert": 1, "fsutil": 1, "firmware-testdata": 1, "safetext": 1, "leader": 1, "metrics": 1,
	"identity": 2, "store": 2, "internal": 2,
	"mcs": 3, "approver": 3,
	"agent": 4,
	"cmd":   5, "bench": 5, "deploy": 5, "hack": 5,
}

func floorOf(t *testing.T, pkg string) (string, int) {
	t.Helper()
	rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
	top, _, _ := strings.Cut(rel, "/")
	f, ok := floors[top]
	if !ok {
		t.Errorf("%s: top-level directory %q has no floor in docs/architecture.md (add it there and here)", pkg, top)
	}
	return top, f
}

func TestImportsRunDown(t *testing.T) {
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	n := 0
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		n++
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
	if n < 40 {
		t.Fatalf("go list named %d packages; the module has more", n)
	}
}
