package mcs

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// retryAfter is what a 503 asks the client to wait.
const retryAfter = 5

// statusOf maps a refusal reason to its HTTP status, once for the whole
// server. 4xx is final for Ignition and the agent; 5xx means retry.
func statusOf(r attest.Reason) int {
	switch r {
	case attest.ReasonNotFound, attest.ReasonUnknownPool:
		return http.StatusNotFound
	case attest.ReasonMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case attest.ReasonBodyTooLarge:
		return http.StatusRequestEntityTooLarge
	case attest.ReasonBadPath, attest.ReasonSpecVersion, attest.ReasonMalformedRequest, attest.ReasonMalformed:
		return http.StatusBadRequest
	case attest.ReasonCredentials:
		return http.StatusUnauthorized
	case attest.ReasonUnavailable, attest.ReasonConfigUnavailable, attest.ReasonNotReady, attest.ReasonKeysUnavailable, attest.ReasonRateLimited, attest.ReasonOverloaded:
		// Trust roots that cannot be fetched now (GCP's JWKS) are "not yet".
		return http.StatusServiceUnavailable
	}
	// Every other reason is a refusal of credentials or evidence.
	return http.StatusForbidden
}

// retryLater is a refusal that says when to come back (Retry-After).
type retryLater struct {
	err   error
	after time.Duration
}

func (e *retryLater) Error() string { return e.err.Error() }
func (e *retryLater) Unwrap() error { return e.err }

// later marks err (a 503 refusal) as one to retry after d, rounded up to
// whole seconds (at least 1).
func later(d time.Duration, err error) error { return &retryLater{err: err, after: d} }

// refuse writes err as a refusal: the status of its reason, a JSON
// {"reason","detail"} body, Retry-After on 503. An error that is not a
// Denial is an internal failure: 503, and its text is not sent.
func (s *Server) refuse(w http.ResponseWriter, d *decision, err error) {
	var den *attest.Denial
	body := api.Refusal{Reason: attest.ReasonUnavailable, Detail: "the server cannot answer now; retry"}
	if errors.As(err, &den) {
		body = api.Refusal{Reason: den.Reason, Detail: den.Detail}
	} else if err != nil {
		s.o.Log.Error("internal error", "path", d.path, "err", err.Error())
	}
	status := statusOf(body.Reason)
	b, _ := json.Marshal(body)
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	if status == http.StatusServiceUnavailable {
		secs := retryAfter
		var rl *retryLater
		if errors.As(err, &rl) {
			secs = max(1, int((rl.after+time.Second-1)/time.Second))
		}
		h.Set("Retry-After", strconv.Itoa(secs))
	}
	if status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="nodeproof"`)
	}
	w.WriteHeader(status)
	w.Write(b)
	d.status, d.reason = status, body.Reason
}
