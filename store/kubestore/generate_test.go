package kubestore

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/testenv"
)

// moduleRoot is the repository root, from this package's directory.
const moduleRoot = "../.."

// controllerGen returns the controller-gen that hack/tools.sh builds (`make
// tools`), at the version the script pins. Like internal/testenv, a missing
// binary fails the test rather than skipping it.
func controllerGen(t *testing.T) string {
	t.Helper()
	script, err := os.ReadFile(filepath.Join(moduleRoot, "hack", "tools.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CONTROLLER_TOOLS_VERSION=(\S+)`).FindSubmatch(script)
	if m == nil {
		t.Fatal("hack/tools.sh sets no CONTROLLER_TOOLS_VERSION")
	}
	version := string(m[1])
	gomod, err := os.ReadFile(filepath.Join(moduleRoot, "hack", "tools", "controller-gen", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^require sigs\.k8s\.io/controller-tools ` + regexp.QuoteMeta(version) + `$`).Match(gomod) {
		t.Fatalf("hack/tools/controller-gen/go.mod does not require controller-tools %s (hack/tools.sh's CONTROLLER_TOOLS_VERSION)", version)
	}
	bin := filepath.Join(testenv.Cache(), "bin", "controller-gen-"+version, "controller-gen")
	if fi, err := os.Stat(bin); err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Fatalf("controller-gen %s is not built (%v): run `make tools` (hack/tools.sh) first", version, err)
	}
	return bin
}

// TestGeneratedFilesUpToDate runs controller-gen into a temporary directory
// and compares its output with the committed deepcopy code and CRDs: a change
// to the API types without `make generate` fails here.
func TestGeneratedFilesUpToDate(t *testing.T) {
	bin := controllerGen(t)
	out := t.TempDir()
	start := time.Now()
	for _, args := range [][]string{
		{"object", "paths=./store/kubestore/v1alpha1/...", "output:object:dir=" + filepath.Join(out, "object")},
		{"crd", "paths=./store/kubestore/v1alpha1/...", "output:crd:dir=" + filepath.Join(out, "crds")},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = moduleRoot
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("controller-gen %v: %v\n%s", args, err, b)
		}
	}
	t.Logf("controller-gen ran in %s", time.Since(start).Round(time.Millisecond))

	for _, tc := range []struct {
		name           string
		generated, dir string
	}{
		{"deepcopy", filepath.Join(out, "object"), filepath.Join(moduleRoot, "store", "kubestore", "v1alpha1")},
		{"CRDs", filepath.Join(out, "crds"), filepath.Join(moduleRoot, "deploy", "crds")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gen, err := filepath.Glob(filepath.Join(tc.generated, "*"))
			if err != nil || len(gen) == 0 {
				t.Fatalf("controller-gen wrote nothing to %s (%v)", tc.generated, err)
			}
			var names []string
			for _, g := range gen {
				names = append(names, filepath.Base(g))
				want, err := os.ReadFile(g)
				if err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(filepath.Join(tc.dir, filepath.Base(g)))
				if err != nil {
					t.Errorf("%s: %v: run `make generate`", filepath.Base(g), err)
					continue
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%s differs from what controller-gen generates now: run `make generate`", filepath.Join(tc.dir, filepath.Base(g)))
				}
			}
			if tc.name == "CRDs" {
				// No stale CRD left behind by a removed type.
				have, err := filepath.Glob(filepath.Join(tc.dir, "*.yaml"))
				if err != nil {
					t.Fatal(err)
				}
				for _, h := range have {
					if filepath.Base(h) == "kustomization.yaml" {
						continue // written by hand, lists the CRDs
					}
					if !slices.Contains(names, filepath.Base(h)) {
						t.Errorf("%s is not generated from any type: delete it", h)
					}
				}
			}
		})
	}
}
