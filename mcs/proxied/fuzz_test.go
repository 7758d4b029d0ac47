package proxied_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/mcs/limit"
	"github.com/nodeproof/nodeproof/mcs/proxied"
)

// FuzzHeader: whatever a balancer or a stranger sends first, over real
// loopback TCP, the listener does not panic, refuses or accepts within its
// timeout (a stranger's connection at once, refused at its first read if
// it begins with a header), and an accepted connection has a client
// address the limits can key on and delivers exactly the bytes after the
// header (all of them from a stranger, whose header is never read as
// one).
func FuzzHeader(f *testing.F) {
	f.Add([]byte("PROXY TCP4 192.0.2.7 10.0.0.1 40000 22623\r\nGET / HTTP/1.1\r\n"), true)
	f.Add([]byte("PROXY TCP6 2001:db8::7 2001:db8::1 40000 22623\r\n\x16\x03\x01"), true)
	f.Add([]byte("PROXY UNKNOWN\r\nGET /"), true)
	f.Add([]byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c\xc0\x00\x02\x07\x0a\x00\x00\x01\x9c\x40\x58\x7f\x16\x03\x01"), true)
	f.Add([]byte("\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00GET /"), true)
	f.Add([]byte("GET / HTTP/1.1\r\n"), false)
	f.Add([]byte("PROXY TCP4 192.0.2.7 10.0.0.1 40000 22623\r\nGET /"), false)
	f.Add([]byte(""), false)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	l, err := proxied.New(ln, proxied.Options{Trusted: []netip.Prefix{netip.MustParsePrefix("127.0.2.0/24")}, Timeout: 50 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { l.Close() })
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()

	// Each run dials from the next of 250 addresses: a closed
	// connection's TIME_WAIT holds its port for a minute, and tens of
	// thousands of runs from one address would use them all up.
	var runs atomic.Uint32
	f.Fuzz(func(t *testing.T, first []byte, fromBalancer bool) {
		src := fmt.Sprintf("127.0.3.%d", runs.Add(1)%250+1)
		if fromBalancer {
			src = fmt.Sprintf("127.0.2.%d", runs.Load()%250+1)
		}
		before := l.Refused()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
		client, err := d.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatalf("dial from %s: %v", src, err)
		}
		defer client.Close()
		wrote := make(chan struct{})
		go func() {
			client.Write(first)
			client.(*net.TCPConn).CloseWrite() // EOF after what was sent
			close(wrote)
		}()
		defer func() { <-wrote }()
		var c net.Conn
		for deadline := time.Now().Add(2 * time.Second); c == nil; {
			select {
			case c = <-accepted:
			case <-time.After(time.Millisecond):
				if l.Refused() > before {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("neither accepted nor refused within 2 s (timeout 50 ms)")
				}
			}
		}
		defer c.Close()
		if c.RemoteAddr() == nil || limit.SourceKey(c.RemoteAddr().String()) == "" {
			t.Fatalf("accepted with client address %v", c.RemoteAddr())
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		rest, err := io.ReadAll(c)
		if err != nil && !fromBalancer && l.Refused() > before {
			return // a stranger's header, refused at its first read
		}
		if err != nil {
			t.Fatalf("reading what followed: %v", err)
		}
		if !bytes.HasSuffix(first, rest) {
			t.Fatalf("delivered %q, not a suffix of what was sent %q", rest, first)
		}
		if !fromBalancer && len(rest) != len(first) {
			t.Fatalf("a stranger's connection delivered %d of the %d bytes it sent", len(rest), len(first))
		}
	})
}
