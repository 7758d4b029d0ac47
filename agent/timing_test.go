package agent

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestServerTimingHeader(t *testing.T) {
	for _, c := range []struct {
		name   string
		header []string
		want   time.Duration
	}{
		{"nodeproof's", []string{"app;dur=12.5"}, 12500 * time.Microsecond},
		{"among others", []string{"db;dur=3, app;desc=\"x\";dur=7"}, 7 * time.Millisecond},
		{"absent", nil, 0},
		{"another metric only", []string{"cache;dur=9"}, 0},
		{"not a number", []string{"app;dur=soon"}, 0},
		{"negative", []string{"app;dur=-5"}, 0},
		{"an hour and more", []string{"app;dur=99999999"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range c.header {
				h.Add("Server-Timing", v)
			}
			if got := serverTiming(h); got != c.want {
				t.Errorf("%v: %v; want %v", c.header, got, c.want)
			}
		})
	}
}

// TestTimingSplit: a round trip is split into the server's share (its
// Server-Timing) and the network's (the rest, until the body was read);
// a server that claims more than the round trip gets the round trip.
func TestTimingSplit(t *testing.T) {
	claim := "app;dur=40"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		w.Header().Set("Server-Timing", claim)
		w.Write([]byte("answer"))
	}))
	defer srv.Close()
	var tm Timing
	c := &http.Client{Transport: tm.Transport(nil)}
	get := func() {
		resp, err := c.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	get()
	_, network, server, n := tm.Split()
	if n != 1 || server != 40*time.Millisecond || network < 10*time.Millisecond-time.Millisecond {
		t.Errorf("network %v, server %v, %d requests; want the server's 40ms and at least the 10ms it did not claim as network", network, server, n)
	}
	claim = "app;dur=100000"
	get()
	_, network2, server2, n := tm.Split()
	if n != 2 || network2 != network || server2 <= server {
		t.Errorf("a server claiming more than the round trip: network %v (was %v), server %v; want the round trip as the server's", network2, network, server2)
	}
	tm.AddTPM(time.Second)
	if tp, _, _, _ := tm.Split(); tp != time.Second {
		t.Errorf("TPM %v", tp)
	}
}
