//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package certs

// lockDir is a no-op where flock(2) is unavailable: only one process may
// run Ensure on a directory at a time.
func lockDir(dir string) (func(), error) { return func() {}, nil }
