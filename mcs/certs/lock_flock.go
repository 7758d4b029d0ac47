//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package certs

import (
	"os"
	"path/filepath"
	"syscall"
)

// lockDir takes an exclusive flock(2) on dir/.lock, serialising Ensure
// across goroutines and processes (e.g. "nodeproof serve" and
// "nodeproof ca" on the same directory).
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
