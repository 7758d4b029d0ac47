//go:build !linux

package adminsock

// sockAddr is path itself: elsewhere a path longer than a unix socket
// address holds fails at bind or dial, and says so.
func sockAddr(path string) (addr string, done func(), err error) {
	return path, func() {}, nil
}
