// Package metrics is the one Prometheus setup of nodeproof's long-running
// commands (serve, approve): a registry with Go's runtime and process
// collectors beside the command's own metrics, served on /metrics with a
// /healthz that answers ok, on an address of its own (never the ports
// machines reach).
package metrics

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry is a registry with the Go runtime and process collectors;
// the command registers its own metrics on it (mcs.NewMetrics,
// approver.NewMetrics).
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Serve serves reg on /metrics, and /healthz, at addr (":9090",
// "127.0.0.1:0") until stop is called; it returns the address it listens
// on. Requests are bounded in time (a scraper that stalls holds nothing
// for long).
func Serve(addr string, reg *prometheus.Registry) (bound net.Addr, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second}
	go srv.Serve(ln)
	return ln.Addr(), func() { srv.Close() }, nil
}
