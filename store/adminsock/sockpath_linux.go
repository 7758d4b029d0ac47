package adminsock

import (
	"fmt"
	"os"
	"path/filepath"
)

// maxSunPath is what a unix socket address holds (sun_path, less its NUL).
const maxSunPath = 107

// sockAddr is the address to bind or dial for the socket at path. A path
// longer than a unix socket address holds (a state directory deep in a
// test's temporary tree) is reached through the directory's descriptor:
// /proc/self/fd/N/admin.sock names the same file, and only the bind or
// dial resolves it, so done closes the descriptor right after.
func sockAddr(path string) (addr string, done func(), err error) {
	if len(path) <= maxSunPath {
		return path, func() {}, nil
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return "", nil, fmt.Errorf("socket path %s is longer than %d bytes, and its directory does not open: %w", path, maxSunPath, err)
	}
	addr = fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	if len(addr) > maxSunPath {
		dir.Close()
		return "", nil, fmt.Errorf("socket name %s is longer than %d bytes", filepath.Base(path), maxSunPath)
	}
	return addr, func() { dir.Close() }, nil
}
