package swtpm

import "syscall"

// procAttr makes the kernel kill a child (swtpm, swtpm_setup) when the
// thread that started it dies, so a killed test or demo leaves none
// behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// daemonAttr starts a daemon in a session of its own.
func daemonAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// alive reports whether process pid exists (signal 0).
func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

// ChildProcAttr is what Start gives swtpm: the kernel kills it when the
// thread that started it dies. For other swtpm processes of a caller's
// own (a VM's TPM).
func ChildProcAttr() *syscall.SysProcAttr { return procAttr() }
