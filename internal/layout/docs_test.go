package layout_test

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocs: every package says what it is in a doc comment on its
// package clause, "Package name …" for a library and "Command name …" for
// a program, as go doc shows it; a package of tests only (internal/e2e,
// deploy) says it on one of its test files' package clause.
func TestPackageDocs(t *testing.T) {
	cmd := exec.Command("go", "list", "-json=ImportPath,Dir,Name,GoFiles,TestGoFiles,XTestGoFiles", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	n := 0
	for {
		var p struct {
			ImportPath, Dir, Name              string
			GoFiles, TestGoFiles, XTestGoFiles []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		n++
		files, want := p.GoFiles, "Package "+p.Name+" "
		if p.Name == "main" {
			want = "Command "
		}
		if len(files) == 0 { // tests only
			files, want = append(p.TestGoFiles, p.XTestGoFiles...), "Package "
		}
		doc, err := packageDoc(p.Dir, files)
		if err != nil {
			t.Errorf("%s: %v", p.ImportPath, err)
			continue
		}
		switch {
		case doc == "":
			t.Errorf("%s: no package doc comment in %v (say what the package owns, above one file's package clause)", p.ImportPath, files)
		case !strings.HasPrefix(doc, want):
			t.Errorf("%s: the package doc comment begins %q; want %q…", p.ImportPath, firstLine(doc), want)
		}
	}
	if n < 40 {
		t.Fatalf("go list named %d packages; the module has more", n)
	}
}

// packageDoc is the first doc comment on the package clause of files.
func packageDoc(dir string, files []string) (string, error) {
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return "", err
		}
		if f.Doc != nil {
			if text := f.Doc.Text(); strings.TrimSpace(text) != "" {
				return text, nil
			}
		}
	}
	return "", nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
