package adminsock

import (
	"net"
	"syscall"
)

// peerUID is the uid of the process at the other end of a unix socket
// connection (SO_PEERCRED).
func peerUID(c net.Conn) (int, bool) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || serr != nil {
		return 0, false
	}
	return int(cred.Uid), true
}
