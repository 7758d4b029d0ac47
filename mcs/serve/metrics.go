package serve

import (
	"crypto/x509"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeproof/nodeproof/identity/anchors"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/limit"
	"github.com/nodeproof/nodeproof/mcs/proxied"
	"github.com/nodeproof/nodeproof/metrics"
	"github.com/nodeproof/nodeproof/pemcert"
)

// serverMetrics are the server's registry and request metrics
// (mcs.NewMetrics), the Go and process collectors, and what the
// listeners and certificates say at each scrape:
//
//	nodeproof_server_connections_refused_total{port,by}         limit: per-source connection limits; proxy: PROXY protocol refusals
//	nodeproof_server_certificate_expiry_timestamp_seconds{cert}  serving: the served certificate's notAfter; ca: the newest CA's
//	nodeproof_trust_anchor_expiry_timestamp_seconds{kind,role,subject,serial}  the cloud kinds' roots, intermediates and Region certificates (identity/anchors)
func serverMetrics() (*prometheus.Registry, *mcs.Metrics, error) {
	reg := metrics.NewRegistry()
	m, err := mcs.NewMetrics(reg)
	return reg, m, err
}

// listenerMetrics registers the refusal counters of the ports' listeners.
func listenerMetrics(reg prometheus.Registerer, p *ports) error {
	refused := func(port, by string, f func() uint64) error {
		return reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nodeproof_server_connections_refused_total", Help: "Connections closed at accept: by the per-source connection limits (limit) or the PROXY protocol checks (proxy).",
			ConstLabels: prometheus.Labels{"port": port, "by": by},
		}, func() float64 { return float64(f()) }))
	}
	for i, name := range []string{"secure", "insecure"} {
		if i >= len(p.raw) {
			break
		}
		for _, ln := range p.raw[i] {
			var err error
			switch l := ln.(type) {
			case *limit.Listener:
				err = refused(name, "limit", l.Refused)
			case *proxied.Listener:
				err = refused(name, "proxy", l.Refused)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// certMetrics registers the certificates' expiry gauges: the one served
// now, and the newest CA of the bundle machines are given (none with
// --cert and no --ca-bundle).
func certMetrics(reg prometheus.Registerer, r certs.Served, bundle func() ([]byte, error)) error {
	expiry := func(cert string, f func() float64) error {
		return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nodeproof_server_certificate_expiry_timestamp_seconds", Help: "When a certificate expires (Unix seconds): serving, the one served now; ca, the newest CA in the bundle machines are given (nodeproof rotates it at 80% of its life).",
			ConstLabels: prometheus.Labels{"cert": cert},
		}, f))
	}
	if err := expiry("serving", func() float64 {
		if tc := r.Certificate(); tc != nil && len(tc.Certificate) > 0 {
			if c, err := x509.ParseCertificate(tc.Certificate[0]); err == nil {
				return float64(c.NotAfter.Unix())
			}
		}
		return 0
	}); err != nil {
		return err
	}
	return expiry("ca", func() float64 {
		b, err := bundle()
		if err != nil || len(b) == 0 {
			return 0
		}
		cs, err := pemcert.Parse(b)
		if err != nil {
			return 0
		}
		var newest time.Time
		for _, c := range cs {
			if c.IsCA && c.NotAfter.After(newest) {
				newest = c.NotAfter
			}
		}
		return float64(newest.Unix())
	})
}

// anchorMetrics registers the expiry of the certificates the cloud
// evidence kinds trust: the GCE vTPM roots (pinned, or --gce-vtpm-roots')
// and intermediates (shipped, and --gce-vtpm-intermediates-dir's), the
// Nitro root (or --nitrotpm-roots'), Azure's vTPM and IMDS roots and
// intermediates (pinned and shipped, or the --azure-* flags'), and the AWS Region certificates of
// --aws-certs-dir (else the shipped ones). They are exported whatever the
// policy takes, since a reload may start taking a kind.
func (c Config) anchorMetrics(reg prometheus.Registerer) error {
	as, err := c.trustAnchors()
	if err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}
	return anchors.Register(reg, as)
}

// trustAnchors lists what anchorMetrics exports, read as the verifiers
// read their flags but without checking any against a time.
func (c Config) trustAnchors() ([]anchors.Anchor, error) {
	regions, err := c.awsRegionCerts()
	if err != nil {
		return nil, err
	}
	as, err := anchors.Cloud(regions)
	if err != nil {
		return nil, err
	}
	for _, row := range builders {
		if row.anchors == nil {
			continue
		}
		if as, err = row.anchors(c, as); err != nil {
			return nil, err
		}
	}
	return as, nil
}
