package mcs_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/limit"
)

// postReport sends rep and returns the outcome as the attack table shows
// it: "200 session", "200 none", or "<status> <reason>".
func (e *env) postReport(port string, rep api.ReportRequest) string {
	e.t.Helper()
	body, _ := json.Marshal(rep)
	url := e.secure.URL
	if port == "plain" {
		url = e.plain.URL
	}
	r := e.do("POST", url+api.PathReport, body, map[string]string{"Content-Type": "application/json"})
	if r.status != 200 {
		return fmt.Sprintf("%d %s", r.status, r.reason)
	}
	var resp api.ReportResponse
	if err := json.Unmarshal(r.body, &resp); err != nil {
		e.t.Fatal(err)
	}
	return "200 " + resp.Authenticated
}

// TestNodeReportAttacks: a node's failure report is recorded as an Event,
// authenticated by the session of its failed attempt when it proves the
// kubelet key that session bound, otherwise marked unauthenticated; a
// report that claims more than it proves, or is malformed, is refused
// with its reason and records nothing.
func TestNodeReportAttacks(t *testing.T) {
	e := newEnv(t)
	m := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	ch, r := e.challenge(m, "worker", "rep-1")
	if ch == nil {
		t.Fatalf("challenge: %d %s", r.status, r.reason)
	}
	proof, err := attest.SignKeyProof(m.kubelet, ch.Session)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	otherProof, _ := attest.SignKeyProof(other, ch.Session)
	ok := api.ReportRequest{Pool: "worker", NodeName: "rep-1", Stage: "attestation", Reason: "SecureBootDisabled",
		Detail: "the machine booted with Secure Boot off", Session: ch.Session, KubeletKeyProof: proof}
	with := func(f func(*api.ReportRequest)) api.ReportRequest { r := ok; f(&r); return r }

	cases := []struct {
		attack string
		port   string
		rep    api.ReportRequest
		want   string
	}{
		{"a report with its session and the kubelet key proof", "", ok, "200 session"},
		{"a report with a captured session and a proof by another key", "", with(func(r *api.ReportRequest) { r.KubeletKeyProof = otherProof }), "403 " + string(attest.ReasonKeyProof)},
		{"a report with a captured session and no proof", "", with(func(r *api.ReportRequest) { r.KubeletKeyProof = nil }), "403 " + string(attest.ReasonKeyProof)},
		{"a report with a session for another node name", "", with(func(r *api.ReportRequest) { r.NodeName = "rep-2" }), "400 " + string(attest.ReasonMalformedRequest)},
		{"a report with a session for another pool", "", with(func(r *api.ReportRequest) { r.Pool = "master" }), "400 " + string(attest.ReasonMalformedRequest)},
		{"a report with a forged session", "", with(func(r *api.ReportRequest) { r.Session = "bm90IGEgc2Vzc2lvbg" }), "403 " + string(attest.ReasonSessionInvalid)},
		{"a report without a session, naming any node", "", api.ReportRequest{Pool: "worker", NodeName: "someone-else", Stage: "agent", Reason: "Error"}, "200 none"},
		{"a report on the plain port", "plain", ok, "403 " + string(attest.ReasonInsecurePort)},
		{"a report for a pool the server does not serve", "", api.ReportRequest{Pool: "nope", NodeName: "x", Stage: "agent", Reason: "Error"}, "404 " + string(attest.ReasonUnknownPool)},
		{"a report with a node name that is no DNS name", "", api.ReportRequest{Pool: "worker", NodeName: "../etc", Stage: "agent", Reason: "Error"}, "400 " + string(attest.ReasonMalformedRequest)},
		{"a report with a stage it made up", "", api.ReportRequest{Pool: "worker", NodeName: "x", Stage: "reboot", Reason: "Error"}, "400 " + string(attest.ReasonMalformedRequest)},
		{"a report whose reason carries a new line", "", api.ReportRequest{Pool: "worker", NodeName: "x", Stage: "agent", Reason: "Error\nFAKE"}, "400 " + string(attest.ReasonMalformedRequest)},
		{"a report of more than 8 KiB", "", api.ReportRequest{Pool: "worker", NodeName: "x", Stage: "agent", Reason: "Error", Detail: strings.Repeat("x", 9000)}, "413 " + string(attest.ReasonBodyTooLarge)},
	}
	for _, c := range cases {
		before := len(e.events.all())
		got := e.postReport(c.port, c.rep)
		attacktable.Check(t, "node reports", c.attack, c.want, got)
		wrote := len(e.events.all()) - before
		if (strings.HasPrefix(got, "200") && wrote != 1) || (!strings.HasPrefix(got, "200") && wrote != 0) {
			t.Errorf("%s: %s wrote %d Events", c.attack, got, wrote)
		}
	}
	evs := e.events.all()
	if len(evs) != 2 || !strings.Contains(evs[0], "rep-1 true "+string(attest.ReasonNodeReport)+": ") || !strings.Contains(evs[0], "Secure Boot off") ||
		!strings.Contains(evs[1], "someone-else true "+string(attest.ReasonNodeReportUnauthenticated)+": UNAUTHENTICATED") {
		t.Errorf("Events %q", evs)
	}

	// Once the name is bound, a session proves ownership only with the
	// binding's kubelet key: another genuine machine that asked for the
	// name at its challenge is recorded as unauthenticated.
	if vr, r := e.verify(e.verifyBody(m, ch)); vr == nil {
		t.Fatalf("enrolment of rep-1: %d %s", r.status, r.reason)
	}
	attacktable.Check(t, "node reports", "the enrolled machine reports for its own node with a session", "200 owner", e.postReport("", ok))
	m2 := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	ch2, r2 := e.challenge(m2, "worker", "rep-1")
	if ch2 == nil {
		t.Fatalf("challenge of a second machine: %d %s", r2.status, r2.reason)
	}
	proof2, _ := attest.SignKeyProof(m2.kubelet, ch2.Session)
	before := len(e.events.all())
	attacktable.Check(t, "node reports", "another genuine TPM asks for an enrolled node's name at its challenge and reports for it with that session",
		"200 none", e.postReport("", with(func(r *api.ReportRequest) { r.Session, r.KubeletKeyProof = ch2.Session, proof2 })))
	if evs := e.events.all(); len(evs) != before+1 || !strings.Contains(evs[before], string(attest.ReasonNodeReportUnauthenticated)+": UNAUTHENTICATED") {
		t.Errorf("the impostor's report: %q", evs[before:])
	}

	// The detail is cut and cannot forge lines.
	before = len(e.events.all())
	got := e.postReport("", api.ReportRequest{Pool: "worker", NodeName: "x", Stage: "agent", Reason: "Error", Detail: "first\nnodeproof: FORGED line\r" + strings.Repeat("é", 2000)})
	if got != "200 none" || len(e.events.all()) != before+1 {
		t.Fatalf("a long detail: %s", got)
	}
	ev := e.events.all()[before]
	attacktable.Check(t, "node reports", "an unauthenticated report whose detail forges lines and runs to 4 KiB", "one line, detail cut to 256 bytes",
		map[bool]string{true: "one line, detail cut to 256 bytes", false: "not cut or not one line: " + ev}[!strings.ContainsAny(ev, "\r\n") &&
			strings.Contains(ev, "first nodeproof: FORGED line "+strings.Repeat("é", 110)) && !strings.Contains(ev, strings.Repeat("é", 120)) && len(ev) < 600])

	// A session more than an hour old no longer authenticates.
	e.advance(2 * time.Hour)
	attacktable.Check(t, "node reports", "a report with a session issued two hours ago", "403 "+string(attest.ReasonSessionExpired), e.postReport("", ok))
}

// postReportFrom is postReport from the source address src, straight to
// the secure port's handler.
func (e *env) postReportFrom(src string, rep api.ReportRequest) string {
	e.t.Helper()
	body, _ := json.Marshal(rep)
	req := httptest.NewRequest("POST", api.PathReport, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr = net.JoinHostPort(src, "40000")
	rec := httptest.NewRecorder()
	e.secure.Config.Handler.ServeHTTP(rec, req)
	if rec.Code != 200 {
		var r api.Refusal
		json.Unmarshal(rec.Body.Bytes(), &r)
		return fmt.Sprintf("%d %s", rec.Code, r.Reason)
	}
	var resp api.ReportResponse
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
		e.t.Fatal(err)
	}
	return "200 " + resp.Authenticated
}

// outcomes says "N recorded, then W" for a run of answers: how many were
// recorded before the first refusal, and what every later answer was
// (or "every one recorded").
func outcomes(got []string) string {
	n := 0
	for n < len(got) && strings.HasPrefix(got[n], "200") {
		n++
	}
	if n == len(got) {
		return fmt.Sprintf("%d recorded", n)
	}
	rest := slices.Compact(slices.Clone(got[n:]))
	return fmt.Sprintf("%d recorded, then %s", n, strings.Join(rest, ", "))
}

// TestNodeReportFloodAttack: unauthenticated reports are held to a count
// and a byte budget per source address and per node name; a node's own
// (authenticated) reports have a budget of their own, which the flood
// cannot spend; details are cut and their format characters replaced.
func TestNodeReportFloodAttack(t *testing.T) {
	var e *env
	clock := func() time.Time { return e.clock() }
	e = newEnvLimits(t, nil, mcs.Limits{
		PerIdentity:                limit.NewBuckets(limit.Rate{PerSecond: 0.1, Burst: 6}, 0, clock),
		UnauthenticatedReports:     limit.NewBuckets(limit.Rate{PerSecond: 0.02, Burst: 5}, 0, clock),
		UnauthenticatedReportBytes: limit.NewBuckets(limit.Rate{PerSecond: 8, Burst: 1536}, 0, clock),
	})
	// The victim is enrolled: its own reports are "owner" reports.
	m := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	ch, r := e.challenge(m, "worker", "victim-1")
	if ch == nil {
		t.Fatalf("challenge: %d %s", r.status, r.reason)
	}
	if vr, r := e.verify(e.verifyBody(m, ch)); vr == nil {
		t.Fatalf("enrolment of victim-1: %d %s", r.status, r.reason)
	}
	proof, err := attest.SignKeyProof(m.kubelet, ch.Session)
	if err != nil {
		t.Fatal(err)
	}
	own := api.ReportRequest{Pool: "worker", NodeName: "victim-1", Stage: "re-attestation", Reason: "SecureBootDisabled", Session: ch.Session, KubeletKeyProof: proof}
	junk := func(node string) api.ReportRequest {
		return api.ReportRequest{Pool: "worker", NodeName: node, Stage: "agent", Reason: "Error", Detail: "it broke"}
	}

	var got []string
	for range 8 {
		got = append(got, e.postReportFrom("192.0.2.1", junk("victim-1")))
	}
	attacktable.Check(t, "node reports", "eight unauthenticated reports for one node name from one address (5 per address and per name)",
		"5 recorded, then 503 RateLimited", outcomes(got))
	got = nil
	for i := range 8 {
		got = append(got, e.postReportFrom(fmt.Sprintf("192.0.2.%d", 10+i), junk("victim-1")))
	}
	attacktable.Check(t, "node reports", "then unauthenticated reports for that name from eight other addresses",
		"0 recorded, then 503 RateLimited", outcomes(got))
	got = nil
	for i := range 8 {
		got = append(got, e.postReportFrom("2001:db8:1:2::1", junk(fmt.Sprintf("node-%d", i))))
		got = append(got, e.postReportFrom(fmt.Sprintf("2001:db8:1:2::%x", 100+i), junk(fmt.Sprintf("node-%d", i+10))))
	}
	attacktable.Check(t, "node reports", "unauthenticated reports for 16 node names from addresses of one IPv6 /64",
		"5 recorded, then 503 RateLimited", outcomes(got))
	got = nil
	for range 3 {
		got = append(got, e.postReportFrom("192.0.2.99", own))
	}
	attacktable.Check(t, "node reports", "meanwhile the node itself reports three times (owner-authenticated: the flood spent none of its budget)",
		"3 recorded", outcomes(got))
	evs := e.events.all()
	if len(evs) != 5+5+3 {
		t.Errorf("%d Events; want 13 (5 + 5 unauthenticated, 3 the node's own)", len(evs))
	}

	// Bytes: each report's Event counts; 1.5 KiB of them per address.
	before := len(e.events.all())
	got = nil
	for i := range 8 {
		rep := junk(fmt.Sprintf("long-%d", i))
		rep.Detail = strings.Repeat("x", 2000) // cut to 256
		got = append(got, e.postReportFrom("198.51.100.7", rep))
	}
	evs = e.events.all()[before:]
	size := 0
	for _, ev := range evs {
		_, msg, _ := strings.Cut(ev, ": ")
		size += len(msg)
		if !strings.Contains(msg, strings.Repeat("x", 253)+"…") || strings.Contains(msg, strings.Repeat("x", 254)) || len(msg) > 1024 {
			t.Errorf("an unauthenticated report's Event: %d bytes, detail not cut to 256 bytes: %s", len(msg), msg)
		}
	}
	want := fmt.Sprintf("%d recorded, then 503 RateLimited", 1536/(size/max(len(evs), 1)))
	attacktable.Check(t, "node reports", "unauthenticated reports of 2,000 bytes of detail each from one address (cut to 256; 1.5 KiB of Events per address)",
		want, outcomes(got))

	// Format characters are replaced in the Event and the log line.
	rep := junk("bidi-1")
	rep.Detail = "ok\u202e\u2066gnp.exe\u2069\u2028FORGED\u2029line\u200b\ufeff"
	before = len(e.events.all())
	if got := e.postReportFrom("203.0.113.5", rep); got != "200 none" {
		t.Fatalf("a report with format characters: %s", got)
	}
	ev := e.events.all()[before]
	logged := ""
	for _, line := range strings.Split(e.log.String(), "\n") {
		if strings.Contains(line, "bidi-1") {
			logged += line
		}
	}
	hidden := func(s string) bool {
		return strings.ContainsFunc(s, func(r rune) bool { return unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' })
	}
	attacktable.Check(t, "node reports", "a report whose detail carries bidi overrides and isolates, U+2028, U+2029, zero-width characters",
		"replaced in the Event and the log line", map[bool]string{true: "replaced in the Event and the log line", false: fmt.Sprintf("Event %q, log %q", ev, logged)}[!hidden(ev) && !hidden(logged) && logged != "" && strings.Contains(ev, "ok\ufffd\ufffdgnp.exe\ufffd\ufffdFORGED\ufffdline\ufffd\ufffd")])

	// Every log line passes through safetext, not only a report's detail:
	// the path of a request (percent-encoded U+202E) too.
	req := httptest.NewRequest("GET", "/config/worker%E2%80%AEexe.gnp", nil)
	rec := httptest.NewRecorder()
	e.secure.Config.Handler.ServeHTTP(rec, req)
	logged = ""
	for _, line := range strings.Split(e.log.String(), "\n") {
		if strings.Contains(line, "exe.gnp") {
			logged += line
		}
	}
	attacktable.Check(t, "node reports", "a request whose path carries a bidi override (the request's log line quotes it)",
		"replaced in the log line", map[bool]string{true: "replaced in the log line", false: fmt.Sprintf("log %q", logged)}[logged != "" && !hidden(logged)])
}
