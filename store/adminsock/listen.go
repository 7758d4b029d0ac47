package adminsock

import (
	"net"
	"os"
)

// listenPrivate listens on a unix socket at path, made 0600 at once (the
// peer check refuses another user's connection in the moment before).
func listenPrivate(path string) (net.Listener, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
