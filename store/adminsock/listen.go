package adminsock

import (
	"net"
	"os"
)

// listenPrivate listens on a unix socket at path, made 0600 at once (the
// peer check refuses another user's connection in the moment before).
func listenPrivate(path string) (net.Listener, error) {
	addr, done, err := sockAddr(path)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", addr)
	done()
	if err != nil {
		return nil, err
	}
	// The listener would remove its address at Close; that may be a
	// descriptor's path now gone: Server.Close removes path itself.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
