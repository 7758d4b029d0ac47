package serve

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/limit"
)

// LimitConfig is how much one source address or identity may ask of
// `nodeproof serve` (flags --limit-*). Rates are "PER_SECOND/BURST"; "0"
// turns one off.
//
// The defaults let a thousand machines behind one NAT or load balancer
// that hides their addresses provision at once (they are refused for a
// moment and retry, as 503 with Retry-After tells them) while a single
// flooding address gets a small share: its refusals cost an accept and a
// close (connections) or a parse and a 503 (requests), not a handshake, a
// signature check or a store write.
type LimitConfig struct {
	AttestPerSource   string
	ConfigPerSource   string
	PerIdentity       string
	NewConnsPerSource string
	// UnauthenticatedReports and UnauthenticatedReportBytes bound the
	// failure reports recorded as unauthenticated (anyone may send one):
	// reports, and bytes of their Events, per source address and per node
	// name.
	UnauthenticatedReports, UnauthenticatedReportBytes string
	ConnsPerSource                                     int
	InFlight                                           int
	InFlightWait                                       time.Duration
	// ReadHeaderTimeout bounds how long a client may take to send its
	// request headers (slowloris).
	ReadHeaderTimeout time.Duration
}

// DefaultLimits are serve's flag defaults. (The zero LimitConfig limits
// nothing: for programs embedding Serve that bring their own.)
func DefaultLimits() LimitConfig {
	return LimitConfig{
		AttestPerSource: "50/200", ConfigPerSource: "50/200", PerIdentity: "0.1/6", NewConnsPerSource: "100/400",
		UnauthenticatedReports: "0.02/5", UnauthenticatedReportBytes: "8/4096",
		ConnsPerSource: 256, InFlight: 64, InFlightWait: 10 * time.Second, ReadHeaderTimeout: 10 * time.Second,
	}
}

// ParseRate parses "PER_SECOND/BURST" ("20/100"), "PER_SECOND" (burst:
// one second's worth, at least 1) or "0"/"" (off).
func ParseRate(s string) (limit.Rate, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return limit.Rate{}, nil
	}
	rs, bs, hasBurst := strings.Cut(s, "/")
	r, err := strconv.ParseFloat(rs, 64)
	if err != nil || r < 0 || math.IsInf(r, 0) || math.IsNaN(r) {
		return limit.Rate{}, fmt.Errorf("rate %q: want PER_SECOND/BURST, e.g. 20/100", s)
	}
	burst := max(1, int(math.Ceil(r)))
	if hasBurst {
		if burst, err = strconv.Atoi(bs); err != nil || burst < 1 {
			return limit.Rate{}, fmt.Errorf("rate %q: the burst must be a whole number of at least 1", s)
		}
	}
	if r == 0 {
		return limit.Rate{}, nil
	}
	return limit.Rate{PerSecond: r, Burst: burst}, nil
}

// minReportBytesBurst is the least burst of
// --limit-unauthenticated-report-bytes: the longest unauthenticated
// report's Event (a 253-byte node name, 256 bytes of detail, the reason,
// the pool and the address in about 150 bytes of text) fits.
const minReportBytesBurst = 1024

// limits builds the server's request limits and the listener options.
func (c LimitConfig) limits(clock func() time.Time) (mcs.Limits, limit.ListenerOptions, error) {
	var errs []error
	rate := func(flag, v string) limit.Rate {
		r, err := ParseRate(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", flag, err))
		}
		return r
	}
	buckets := func(flag, v string) *limit.Buckets {
		r := rate(flag, v)
		if !r.On() {
			return nil
		}
		return limit.NewBuckets(r, 0, clock)
	}
	l := mcs.Limits{
		AttestPerSource: buckets("limit-attest-per-source", c.AttestPerSource),
		ConfigPerSource: buckets("limit-config-per-source", c.ConfigPerSource),
		PerIdentity:     buckets("limit-per-identity", c.PerIdentity),
		Attestations:    limit.NewGate(c.InFlight, c.InFlightWait),

		UnauthenticatedReports:     buckets("limit-unauthenticated-reports", c.UnauthenticatedReports),
		UnauthenticatedReportBytes: buckets("limit-unauthenticated-report-bytes", c.UnauthenticatedReportBytes),
	}
	if r, err := ParseRate(c.UnauthenticatedReportBytes); err == nil && r.On() && r.Burst < minReportBytesBurst {
		errs = append(errs, fmt.Errorf("--limit-unauthenticated-report-bytes: a burst of %d cannot hold one report's Event; at least %d", r.Burst, minReportBytesBurst))
	}
	lo := limit.ListenerOptions{
		MaxConnsPerSource: c.ConnsPerSource,
		NewConns:          buckets("limit-new-conns-per-source", c.NewConnsPerSource),
	}
	if c.ConnsPerSource < 0 || c.InFlight < 0 {
		errs = append(errs, errors.New("--limit-conns-per-source and --limit-attestations-in-flight must not be negative"))
	}
	return l, lo, errors.Join(errs...)
}
