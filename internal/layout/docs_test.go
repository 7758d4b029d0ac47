package layout_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocs: every package says what it is in a doc comment on its
// package clause, "Package name …" for a library and "Command name …" for
// a program, as go doc shows it; a package of tests only (internal/e2e,
// deploy) says it on one of its test files' package clause.
func TestPackageDocs(t *testing.T) {
	for _, p := range packages(t) {
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
