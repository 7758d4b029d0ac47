package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/limit"
	"github.com/nodeproof/nodeproof/mcs/proxied"
)

// ports are the server's listening ports.
type ports struct {
	secure, insecure net.Addr // insecure: nil when off
	servers          []*http.Server
	listeners        []net.Listener
	// raw are each port's listeners under TLS, outermost last: the
	// PROXY protocol's and the limits' (for their refusal counts).
	raw [][]net.Listener
}

// bound are the ports, bound before anything else is done at start (before
// cluster mode takes the leader Lease or writes a certificate or token to
// the cluster): a server that cannot have its ports changes nothing.
type bound struct {
	secure, insecure net.Listener // insecure: nil when off
}

// bindPorts binds the secure port and, unless off, the plain one.
func (c Config) bindPorts() (*bound, error) {
	secureLn, err := c.bind(c.SecurePort, "secure")
	if err != nil {
		return nil, fmt.Errorf("serve: the secure port: %w", err)
	}
	b := &bound{secure: secureLn}
	if c.InsecurePort != 0 {
		if b.insecure, err = c.bind(c.InsecurePort, "insecure"); err != nil {
			secureLn.Close()
			return nil, fmt.Errorf("serve: the insecure port: %w", err)
		}
	}
	return b, nil
}

// close releases ports not yet served.
func (b *bound) close() {
	b.secure.Close()
	if b.insecure != nil {
		b.insecure.Close()
	}
}

// listen puts TLS on the secure port and the per-source connection limits
// in front of both.
func (c Config) listen(b *bound, srv *mcs.Server, tlsConf *tls.Config, conns limit.ListenerOptions) *ports {
	secureLim := limitListener(b.secure, conns)
	p := &ports{
		secure:    b.secure.Addr(),
		servers:   []*http.Server{newHTTPServer(srv.Handler(mcs.Secure), c.Limits.ReadHeaderTimeout, c.Log)},
		listeners: []net.Listener{tls.NewListener(secureLim, tlsConf)},
		raw:       [][]net.Listener{{b.secure, secureLim}},
	}
	if ln := b.insecure; ln != nil {
		p.insecure = ln.Addr()
		p.servers = append(p.servers, newHTTPServer(srv.Handler(mcs.Insecure), c.Limits.ReadHeaderTimeout, c.Log))
		lim := limitListener(ln, conns)
		p.listeners = append(p.listeners, lim)
		p.raw = append(p.raw, []net.Listener{ln, lim})
	}
	return p
}

// bind listens on port, behind the PROXY protocol when it is on: a
// listed balancer's header is read before the per-source limits, so they
// count each machine behind it apart; an unlisted peer's connection
// reaches them at once, before any of its bytes is read.
func (c Config) bind(port int, name string) (net.Listener, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(c.Listen, fmt.Sprint(port)))
	if err != nil || len(c.ProxyProtocolFrom) == 0 {
		return ln, err
	}
	pl, err := proxied.New(ln, proxied.Options{Trusted: c.ProxyProtocolFrom, OnRefuse: func(r proxied.Refusal) {
		c.Log.Warn("connection refused", "port", name, "remote", r.Peer.String(), "reason", r.Reason, "err", r.Err.Error())
	}})
	if err != nil {
		ln.Close()
	}
	return pl, err
}

// serve serves both ports until ctx ends or a listener fails, then shuts
// down, giving requests in flight 10 s.
func (p *ports) serve(ctx context.Context, log *slog.Logger) {
	errc := make(chan error, len(p.servers))
	for i := range p.servers {
		go func(s *http.Server, ln net.Listener) { errc <- s.Serve(ln) }(p.servers[i], p.listeners[i])
	}
	why := "asked to stop"
	select {
	case <-ctx.Done():
	case err := <-errc:
		why = "a listener failed"
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error("listener failed", "err", err.Error())
		}
	}
	log.Info("shutting down: requests in flight get 10 s", "why", why)
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	clean := true
	for _, s := range p.servers {
		if err := s.Shutdown(shutdown); err != nil {
			clean = false
			log.Warn("shutdown: requests still in flight were cut", "err", err.Error())
		}
	}
	log.Info("stopped", "clean", clean)
}

// close releases the ports without serving.
func (p *ports) close() {
	for _, ln := range p.listeners {
		ln.Close()
	}
}

// newHTTPServer bounds everything a client controls: header size and the
// time to send headers (readHeader; 0: 10 s) and body; HTTP/1.1 only.
func newHTTPServer(h http.Handler, readHeader time.Duration, log *slog.Logger) *http.Server {
	if readHeader <= 0 {
		readHeader = 10 * time.Second
	}
	s := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeader,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      2 * time.Minute,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    32 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	s.Protocols = new(http.Protocols)
	s.Protocols.SetHTTP1(true)
	return s
}

// limitListener applies the per-source connection limits to ln (before
// TLS: wrap the result with tls.NewListener).
func limitListener(ln net.Listener, o limit.ListenerOptions) net.Listener {
	if o.MaxConnsPerSource == 0 && o.NewConns == nil {
		return ln
	}
	return limit.NewListener(ln, o)
}

// serveDebug serves pprof on addr until the returned function is called.
func serveDebug(addr string) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("debug: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go s.Serve(ln)
	return func() { s.Close() }, nil
}
