package swtpm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// VMTPM is swtpm as a QEMU VM's TPM: QEMU's tpm emulator backend connects
// to its control channel (a unix socket) and passes the guest's commands
// through it. It serves no command port and does no TPM2_Startup: the
// VM's firmware does, as a real machine's does. A new process on the
// same state is a reboot: PCRs at their reset values, the same EK, the
// reset count one up.
type VMTPM struct {
	// Socket is the control channel's path (QEMU's -chardev socket,path=).
	Socket string
	cmd    *exec.Cmd
	done   chan error
	stderr *strings.Builder
}

// StartForVM runs swtpm on stateDir (provisioned, e.g. by
// Manufacturer.Provision) with its control channel at socket, and returns
// once the socket exists. Paths must not hold commas (swtpm's option
// syntax) and socket must fit a unix socket path (about 100 bytes).
func StartForVM(ctx context.Context, stateDir, socket string) (*VMTPM, error) {
	if err := Check(); err != nil {
		return nil, err
	}
	if strings.ContainsRune(stateDir+socket, ',') {
		return nil, fmt.Errorf("swtpm: paths with commas cannot be passed to swtpm: %s %s", stateDir, socket)
	}
	_ = os.Remove(socket)
	cmd := exec.CommandContext(ctx, "swtpm", "socket", "--tpm2",
		"--tpmstate", "dir="+stateDir,
		"--ctrl", "type=unixio,path="+socket,
		"--terminate")
	t := &VMTPM{Socket: socket, cmd: cmd, done: make(chan error, 1), stderr: new(strings.Builder)}
	cmd.Stderr = t.stderr
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start swtpm: %w", err)
	}
	go func() { t.done <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-t.done:
			t.done <- err
			return nil, fmt.Errorf("swtpm exited: %v: %s", err, t.stderr.String())
		default:
		}
		if _, err := os.Stat(socket); err == nil {
			return t, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Stop()
	return nil, errors.New("swtpm made no control socket within 10s: " + t.stderr.String())
}

// Stop ends swtpm (it ends by itself when the VM disconnects) and waits
// for it.
func (t *VMTPM) Stop() {
	select {
	case err := <-t.done:
		t.done <- err
		return
	default:
	}
	_ = t.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-t.done:
		t.done <- err
	case <-time.After(3 * time.Second):
		_ = t.cmd.Process.Kill()
		t.done <- <-t.done
	}
}
