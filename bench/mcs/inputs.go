package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	"sigs.k8s.io/yaml"

	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/bench/bigconfig"
)

// examples is the example bootstrap directory, relative to the module root
// (make runs the harness from there).
const examples = "deploy/examples"

// writeInputs copies the example bootstrap directory into dir, grows the
// rendered worker config with random file contents, and writes a policy
// that serves the full config on the token tier. It returns the size of
// the added contents.
func writeInputs(dir string) (int, error) {
	src := filepath.Join(examples, "bootstrap")
	dst := filepath.Join(dir, "bootstrap")
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		return 0, fmt.Errorf("copy examples (run from the module root): %w", err)
	}
	kc, err := os.ReadFile(filepath.Join(examples, "bootstrap-kubeconfig"))
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, "kubeconfig"), kc, 0o600); err != nil {
		return 0, err
	}
	// The worker pool serves its full config for the provisioning token.
	if _, err := policytest.New().Pool("worker", policytest.Public().Token()).Write(dir); err != nil {
		return 0, err
	}
	matches, err := filepath.Glob(filepath.Join(dst, "machine-configs", "rendered-worker-*.yaml"))
	if err != nil || len(matches) != 1 {
		return 0, fmt.Errorf("one rendered worker config expected, found %d", len(matches))
	}
	b, err := os.ReadFile(matches[0])
	if err != nil {
		return 0, err
	}
	var mc mcfgv1.MachineConfig
	if err := yaml.Unmarshal(b, &mc); err != nil {
		return 0, err
	}
	total, err := bigconfig.Grow(&mc)
	if err != nil {
		return 0, err
	}
	out, err := yaml.Marshal(&mc)
	if err != nil {
		return 0, err
	}
	return total, os.WriteFile(matches[0], out, 0o644)
}
