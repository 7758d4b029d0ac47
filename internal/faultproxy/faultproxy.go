// Package faultproxy is a TCP proxy for fault tests: it stands between
// clients and a real server (a kube-apiserver, say) and can make the
// server unreachable and reachable again, the way a crashed process or a
// network partition looks from the client's side.
//
// Cut closes every proxied connection and closes the listening socket, so
// new connections are refused (ECONNREFUSED, as for a server that is
// down); Restore listens again on the same address. CutAfter cuts one
// connection in the middle of what the server sends. Nothing is simulated
// above TCP: the bytes between client and server are the real protocol.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/freeport"
)

// Proxy forwards TCP connections from Addr to a target.
type Proxy struct {
	target string
	addr   string

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	// cutAfter, when positive, is how many bytes the next connection
	// passes from the server before it is cut (CutAfter).
	cutAfter int64
	wg       sync.WaitGroup
}

// CutAfter arms a cut for the next connection: once the server has sent n
// bytes on it (TLS records included), both sides are closed, as a network
// or a load balancer dropping a connection mid-response does. Later
// connections pass untouched.
func (p *Proxy) CutAfter(n int64) {
	p.mu.Lock()
	p.cutAfter = n
	p.mu.Unlock()
}

// New starts a proxy on a random loopback port forwarding to target
// (host:port). It stops when the test ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := Start("127.0.0.1:0", target)
	if err != nil {
		t.Fatalf("faultproxy: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// Start starts a proxy listening on listen (host:port) forwarding to
// target. Close stops it. Port 0 picks one below the kernel's ephemeral
// range (freeport): Cut gives the port up until Restore, and a port from
// ":0" could be taken meanwhile by any concurrent test's ":0" or outgoing
// connection.
func Start(listen, target string) (*Proxy, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	var ln net.Listener
	if port == "0" {
		ln, err = freeport.Listen(host)
	} else {
		ln, err = net.Listen("tcp", listen)
	}
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	return p, nil
}

// Addr is where clients connect (host:port); it stays the same across Cut
// and Restore.
func (p *Proxy) Addr() string { return p.addr }

// Cut makes the target unreachable: open connections are closed and new
// ones refused until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
}

// Restore listens again after Cut. The address is reused; if another
// process took the port meanwhile, Restore returns the error.
func (p *Proxy) Restore() error {
	p.mu.Lock()
	if p.ln != nil || p.closed {
		p.mu.Unlock()
		return nil
	}
	p.mu.Unlock()
	var ln net.Listener
	var err error
	// The port was ours a moment ago; the kernel may take a moment to let
	// it go.
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("faultproxy: listen again on %s: %w", p.addr, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		ln.Close()
		return nil
	}
	p.serve(ln)
	return nil
}

// Close stops the proxy for good and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Cut()
	p.wg.Wait()
}

// serve accepts on ln; p.mu is held by the caller or ln is new.
func (p *Proxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed by Cut or Close
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.forward(c)
			}()
		}
	}()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		c.Close() // cut while this connection was being set up
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) forward(client net.Conn) {
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	p.mu.Lock()
	budget := p.cutAfter
	p.cutAfter = 0
	p.mu.Unlock()
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if err == nil || errors.Is(err, net.ErrClosed) {
			if tc, ok := dst.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
		}
		done <- struct{}{}
	}
	go pipe(server, client)
	if budget > 0 {
		go func() {
			io.CopyN(client, server, budget)
			client.Close() // cut: no orderly end
			server.Close()
			done <- struct{}{}
		}()
	} else {
		go pipe(client, server)
	}
	<-done
	// One side finished: close both, so the other copy ends too.
	client.Close()
	server.Close()
	<-done
}
