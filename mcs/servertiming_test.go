package mcs_test

import (
	"net/http"
	"regexp"
	"testing"
)

// TestServerTiming: every answer, served or refused, says how long the
// server worked on it (Server-Timing app;dur=<ms>), which the agent uses
// to split its time between the network and the server.
func TestServerTiming(t *testing.T) {
	e := newEnv(t)
	re := regexp.MustCompile(`^app;dur=[0-9]+\.[0-9]{3}$`)
	for _, c := range []struct{ name, method, path string }{
		{"healthz", http.MethodGet, "/healthz"},
		{"public tier", http.MethodGet, "/config/worker"},
		{"a refusal", http.MethodPost, "/attest/v1/verify"},
		{"not found", http.MethodGet, "/nothing"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, e.secure.URL+c.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := e.secure.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Header.Get("Server-Timing"); !re.MatchString(got) {
				t.Errorf("%d, Server-Timing %q; want app;dur=<ms>", resp.StatusCode, got)
			}
		})
	}
}
