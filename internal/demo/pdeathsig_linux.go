package demo

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// dieWithParent writes dir/<name of bin>, a script that runs bin with a
// parent-death signal (util-linux setpriv --pdeathsig KILL, kept across
// exec): when the demo dies, however it dies, the kernel kills bin too.
// Signals sent to the script's process reach bin itself (exec, same PID).
func dieWithParent(dir, bin string) (string, error) {
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		return "", fmt.Errorf("demo: setpriv (util-linux) makes the control plane die with the demo: %w", err)
	}
	script := fmt.Sprintf("#!/bin/sh\nexec %s --pdeathsig KILL -- %s \"$@\"\n", shellQuote(setpriv), shellQuote(bin))
	path := filepath.Join(dir, filepath.Base(bin))
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		return "", fmt.Errorf("demo: %w", err)
	}
	return path, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
