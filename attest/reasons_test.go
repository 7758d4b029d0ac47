package attest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// reasonsDoc is the one table of reasons.
const reasonsDoc = "../docs/reasons.md"

// declaredReasons are the Reason constants of reasons.go, by value.
func declaredReasons(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "reasons.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, sp := range g.Specs {
			v := sp.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Reason" {
				continue
			}
			for i, n := range v.Names {
				val, err := strconv.Unquote(v.Values[i].(*ast.BasicLit).Value)
				if err != nil {
					t.Fatal(err)
				}
				if prev, dup := out[val]; dup {
					t.Errorf("%s and %s are both %q: one reason, one name", prev, n.Name, val)
				}
				out[val] = n.Name
			}
		}
	}
	if len(out) < 100 {
		t.Fatalf("reasons.go declares %d reasons; it holds them all", len(out))
	}
	return out
}

// TestReasonsDocumented holds docs/reasons.md to reasons.go: every reason
// is a row, once; every row is a reason; the prose names the approval of
// every kind of evidence.
func TestReasonsDocumented(t *testing.T) {
	declared := declaredReasons(t)
	b, err := os.ReadFile(reasonsDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	row := regexp.MustCompile("^\\| `([^`]+)` \\|")
	for _, line := range strings.Split(string(b), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			rows[m[1]]++
		}
	}
	for val, name := range declared {
		switch rows[val] {
		case 0:
			t.Errorf("%s (%q) is not in %s: add its row", name, val, reasonsDoc)
		case 1:
		default:
			t.Errorf("%q has %d rows in %s", val, rows[val], reasonsDoc)
		}
	}
	for val := range rows {
		if _, ok := declared[val]; !ok {
			t.Errorf("%s has a row for %q, which reasons.go does not declare", reasonsDoc, val)
		}
	}
	for _, k := range AllKinds() {
		if !strings.Contains(string(b), "`"+string(ReasonAttested(k))+"`") {
			t.Errorf("%s does not name %s, the approval of %s evidence", reasonsDoc, ReasonAttested(k), k)
		}
	}
}

// TestOneVocabulary: no package but this file declares a reason — no type
// Reason elsewhere, no constant of type attest.Reason, no constant named
// Reason… — so a new one lands here and in docs/reasons.md.
func TestOneVocabulary(t *testing.T) {
	root := ".."
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == "testdata" || name == "vendor" || (strings.HasPrefix(name, ".") && path != root) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || path == filepath.Join("..", "attest", "reasons.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		n++
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, sp := range g.Specs {
				switch s := sp.(type) {
				case *ast.TypeSpec:
					if s.Name.Name == "Reason" {
						t.Errorf("%s declares a type Reason: use attest.Reason", path)
					}
				case *ast.ValueSpec:
					if g.Tok != token.CONST {
						continue
					}
					typed := false
					if sel, ok := s.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Reason" {
						typed = true
					}
					for _, name := range s.Names {
						if typed || strings.HasPrefix(name.Name, "Reason") {
							t.Errorf("%s declares the reason %s: reasons live in attest/reasons.go (and docs/reasons.md)", path, name.Name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("read %d Go files; the module has more", n)
	}
}
