package proxied_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/limit"
	"github.com/nodeproof/nodeproof/mcs/proxied"
)

// ula is the IPv6 prefix the test's network namespace routes to its
// loopback: each /64 in it stands for one host's network.
const ula = "fd00:6e70::/48"

// enterNetns moves the calling goroutine, locked to its thread for the
// rest of the test (the thread ends with it), into a network namespace of
// its own whose loopback answers for every address of ula, so that it
// can dial from many IPv6 addresses and /64s. Sockets keep the namespace
// they were made in: listen and dial from this goroutine only.
func enterNetns(t *testing.T) {
	t.Helper()
	runtime.LockOSThread() // never unlocked: the thread exits with the test's goroutine
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Fatalf("a network namespace for the IPv6 sources (needs root or CAP_SYS_ADMIN): %v", err)
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"-6", "route", "add", "local", ula, "dev", "lo"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s (install iproute2: apt-get install -y iproute2)", strings.Join(args, " "), err, out)
		}
	}
}

// dialFrom dials addr from src, an address of ula (IPV6_FREEBIND: no
// address needs adding to the interface).
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second,
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1) }); err != nil {
				return err
			}
			return serr
		}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestIPv6SourceAttack: with the PROXY protocol on, the per-source
// connection limit in front of it (as `nodeproof serve` stacks them)
// counts an unlisted IPv6 source by its /64, before any of its bytes is
// read: 300 idle connections from 300 addresses of one /64 hold 32 (the
// limit); a machine in another /64 and one behind the listed balancer are
// served within 1 s.
func TestIPv6SourceAttack(t *testing.T) {
	enterNetns(t)
	const perSource = 32
	balancer6 := "fd00:6e70:0:ba1::1"
	raw, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	pl, err := proxied.New(raw, proxied.Options{Trusted: []netip.Prefix{netip.MustParsePrefix(balancer6 + "/128")}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ln := limit.NewListener(pl, limit.ListenerOptions{MaxConnsPerSource: perSource})
	t.Cleanup(func() { pl.Close() })
	// The server's side: each accepted connection's first line, with the
	// client address it was accepted as.
	lines := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(30 * time.Second))
				if line, err := bufio.NewReader(c).ReadString('\n'); err == nil {
					host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
					lines <- host + " " + strings.TrimSpace(line)
				}
			}()
		}
	}()
	addr := raw.Addr().String()

	var idle []net.Conn
	for i := range 300 {
		idle = append(idle, dialFrom(t, fmt.Sprintf("fd00:6e70:0:1::%x", i+1), addr))
	}
	held := 0
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		held = 0
		for _, c := range idle {
			c.SetReadDeadline(time.Now().Add(time.Millisecond))
			var ne net.Error
			if _, err := c.Read(make([]byte, 1)); errors.As(err, &ne) && ne.Timeout() {
				held++
			}
		}
		if held == perSource {
			break
		}
	}
	attacktable.Check(t, "PROXY protocol", "300 idle connections from 300 addresses of one IPv6 /64, no header sent (limit 32 per source)",
		"32 held, 268 closed at accept", fmt.Sprintf("%d held, %d closed at accept", held, len(idle)-held))

	// served sends a request line on c and says whether the server read
	// it from want within 1 s.
	served := func(c net.Conn, prefix []byte, want string) string {
		start := time.Now()
		if _, err := c.Write(append(prefix, "GET / HTTP/1.1\r\n"...)); err != nil {
			return "write: " + err.Error()
		}
		select {
		case l := <-lines:
			d := time.Since(start)
			t.Logf("%s served after %s", want, d)
			switch {
			case l != want+" GET / HTTP/1.1":
				return "read " + l
			case d > time.Second:
				return fmt.Sprintf("served after %s", d)
			}
			return "served within 1 s"
		case <-time.After(5 * time.Second):
			return "not served"
		}
	}
	attacktable.Check(t, "PROXY protocol", "meanwhile a machine in another /64 connects directly", "served within 1 s",
		served(dialFrom(t, "fd00:6e70:0:2::7", addr), nil, "fd00:6e70:0:2::7"))
	attacktable.Check(t, "PROXY protocol", "meanwhile a machine behind the listed balancer (IPv6)", "served within 1 s",
		served(dialFrom(t, balancer6, addr), header(t, 2, "2001:db8::7"), "2001:db8::7"))
}
