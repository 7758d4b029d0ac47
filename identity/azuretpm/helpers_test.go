package azuretpm_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// httptestServer answers every request with body and returns its URL.
func httptestServer(t testing.TB, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { io.WriteString(rw, body) }))
	t.Cleanup(srv.Close)
	return srv.URL
}
