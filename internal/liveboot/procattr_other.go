//go:build !linux

package liveboot

import "syscall"

// procAttr: parent-death signals are Linux's.
func procAttr() *syscall.SysProcAttr { return nil }
