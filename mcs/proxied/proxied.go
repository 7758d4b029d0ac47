// Package proxied accepts connections that a load balancer (haproxy in
// front of port 22623 on bare metal) forwards with a PROXY protocol header
// (v1 or v2, parsed by github.com/pires/go-proxyproto), so that the
// server sees each machine's own address: per-source limits, logs and
// Events use the client address from the header.
//
// Checks, per accepted connection:
//   - its TCP peer is in Options.Trusted (a listed balancer): the
//     connection must begin with a PROXY header (v1 or v2), else it is
//     refused (a balancer that forgot send-proxy would make every machine
//     one source); a header without a TCP client address (v2 LOCAL, as
//     haproxy's health checks send; v1 UNKNOWN; a Unix socket) keeps the
//     peer's address. The header is read within Options.Timeout, else the
//     connection is refused, in the connection's own goroutine (a slow
//     balancer connection holds up no one else's accept), and at most
//     Options.Pending listed connections wait for their header at once
//     (more are refused ProxyHeaderQueueFull);
//   - any other peer (unlisted): Accept returns the connection at once,
//     with the peer's address, so that the per-source connection limits
//     in front of TLS (mcs/limit: per address, per IPv6 /64) apply to it
//     before any of its bytes are read. Its first read checks that it
//     does not begin with a PROXY header: one is refused (an attacker
//     forging its address to get a fresh limit bucket or a misleading
//     log), and its reader sees an error. An unlisted connection never
//     waits in the header queue: however many idle connections unlisted
//     sources open, the listed balancers' capacity stays theirs, and an
//     idle unlisted connection is bounded by the server's own handshake
//     and header timeouts, like any connection.
//
// A refused connection is closed before anything else reads it; each
// refusal is counted and reported to Options.OnRefuse with its reason.
package proxied

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pires/go-proxyproto"

	"github.com/nodeproof/nodeproof/attest"
)

// Refusal is one refused connection.
type Refusal struct {
	Peer   net.Addr
	Reason attest.Reason
	Err    error
}

// Options configure a Listener.
type Options struct {
	// Trusted are the balancers' addresses: only they may (and must) send
	// a PROXY header. Empty is refused by New: trust must be named.
	Trusted []netip.Prefix
	// Timeout bounds a listed balancer's wait for its header (0: 5 s).
	Timeout time.Duration
	// Pending bounds the listed balancers' connections waiting for their
	// header at once (0: 1024). Only theirs wait: unlisted peers take
	// none of it.
	Pending int
	// OnRefuse, when set, is told of each refused connection.
	OnRefuse func(Refusal)
}

// Listener is a net.Listener whose connections' RemoteAddr is the
// client's, from a trusted balancer's PROXY header.
type Listener struct {
	ln net.Listener
	o  Options

	ready   chan net.Conn
	failed  chan struct{} // closed when the inner Accept failed for good
	err     error         // why, set before failed is closed
	done    chan struct{}
	closing sync.Once

	pending atomic.Int64 // listed connections waiting for their header
	refused atomic.Uint64
}

// ParseCIDRs parses "CIDR,CIDR,..." (a bare address is its /32 or /128).
func ParseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("proxied: %q is no address or CIDR", f)
			}
			f = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()).String()
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("proxied: %q is no CIDR: %w", f, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// New starts accepting on ln. Close the Listener to stop (it closes ln).
func New(ln net.Listener, o Options) (*Listener, error) {
	if len(o.Trusted) == 0 {
		return nil, errors.New("proxied: no trusted balancer addresses (an empty list trusts no one; leave PROXY protocol off instead)")
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Pending <= 0 {
		o.Pending = 1024
	}
	l := &Listener{ln: ln, o: o, ready: make(chan net.Conn), failed: make(chan struct{}), done: make(chan struct{})}
	go l.acceptLoop()
	return l, nil
}

// Accept implements net.Listener: the next connection whose header (if
// it must have one) was read and accepted, or an unlisted peer's, at once.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.failed:
		return nil, l.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *Listener) Close() error {
	var err error
	l.closing.Do(func() {
		close(l.done)
		err = l.ln.Close()
	})
	return err
}

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Refused counts the refused connections.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Pending is how many listed balancers' connections wait for their
// header now.
func (l *Listener) Pending() int { return int(l.pending.Load()) }

func (l *Listener) acceptLoop() {
	backoff := 5 * time.Millisecond
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			if !errors.Is(err, net.ErrClosed) { // out of file descriptors and the like: wait, as net/http does
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
				continue
			}
			l.err = err
			close(l.failed)
			return
		}
		backoff = 5 * time.Millisecond
		if !l.trusted(addrOf(c.RemoteAddr())) {
			l.hand(c, newStranger(c, l))
			continue
		}
		if l.pending.Add(1) > int64(l.o.Pending) {
			l.pending.Add(-1)
			l.refuse(c, attest.ReasonProxyQueueFull, errors.New("too many balancer connections waiting for their PROXY header"))
			continue
		}
		go l.handshake(c)
	}
}

// hand passes conn (over raw) to Accept, or closes raw when the listener
// closes first.
func (l *Listener) hand(raw, conn net.Conn) {
	select {
	case l.ready <- conn:
	case <-l.done:
		raw.Close()
	}
}

// handshake reads a listed balancer's connection's header and hands c on.
func (l *Listener) handshake(c net.Conn) {
	pc := proxyproto.NewConn(c, proxyproto.WithPolicy(proxyproto.REQUIRE), proxyproto.SetReadHeaderTimeout(l.o.Timeout))
	// A read of nothing runs the header state machine once and returns
	// its verdict; the bytes it peeked stay buffered for the reader.
	_, err := pc.Read(nil)
	l.pending.Add(-1)
	if err != nil {
		reason := attest.ReasonProxyHeaderInvalid
		if errors.Is(err, proxyproto.ErrNoProxyProtocol) {
			reason = attest.ReasonProxyHeaderMissing
		}
		l.refuse(c, reason, err)
		return
	}
	var conn net.Conn = pc
	if h := pc.ProxyHeader(); h != nil {
		if _, tcp := h.SourceAddr.(*net.TCPAddr); !tcp {
			// LOCAL (a health check), v1 UNKNOWN, or a non-TCP
			// source: the connection is the balancer's own.
			conn = peerConn{Conn: pc, peer: c.RemoteAddr()}
		}
	}
	l.hand(c, conn)
}

// peerConn is a proxied connection that carried no client address: its
// RemoteAddr is its TCP peer's.
type peerConn struct {
	net.Conn
	peer net.Addr
}

func (c peerConn) RemoteAddr() net.Addr { return c.peer }

// stranger is an unlisted peer's connection, handed on before any of it
// is read: its addresses are its socket's, and its first read or write
// checks that it does not begin with a PROXY header (a refusal: the
// connection is closed, and the read returns the error). The check
// waits for bytes under the deadlines its reader sets (the TLS handshake
// timeout, the HTTP header timeout), not a timeout of its own.
type stranger struct {
	pc  net.Conn // a *proxyproto.Conn with policy REJECT, over raw
	raw net.Conn
	l   *Listener

	once sync.Once
	err  error
}

func newStranger(raw net.Conn, l *Listener) *stranger {
	return &stranger{pc: proxyproto.NewConn(raw, proxyproto.WithPolicy(proxyproto.REJECT)), raw: raw, l: l}
}

// check reads as far as a PROXY signature could go.
func (c *stranger) check() {
	_, err := c.pc.Read(nil)
	if err == nil {
		return
	}
	c.err = err
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, net.ErrClosed) {
		return // the connection's own failure (a deadline, a reset), no header
	}
	// A header, or bytes that begin like one and do not parse.
	c.l.refuse(c.raw, attest.ReasonProxyHeaderUntrusted, err)
	c.err = fmt.Errorf("proxied: %s: %w", attest.ReasonProxyHeaderUntrusted, err)
}

func (c *stranger) Read(b []byte) (int, error) {
	if c.once.Do(c.check); c.err != nil {
		return 0, c.err
	}
	return c.pc.Read(b)
}

func (c *stranger) Write(b []byte) (int, error) {
	if c.once.Do(c.check); c.err != nil {
		return 0, c.err
	}
	return c.pc.Write(b)
}

func (c *stranger) Close() error                       { return c.raw.Close() }
func (c *stranger) LocalAddr() net.Addr                { return c.raw.LocalAddr() }
func (c *stranger) RemoteAddr() net.Addr               { return c.raw.RemoteAddr() }
func (c *stranger) SetDeadline(t time.Time) error      { return c.pc.SetDeadline(t) }
func (c *stranger) SetReadDeadline(t time.Time) error  { return c.pc.SetReadDeadline(t) }
func (c *stranger) SetWriteDeadline(t time.Time) error { return c.pc.SetWriteDeadline(t) }

func (l *Listener) refuse(c net.Conn, reason attest.Reason, err error) {
	l.refused.Add(1)
	c.Close()
	if l.o.OnRefuse != nil {
		l.o.OnRefuse(Refusal{Peer: c.RemoteAddr(), Reason: reason, Err: err})
	}
}

func (l *Listener) trusted(a netip.Addr) bool {
	for _, p := range l.o.Trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// addrOf is a TCP peer's IP, unmapped (an IPv4 peer on a dual-stack
// socket is matched against IPv4 CIDRs).
func addrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(t.IP); ok {
			return ip.Unmap()
		}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
