// Package proxied accepts connections that a load balancer (haproxy in
// front of port 22623 on bare metal) forwards with a PROXY protocol header
// (v1 or v2, parsed by github.com/pires/go-proxyproto), so that the
// server sees each machine's own address: per-source limits, logs and
// Events use the client address from the header.
//
// Checks, per accepted connection:
//   - its TCP peer is in Options.Trusted: the connection must begin with
//     a PROXY header (v1 or v2), else it is refused (a balancer that
//     forgot send-proxy would make every machine one source); a header
//     without a TCP client address (v2 LOCAL, as haproxy's health checks
//     send; v1 UNKNOWN; a Unix socket) keeps the peer's address;
//   - any other peer: a PROXY header is refused (an attacker forging its
//     address to get a fresh limit bucket or a misleading log); without
//     one the connection is served as it is, with the peer's address;
//   - the header is read within Options.Timeout, or the connection is
//     refused (a trusted peer) or served as headerless (any other peer);
//   - the header is read in the connection's own goroutine, so a slow
//     client holds up no one else's accept; at most Options.Pending
//     connections wait for their header at once, and at most
//     Options.PendingPerSource from one TCP peer outside Trusted (more
//     are closed at once): a flood of idle connections cannot fill the
//     queue that real machines need.
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
)

// Reasons for a refusal (Refusal.Reason).
const (
	// ReasonHeaderMissing: a trusted peer sent no PROXY header.
	ReasonHeaderMissing = "ProxyHeaderMissing"
	// ReasonHeaderUntrusted: a peer outside Trusted sent a PROXY header.
	ReasonHeaderUntrusted = "ProxyHeaderUntrusted"
	// ReasonHeaderInvalid: a trusted peer's header did not parse.
	ReasonHeaderInvalid = "ProxyHeaderInvalid"
	// ReasonPending: too many connections were waiting for their header.
	ReasonPending = "ProxyHeaderQueueFull"
)

// Refusal is one refused connection.
type Refusal struct {
	Peer   net.Addr
	Reason string
	Err    error
}

// Options configure a Listener.
type Options struct {
	// Trusted are the balancers' addresses: only they may (and must) send
	// a PROXY header. Empty is refused by New: trust must be named.
	Trusted []netip.Prefix
	// Timeout bounds the wait for a header (0: 5 s).
	Timeout time.Duration
	// Pending bounds the connections waiting for their header at once
	// (0: 1024); PendingPerSource bounds those of one untrusted peer
	// (0: 64).
	Pending, PendingPerSource int
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

	mu      sync.Mutex
	pending map[string]int // by untrusted peer
	total   int

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
	if o.PendingPerSource <= 0 {
		o.PendingPerSource = 64
	}
	l := &Listener{ln: ln, o: o, ready: make(chan net.Conn), failed: make(chan struct{}), done: make(chan struct{}), pending: map[string]int{}}
	go l.acceptLoop()
	return l, nil
}

// Accept implements net.Listener: the next connection whose header (if
// it must or may have one) was read and accepted.
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
		peer := addrOf(c.RemoteAddr())
		trusted := l.trusted(peer)
		if !l.take(peer, trusted) {
			l.refuse(c, ReasonPending, errors.New("too many connections waiting for their PROXY header"))
			continue
		}
		go l.handshake(c, peer, trusted)
	}
}

// handshake reads c's header, if it may have one, and hands c on.
func (l *Listener) handshake(c net.Conn, peer netip.Addr, trusted bool) {
	defer l.give(peer, trusted)
	policy := proxyproto.REJECT
	if trusted {
		policy = proxyproto.REQUIRE
	}
	pc := proxyproto.NewConn(c, proxyproto.WithPolicy(policy), proxyproto.SetReadHeaderTimeout(l.o.Timeout))
	// A read of nothing runs the header state machine once and returns
	// its verdict; the bytes it peeked stay buffered for the reader.
	if _, err := pc.Read(nil); err != nil {
		reason := ReasonHeaderInvalid
		switch {
		case errors.Is(err, proxyproto.ErrSuperfluousProxyHeader):
			reason = ReasonHeaderUntrusted
		case errors.Is(err, proxyproto.ErrNoProxyProtocol):
			reason = ReasonHeaderMissing
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
	select {
	case l.ready <- conn:
	case <-l.done:
		c.Close()
	}
}

// peerConn is a proxied connection that carried no client address: its
// RemoteAddr is its TCP peer's.
type peerConn struct {
	net.Conn
	peer net.Addr
}

func (c peerConn) RemoteAddr() net.Addr { return c.peer }

func (l *Listener) refuse(c net.Conn, reason string, err error) {
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

func (l *Listener) take(peer netip.Addr, trusted bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= l.o.Pending {
		return false
	}
	if !trusted {
		k := peer.String()
		if l.pending[k] >= l.o.PendingPerSource {
			return false
		}
		l.pending[k]++
	}
	l.total++
	return true
}

func (l *Listener) give(peer netip.Addr, trusted bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if !trusted {
		k := peer.String()
		if l.pending[k]--; l.pending[k] <= 0 {
			delete(l.pending, k)
		}
	}
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
