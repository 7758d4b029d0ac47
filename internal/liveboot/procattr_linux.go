package liveboot

import "syscall"

// procAttr makes the kernel kill QEMU when the thread that started it
// dies, so a killed test or demo leaves no VM behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
