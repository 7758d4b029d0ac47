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

// listen binds the secure port (TLS) and, unless off, the plain one, with
// the per-source connection limits in front of both.
func (c Config) listen(srv *mcs.Server, tlsConf *tls.Config, conns limit.ListenerOptions) (*ports, error) {
	secureLn, err := c.bind(c.SecurePort, "secure")
	if err != nil {
		return nil, err
	}
	secureLim := limitListener(secureLn, conns)
	p := &ports{
		secure:    secureLn.Addr(),
		servers:   []*http.Server{newHTTPServer(srv.Handler(mcs.Secure), c.Limits.ReadHeaderTimeout, c.Log)},
		listeners: []net.Listener{tls.NewListener(secureLim, tlsConf)},
		raw:       [][]net.Listener{{secureLn, secureLim}},
	}
	if c.InsecurePort != 0 {
		ln, err := c.bind(c.InsecurePort, "insecure")
		if err != nil {
			secureLn.Close()
			return nil, err
		}
		p.insecure = ln.Addr()
		p.servers = append(p.servers, newHTTPServer(srv.Handler(mcs.Insecure), c.Limits.ReadHeaderTimeout, c.Log))
		lim := limitListener(ln, conns)
		p.listeners = append(p.listeners, lim)
		p.raw = append(p.raw, []net.Listener{ln, lim})
	}
	return p, nil
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
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error("listener failed", "err", err.Error())
		}
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, s := range p.servers {
		s.Shutdown(shutdown)
	}
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
