package demo

import (
	"fmt"
	"os/exec"
)

// dieWithParent is the command prefix (util-linux setpriv --pdeathsig KILL,
// kept across exec) that gives the program after it a parent-death signal:
// when the demo dies, however it dies, the kernel kills that program too.
// setpriv execs it, so signals sent to its process reach the program itself
// (same PID).
func dieWithParent() ([]string, error) {
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		return nil, fmt.Errorf("demo: setpriv (util-linux) makes the control plane die with the demo: %w", err)
	}
	return []string{setpriv, "--pdeathsig", "KILL", "--"}, nil
}
