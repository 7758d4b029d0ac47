package layout_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
)

// kindPackages is, for each kind of evidence but the bare-metal TPM's, the
// package of its own verifier: the one package that may name it besides
// the tables docs/architecture.md's recipe lists. A new kind adds its row.
var kindPackages = map[string]string{
	"KindGCP":       "identity/gcp",
	"KindAWS":       "identity/aws",
	"KindGCEVTPM":   "identity/gcevtpm",
	"KindNitroTPM":  "identity/nitrotpm",
	"KindAzureVTPM": "identity/azuretpm",
}

// TestKindPackages holds docs/architecture.md's recipe for a new evidence
// kind to the code: the shipped packages that name a cloud kind's
// constant (attest.Kind…, but the bare-metal KindTPM, which many packages
// name as the default) other than the kind's own verifier package are
// exactly the ones the recipe lists, so a new kind is its package plus
// rows in those. Tests, benches and test tooling (bench/, internal/, hack/,
// …test packages) may name any kind.
func TestKindPackages(t *testing.T) {
	consts := kindConstants(t)
	var own []string
	for _, c := range consts {
		if c == "KindTPM" {
			continue
		}
		p, ok := kindPackages[c]
		if !ok {
			t.Errorf("attest.%s: no verifier package in kindPackages", c)
		}
		own = append(own, p)
	}
	got := map[string][]string{"attest": {"(defines them)"}}
	for _, p := range packages(t) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if toolingPackage(rel) || slices.Contains(own, rel) || rel == "attest" {
			continue
		}
		for _, name := range p.GoFiles {
			for _, c := range namedKinds(t, filepath.Join(p.Dir, name)) {
				if c != "KindTPM" && kindPackages[c] != rel && !slices.Contains(got[rel], c) {
					got[rel] = append(got[rel], c)
				}
			}
		}
	}
	recipe := recipePackages(t)
	for rel, cs := range got {
		if !slices.Contains(recipe, rel) {
			t.Errorf("%s names %v, but docs/architecture.md's recipe for a new evidence kind does not list it: make it a row of a listed table, or list it", rel, cs)
		}
	}
	for _, rel := range recipe {
		if _, ok := got[rel]; !ok {
			t.Errorf("docs/architecture.md's recipe lists %s, which names no kind", rel)
		}
	}
}

// toolingPackage: tests, benches and test tooling, which may name kinds.
func toolingPackage(rel string) bool {
	for _, p := range []string{"bench/", "internal/", "hack/"} {
		if strings.HasPrefix(rel, p) {
			return true
		}
	}
	return strings.HasSuffix(rel, "test")
}

// kindConstants are the constants of type Kind in package attest.
func kindConstants(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../../attest/attest.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); ok && id.Name == "Kind" {
				for _, n := range v.Names {
					out = append(out, n.Name)
				}
			}
		}
	}
	if !slices.Contains(out, "KindTPM") || len(out) < 2 {
		t.Fatalf("attest.go's Kind constants: %v", out)
	}
	return out
}

// namedKinds are the attest.Kind… constants file names (attest imported
// under any name).
func namedKinds(t *testing.T, path string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	local := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == module+"/attest" {
			local = "attest"
			if imp.Name != nil {
				local = imp.Name.Name
			}
		}
	}
	if local == "" {
		return nil
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok {
			if x, ok := s.X.(*ast.Ident); ok && x.Name == local && strings.HasPrefix(s.Sel.Name, "Kind") && s.Sel.Name != "Kind" {
				out = append(out, s.Sel.Name)
			}
		}
		return true
	})
	return out
}

// recipeList is the sentence of the recipe that lists the packages a new
// kind touches: "… (TestKindPackages holds this list): `a`, `b` …".
var recipeList = regexp.MustCompile(`(?s)TestKindPackages holds this list\):(.*?)\.\s`)

// recipePackages are the packages docs/architecture.md's recipe for a new
// evidence kind lists, without the kind's own (identity/<kind>).
func recipePackages(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	m := recipeList.FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/architecture.md: the recipe for a new evidence kind has no list \"(TestKindPackages holds this list): `…`, ….\"")
	}
	var out []string
	for _, q := range regexp.MustCompile("`([^`]+)`").FindAllSubmatch(m[1], -1) {
		if p := string(q[1]); !strings.Contains(p, "<") {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		t.Fatal("docs/architecture.md: the recipe's list names no package")
	}
	return out
}

// TestStoreKindEnums: the store's CRDs validate a record's, a binding's, a
// ban's and a released name's kind against an enum
// (store/kubestore/v1alpha1's markers, deploy/crds generated from them by
// make generate); each enum is exactly attest.AllKinds, so a new kind is
// not refused by the API server in cluster mode.
func TestStoreKindEnums(t *testing.T) {
	want := make([]string, 0, len(attest.AllKinds()))
	for _, k := range attest.AllKinds() {
		want = append(want, string(k))
	}
	src, err := os.ReadFile("../../store/kubestore/v1alpha1/types.go")
	if err != nil {
		t.Fatal(err)
	}
	enums := regexp.MustCompile(`\+kubebuilder:validation:Enum=(\S+)`).FindAllSubmatch(src, -1)
	n := 0
	for _, m := range enums {
		vals := strings.Split(string(m[1]), ";")
		if !slices.Contains(vals, string(attest.KindTPM)) {
			continue
		}
		n++
		if !slices.Equal(vals, want) {
			t.Errorf("store/kubestore/v1alpha1: kind enum %v, want attest.AllKinds %v", vals, want)
		}
	}
	if n == 0 {
		t.Fatal("store/kubestore/v1alpha1 has no kind enum: this test reads nothing")
	}
	crds, err := filepath.Glob("../../deploy/crds/nodeproof.io_*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range crds {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^\s+- tpm$`).Match(b) {
			continue
		}
		for _, k := range want {
			if !regexp.MustCompile(`(?m)^\s+- ` + regexp.QuoteMeta(k) + `$`).Match(b) {
				t.Errorf("%s: the kind enum lacks %s (make generate)", filepath.Base(f), k)
			}
		}
	}
}
