package limit

import (
	"net"
	"sync"
	"sync/atomic"
)

// ListenerOptions bound what one source address may hold open.
type ListenerOptions struct {
	// MaxConnsPerSource caps the connections one source (SourceKey) has
	// open at once; 0: no cap. It bounds what a slowloris or slow-reading
	// client can pin: goroutines, buffers, file descriptors.
	MaxConnsPerSource int
	// NewConns limits the rate of new connections per source; off: no
	// limit. Each new TLS connection costs a handshake; a refused one costs
	// an accept and a close.
	NewConns *Buckets
}

// Listener wraps a net.Listener: a connection over its source's limits is
// closed as soon as it is accepted, before the TLS handshake (wrap this
// listener with tls.NewListener, not the other way round). Accept returns
// only connections within the limits.
type Listener struct {
	net.Listener
	o ListenerOptions

	mu      sync.Mutex
	open    map[string]int
	refused atomic.Uint64
}

// NewListener limits ln.
func NewListener(ln net.Listener, o ListenerOptions) *Listener {
	return &Listener{Listener: ln, o: o, open: map[string]int{}}
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := SourceKey(c.RemoteAddr().String())
		if ok, _ := l.o.NewConns.Allow(key); !ok || !l.take(key) {
			l.refused.Add(1)
			c.Close()
			continue
		}
		return &conn{Conn: c, release: func() { l.give(key) }}, nil
	}
}

func (l *Listener) take(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.o.MaxConnsPerSource > 0 && l.open[key] >= l.o.MaxConnsPerSource {
		return false
	}
	l.open[key]++
	return true
}

func (l *Listener) give(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

// Refused counts the connections closed at accept for being over a limit.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Open is how many connections source key has open.
func (l *Listener) Open(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[key]
}

// conn gives its slot back once, on the first Close.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
