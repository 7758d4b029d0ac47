//go:build !linux

package swtpm

import (
	"os"
	"syscall"
)

// procAttr: parent-death signals are Linux's.
func procAttr() *syscall.SysProcAttr { return nil }

// daemonAttr: sessions as on Linux are not everywhere.
func daemonAttr() *syscall.SysProcAttr { return nil }

// alive reports whether process pid exists.
func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	return err == nil && pid > 0 && p.Signal(syscall.Signal(0)) == nil
}

// ChildProcAttr is what Start gives swtpm (nothing here).
func ChildProcAttr() *syscall.SysProcAttr { return procAttr() }
