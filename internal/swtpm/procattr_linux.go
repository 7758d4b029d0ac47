package swtpm

import "syscall"

// procAttr makes the kernel kill a child (swtpm, swtpm_setup) when the
// thread that started it dies, so a killed test or demo leaves none
// behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
