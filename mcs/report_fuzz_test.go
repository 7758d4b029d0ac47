package mcs_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// FuzzReport: whatever a node posts as its failure report, the answer is
// 200 or a refusal with a reason, an accepted report writes exactly one
// Event, one line of at most 1 KiB of UTF-8 without format or separator
// characters, on a valid node name, and one that carries a session it
// cannot prove is recorded as unauthenticated never.
func FuzzReport(f *testing.F) {
	clock := time.Now
	_, pol, st, keys := fuzzState(f, clock)
	var events eventLog
	srv, err := mcs.New(mcs.Options{Policy: pol, Configs: &staticConfigs{}, Store: st, Keys: keys,
		Clock: clock, Log: slog.New(slog.DiscardHandler), Events: &events})
	if err != nil {
		f.Fatal(err)
	}
	h := srv.Handler(mcs.Secure)
	for _, seed := range []string{
		`{"pool":"worker","nodeName":"worker-0","stage":"attestation","reason":"SecureBootDisabled","detail":"off"}`,
		`{"pool":"worker","nodeName":"worker-0","stage":"agent","reason":"Error","detail":"a\nb\u0000c","session":"np1.AAAA","kubeletKeyProof":"AQ=="}`,
		`{"pool":"worker","nodeName":"Worker_0","stage":"x","reason":"a b"}`,
		`{"pool":"worker","nodeName":"w","stage":"agent","reason":"E","detail":"` + strings.Repeat("é", 600) + `"}`,
		`{"pool":"worker","nodeName":"w","stage":"agent","reason":"E","detail":"a\u202eb\u2028c\u2029d\u200be\ufeff"}`,
		`{"pool":"worker"} {"x":1}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(seed))
	}
	allowed := map[int]bool{200: true, 400: true, 403: true, 404: true, 413: true, 503: true}
	f.Fuzz(func(t *testing.T, body []byte) {
		before := len(events.all())
		req := httptest.NewRequest(http.MethodPost, api.PathReport, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if !allowed[rec.Code] {
			t.Fatalf("status %d for %q", rec.Code, body)
		}
		evs := events.all()[before:]
		if rec.Code != http.StatusOK {
			var r api.Refusal
			if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || r.Reason == "" {
				t.Fatalf("refusal body %q: %v", rec.Body.Bytes(), err)
			}
			if len(evs) != 0 {
				t.Fatalf("a refused report wrote Events: %q", evs)
			}
			return
		}
		var resp api.ReportResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || resp.Authenticated != "none" {
			t.Fatalf("accepted as %q (%v): a fuzzed report cannot prove a session", resp.Authenticated, err)
		}
		if len(evs) != 1 || strings.ContainsAny(evs[0], "\r\n\x00") || len(evs[0]) > 1024 || !strings.Contains(evs[0], "UNAUTHENTICATED") ||
			!utf8.ValidString(evs[0]) || strings.ContainsFunc(evs[0], func(r rune) bool { return unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' }) {
			t.Fatalf("Events %q for %q", evs, body)
		}
	})
}
