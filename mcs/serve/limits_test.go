package serve

import (
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/mcs/limit"
)

func TestParseRate(t *testing.T) {
	cases := []struct {
		name, in string
		want     limit.Rate
		wantErr  bool
	}{
		{"rate and burst", "20/100", limit.Rate{PerSecond: 20, Burst: 100}, false},
		{"rate alone: a second's worth of burst", "20", limit.Rate{PerSecond: 20, Burst: 20}, false},
		{"a slow rate has a burst of one", "0.1", limit.Rate{PerSecond: 0.1, Burst: 1}, false},
		{"zero is off", "0", limit.Rate{}, false},
		{"empty is off", "", limit.Rate{}, false},
		{"zero rate with a burst is off", "0/5", limit.Rate{}, false},
		{"negative", "-1/5", limit.Rate{}, true},
		{"not a number", "fast", limit.Rate{}, true},
		{"burst zero", "5/0", limit.Rate{}, true},
		{"burst not whole", "5/2.5", limit.Rate{}, true},
		{"infinite", "Inf/5", limit.Rate{}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRate(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("ParseRate(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestLimits: DefaultLimits (serve's flag defaults) build with every limit
// on; a bad value is an error naming its flag; the zero config limits
// nothing.
func TestLimits(t *testing.T) {
	c := DefaultLimits()
	l, lo, err := c.limits(time.Now)
	if err != nil || l.AttestPerSource == nil || l.ConfigPerSource == nil || l.PerIdentity == nil || l.Attestations == nil ||
		l.UnauthenticatedReports == nil || l.UnauthenticatedReportBytes == nil || lo.NewConns == nil || lo.MaxConnsPerSource == 0 {
		t.Fatalf("defaults build %+v %+v %v; want every limit on", l, lo, err)
	}
	c.PerIdentity = "often"
	if _, _, err := c.limits(time.Now); err == nil || !strings.Contains(err.Error(), "--limit-per-identity") {
		t.Fatalf("a bad rate: %v; want an error naming --limit-per-identity", err)
	}
	// A byte budget whose burst cannot hold one report's Event would
	// refuse every unauthenticated report.
	c = DefaultLimits()
	c.UnauthenticatedReportBytes = "8/512"
	if _, _, err := c.limits(time.Now); err == nil || !strings.Contains(err.Error(), "--limit-unauthenticated-report-bytes") {
		t.Fatalf("a report byte burst of 512: %v; want an error naming --limit-unauthenticated-report-bytes", err)
	}
	l, lo, err = LimitConfig{}.limits(time.Now)
	if err != nil || l.AttestPerSource != nil || l.ConfigPerSource != nil || l.PerIdentity != nil || l.Attestations != nil ||
		l.UnauthenticatedReports != nil || l.UnauthenticatedReportBytes != nil || lo.NewConns != nil || lo.MaxConnsPerSource != 0 {
		t.Fatalf("the zero config limits something: %+v %+v %v", l, lo, err)
	}
}
