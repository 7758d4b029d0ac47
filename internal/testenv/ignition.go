package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// IgnitionFetch runs the real Ignition client's fetch stage, unprivileged
// and touching nothing on the machine, the way a node's initramfs does:
// the config is pointerFile (IGNITION_CONFIG_FILE), the system config
// directory is systemDir (an empty one when ""). It returns the config
// Ignition cached (its merged result) and Ignition's output. The pointer
// config should set ignition.timeouts.httpTotal: Ignition retries 5xx
// forever otherwise; the run is cut at two minutes regardless.
func IgnitionFetch(t testing.TB, pointerFile, systemDir string) (cached []byte, output string, err error) {
	t.Helper()
	return RunIgnitionFetch(IgnitionBinary(t), t.TempDir(), pointerFile, systemDir)
}

// RunIgnitionFetch is IgnitionFetch for programs (the demo): bin is the
// Ignition binary, dir an empty working directory.
func RunIgnitionFetch(bin, dir, pointerFile, systemDir string) (cached []byte, output string, err error) {
	return RunIgnitionFetchContext(context.Background(), bin, dir, pointerFile, systemDir)
}

// RunIgnitionFetchContext is RunIgnitionFetch that also ends (killing
// Ignition) when ctx does.
func RunIgnitionFetchContext(ctx context.Context, bin, dir, pointerFile, systemDir string) (cached []byte, output string, err error) {
	if systemDir == "" {
		systemDir = filepath.Join(dir, "system")
		if err := os.Mkdir(systemDir, 0o700); err != nil {
			return nil, "", err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cache := filepath.Join(dir, "ignition.json")
	cmd := exec.CommandContext(ctx, bin, "-platform", "file", "-stage", "fetch",
		"-config-cache", cache, "-state-file", filepath.Join(dir, "state"),
		"-neednet", filepath.Join(dir, "neednet"), "-root", filepath.Join(dir, "root"),
		"-log-to-stdout")
	cmd.Env = append(os.Environ(), "IGNITION_CONFIG_FILE="+pointerFile, "IGNITION_SYSTEM_CONFIG_DIR="+systemDir, "TMPDIR="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, string(out), err
	}
	cached, err = os.ReadFile(cache)
	return cached, string(out), err
}
