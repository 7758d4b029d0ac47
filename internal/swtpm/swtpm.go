// Package swtpm is attest/tpm/swtpm for tests, the demo and the bench,
// with simulated machines (Machine: a provisioned, running swtpm booted
// from an event log, with a collector and a kubelet key).
package swtpm

import (
	"context"
	"syscall"

	sw "github.com/nodeproof/nodeproof/attest/tpm/swtpm"
)

// InstallHint says how to get the binaries this package runs.
const InstallHint = sw.InstallHint

// Check reports whether swtpm and swtpm_setup are installed.
func Check() error { return sw.Check() }

// Manufacturer is a TPM vendor made of swtpm's local CA
// (attest/tpm/swtpm), which also makes whole machines (NewMachine).
type Manufacturer struct{ *sw.Manufacturer }

// NewManufacturer prepares a manufacturer in dir (created if missing).
func NewManufacturer(dir string) (*Manufacturer, error) {
	m, err := sw.NewManufacturer(dir)
	if err != nil {
		return nil, err
	}
	return &Manufacturer{m}, nil
}

// TPM is a running swtpm.
type TPM = sw.TPM

// procAttr: swtpm processes die with the thread that started them.
func procAttr() *syscall.SysProcAttr { return sw.ChildProcAttr() }

// Start runs swtpm on stateDir as a child of this process
// (attest/tpm/swtpm.Start).
func Start(ctx context.Context, stateDir string) (*TPM, error) { return sw.Start(ctx, stateDir) }
