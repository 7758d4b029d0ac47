package gcp

import (
	"net/http"
	"testing"
	"time"
)

func TestCacheTTL(t *testing.T) {
	for _, c := range []struct {
		cc, age string
		want    time.Duration
	}{
		{"", "", DefaultKeyTTL},
		{"public, max-age=19845, must-revalidate, no-transform", "", 19845 * time.Second},
		{"public, max-age=600", "100", 500 * time.Second},
		{"max-age=600", "900", 0},
		{"max-age=9999999", "", 24 * time.Hour},
		{"no-store", "", 0},
		{"max-age=600, no-cache", "", 0},
		{"max-age=abc", "", 0},
		{"max-age=-5", "", 0},
		{`max-age="60"`, "", time.Minute},
	} {
		h := http.Header{}
		if c.cc != "" {
			h.Set("Cache-Control", c.cc)
		}
		if c.age != "" {
			h.Set("Age", c.age)
		}
		if got := cacheTTL(h); got != c.want {
			t.Errorf("Cache-Control %q Age %q: %s, want %s", c.cc, c.age, got, c.want)
		}
	}
}
