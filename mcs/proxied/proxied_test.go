package proxied_test

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/proxied"
)

const (
	balancer = "127.0.0.2" // trusted
	stranger = "127.0.0.3"
)

type env struct {
	l       *proxied.Listener
	mu      sync.Mutex
	refusal []proxied.Refusal
}

func (e *env) refusals() []proxied.Refusal {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]proxied.Refusal(nil), e.refusal...)
}

func listen(t *testing.T, o proxied.Options) *env {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{}
	o.Trusted = []netip.Prefix{netip.MustParsePrefix(balancer + "/32")}
	o.OnRefuse = func(r proxied.Refusal) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.refusal = append(e.refusal, r)
	}
	if e.l, err = proxied.New(ln, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.l.Close() })
	return e
}

func (e *env) dial(t *testing.T, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", e.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// accept returns the next accepted connection, or nil after d.
func (e *env) accept(d time.Duration) net.Conn {
	got := make(chan net.Conn, 1)
	go func() {
		c, err := e.l.Accept()
		if err != nil {
			c = nil
		}
		got <- c
	}()
	select {
	case c := <-got:
		return c
	case <-time.After(d):
		return nil
	}
}

func header(t *testing.T, version byte, client string) []byte {
	t.Helper()
	h := proxyproto.HeaderProxyFromAddrs(version, &net.TCPAddr{IP: net.ParseIP(client), Port: 40000}, &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 22623})
	b, err := h.Format()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestListener(t *testing.T) {
	cases := []struct {
		name, from string
		send       func(t *testing.T) []byte
		remote     string        // the accepted connection's client address; "" refused
		reason     attest.Reason // the refusal's reason
	}{
		{"balancer, v1 header", balancer, func(t *testing.T) []byte { return append(header(t, 1, "192.0.2.7"), "GET / HTTP/1.1\r\n"...) }, "192.0.2.7", ""},
		{"balancer, v2 header", balancer, func(t *testing.T) []byte { return append(header(t, 2, "2001:db8::7"), "GET / HTTP/1.1\r\n"...) }, "2001:db8::7", ""},
		{"balancer, v2 LOCAL (a health check)", balancer, func(t *testing.T) []byte {
			b, err := (&proxyproto.Header{Version: 2, Command: proxyproto.LOCAL}).Format()
			if err != nil {
				t.Fatal(err)
			}
			return append(b, "GET / HTTP/1.1\r\n"...)
		}, balancer, ""},
		{"balancer, v1 UNKNOWN", balancer, func(*testing.T) []byte { return []byte("PROXY UNKNOWN\r\nGET / HTTP/1.1\r\n") }, balancer, ""},
		{"balancer, no header", balancer, func(*testing.T) []byte { return []byte("GET / HTTP/1.1\r\n") }, "", attest.ReasonProxyHeaderMissing},
		{"balancer, broken header", balancer, func(*testing.T) []byte { return []byte("PROXY TCP4 not-an-address 10.0.0.1 1 2\r\nGET /") }, "", attest.ReasonProxyHeaderInvalid},
		{"stranger, forged v1 header", stranger, func(t *testing.T) []byte { return append(header(t, 1, "192.0.2.8"), "GET / HTTP/1.1\r\n"...) }, "", attest.ReasonProxyHeaderUntrusted},
		{"stranger, forged v2 header", stranger, func(t *testing.T) []byte { return append(header(t, 2, "192.0.2.8"), "GET / HTTP/1.1\r\n"...) }, "", attest.ReasonProxyHeaderUntrusted},
		{"stranger, no header: served as itself", stranger, func(*testing.T) []byte { return []byte("GET / HTTP/1.1\r\n") }, stranger, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := listen(t, proxied.Options{Timeout: 2 * time.Second})
			conn := e.dial(t, c.from)
			if _, err := conn.Write(c.send(t)); err != nil {
				t.Fatal(err)
			}
			if c.remote == "" {
				if c.from == stranger {
					// An unlisted peer's connection is handed on before
					// it is read; its first read refuses the header.
					got := e.accept(3 * time.Second)
					if got == nil {
						t.Fatalf("a stranger's connection was not handed on; refusals %+v", e.refusals())
					}
					got.SetReadDeadline(time.Now().Add(3 * time.Second))
					if n, err := got.Read(make([]byte, 64)); err == nil {
						t.Fatalf("read %d bytes of a connection that must be refused %s", n, c.reason)
					}
				}
				for deadline := time.Now().Add(3 * time.Second); len(e.refusals()) == 0 && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
				}
				if got := e.accept(100 * time.Millisecond); got != nil {
					t.Fatalf("accepted, from %s; want refused %s", got.RemoteAddr(), c.reason)
				}
				rs := e.refusals()
				if len(rs) != 1 || rs[0].Reason != c.reason || e.l.Refused() != 1 {
					t.Fatalf("refusals %+v (count %d); want one %s", rs, e.l.Refused(), c.reason)
				}
				// The refused connection is closed.
				conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "reset") {
					t.Errorf("the refused connection reads %v; want it closed", err)
				}
				return
			}
			got := e.accept(3 * time.Second)
			if got == nil {
				t.Fatalf("not accepted; refusals %+v", e.refusals())
			}
			defer got.Close()
			host, _, _ := net.SplitHostPort(got.RemoteAddr().String())
			if host != c.remote {
				t.Errorf("RemoteAddr %s; want %s", got.RemoteAddr(), c.remote)
			}
			line := make([]byte, len("GET / HTTP/1.1\r\n"))
			if _, err := io.ReadFull(got, line); err != nil || string(line) != "GET / HTTP/1.1\r\n" {
				t.Errorf("the bytes after the header read %q, %v", line, err)
			}
		})
	}
}

// TestSlowClients: a balancer connection that never sends its header is
// refused after the timeout and holds up no one; idle connections from a
// stranger are handed on at once and take nothing from the balancer's
// queue; the queue bounds only the balancer's connections.
func TestSlowClients(t *testing.T) {
	e := listen(t, proxied.Options{Timeout: time.Second, Pending: 2})
	e.dial(t, balancer) // silent
	for range 3 {
		e.dial(t, stranger) // silent
	}
	// The strangers' silent connections are handed on at once, in the
	// order they came, before any of their bytes is read.
	for range 3 {
		if c := e.accept(time.Second); c == nil || !strings.HasPrefix(c.RemoteAddr().String(), stranger+":") {
			t.Fatalf("a silent stranger's connection: %v", c)
		} else {
			defer c.Close()
		}
	}
	fast := e.dial(t, balancer)
	if _, err := fast.Write(header(t, 2, "192.0.2.9")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got := e.accept(time.Second)
	if got == nil || !strings.HasPrefix(got.RemoteAddr().String(), "192.0.2.9:") {
		t.Fatalf("the machine behind the balancer: %v", got)
	}
	if d := time.Since(start); d > 250*time.Millisecond {
		t.Errorf("accepted after %s: a silent connection held it up", d)
	}
	got.Close()
	// Two balancer connections wait at once (Pending 2): the silent one
	// and a second silent one; a third is refused at once.
	e.dial(t, balancer)
	for deadline := time.Now().Add(time.Second); e.l.Pending() < 2 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	e.dial(t, balancer)
	var reasons map[attest.Reason]int
	for deadline := time.Now().Add(4 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		reasons = map[attest.Reason]int{}
		for _, r := range e.refusals() {
			reasons[r.Reason]++
		}
		if reasons[attest.ReasonProxyQueueFull] == 1 && reasons[attest.ReasonProxyHeaderMissing] == 2 || time.Now().After(deadline) {
			break
		}
	}
	if reasons[attest.ReasonProxyQueueFull] != 1 || reasons[attest.ReasonProxyHeaderMissing] != 2 {
		t.Errorf("refusals %v; want one %s (the third waiting balancer connection) and two %s (the silent ones, after the timeout)", reasons, attest.ReasonProxyQueueFull, attest.ReasonProxyHeaderMissing)
	}
}

func TestParseCIDRs(t *testing.T) {
	cases := []struct {
		in, want string
		err      bool
	}{
		{"10.0.0.0/24", "[10.0.0.0/24]", false},
		{"10.0.0.7, 10.1.0.0/16", "[10.0.0.7/32 10.1.0.0/16]", false},
		{"fd00::/8,::ffff:10.0.0.1", "[fd00::/8 10.0.0.1/32]", false},
		{"10.0.0.9/24", "[10.0.0.0/24]", false},
		{"", "[]", false},
		{"balancer.example", "", true},
		{"10.0.0.0/33", "", true},
	}
	for _, c := range cases {
		got, err := proxied.ParseCIDRs(c.in)
		if (err != nil) != c.err || (err == nil && fmtPrefixes(got) != c.want) {
			t.Errorf("ParseCIDRs(%q) = %v, %v; want %s (error %v)", c.in, got, err, c.want, c.err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := proxied.New(ln, proxied.Options{}); err == nil {
		t.Error("New with no trusted balancer: accepted; an empty list must refuse")
	}
}

func fmtPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}
