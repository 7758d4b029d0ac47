package mcs_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

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
		{"a report with a session for another node name", "", with(func(r *api.ReportRequest) { r.NodeName = "rep-2" }), "400 " + string(mcs.ReasonMalformedRequest)},
		{"a report with a session for another pool", "", with(func(r *api.ReportRequest) { r.Pool = "master" }), "400 " + string(mcs.ReasonMalformedRequest)},
		{"a report with a forged session", "", with(func(r *api.ReportRequest) { r.Session = "bm90IGEgc2Vzc2lvbg" }), "403 " + string(attest.ReasonSessionInvalid)},
		{"a report without a session, naming any node", "", api.ReportRequest{Pool: "worker", NodeName: "someone-else", Stage: "agent", Reason: "Error"}, "200 none"},
		{"a report on the plain port", "plain", ok, "403 " + string(mcs.ReasonInsecurePort)},
		{"a report for a pool the server does not serve", "", api.ReportRequest{Pool: "nope", NodeName: "x", Stage: "agent", Reason: "Error"}, "404 " + string(mcs.ReasonUnknownPool)},
		{"a report with a node name that is no DNS name", "", api.ReportRequest{Pool: "worker", NodeName: "../etc", Stage: "agent", Reason: "Error"}, "400 " + string(mcs.ReasonMalformedRequest)},
		{"a report with a stage it made up", "", api.ReportRequest{Pool: "worker", NodeName: "x", Stage: "reboot", Reason: "Error"}, "400 " + string(mcs.ReasonMalformedRequest)},
		{"a report whose reason carries a new line", "", api.ReportRequest{Pool: "worker", NodeName: "x", Stage: "agent", Reason: "Error\nFAKE"}, "400 " + string(mcs.ReasonMalformedRequest)},
		{"a report of more than 8 KiB", "", api.ReportRequest{Pool: "worker", NodeName: "x", Stage: "agent", Reason: "Error", Detail: strings.Repeat("x", 9000)}, "413 " + string(mcs.ReasonBodyTooLarge)},
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
	if len(evs) != 2 || !strings.Contains(evs[0], "rep-1 true "+string(mcs.ReasonNodeReport)+": ") || !strings.Contains(evs[0], "Secure Boot off") ||
		!strings.Contains(evs[1], "someone-else true "+string(mcs.ReasonNodeReportUnauthenticated)+": UNAUTHENTICATED") {
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
	if evs := e.events.all(); len(evs) != before+1 || !strings.Contains(evs[before], string(mcs.ReasonNodeReportUnauthenticated)+": UNAUTHENTICATED") {
		t.Errorf("the impostor's report: %q", evs[before:])
	}

	// The detail is cut and cannot forge lines.
	before = len(e.events.all())
	got := e.postReport("", api.ReportRequest{Pool: "worker", NodeName: "x", Stage: "agent", Reason: "Error", Detail: "first\nnodeproof: FORGED line\r" + strings.Repeat("é", 2000)})
	if got != "200 none" || len(e.events.all()) != before+1 {
		t.Fatalf("a long detail: %s", got)
	}
	ev := e.events.all()[before]
	attacktable.Check(t, "node reports", "a report whose detail forges lines and runs to 4 KiB", "one line, detail cut to 1 KiB",
		map[bool]string{true: "one line, detail cut to 1 KiB", false: "not cut or not one line: " + ev}[!strings.ContainsAny(ev, "\r\n") && len(ev) < 1400])

	// A session more than an hour old no longer authenticates.
	e.advance(2 * time.Hour)
	attacktable.Check(t, "node reports", "a report with a session issued two hours ago", "403 "+string(attest.ReasonSessionExpired), e.postReport("", ok))
}

// TestNodeReportFloodAttack: reports for one node name are held to the
// per-identity rate, so no sender can bury a node's Events.
func TestNodeReportFloodAttack(t *testing.T) {
	var e *env
	e = newEnvLimits(t, nil, mcs.Limits{PerIdentity: limit.NewBuckets(limit.Rate{PerSecond: 0.1, Burst: 6}, 0, func() time.Time { return e.clock() })})
	rep := api.ReportRequest{Pool: "worker", NodeName: "victim-1", Stage: "agent", Reason: "Error"}
	var got []string
	for range 8 {
		got = append(got, e.postReport("", rep))
	}
	attacktable.Check(t, "node reports", "eight reports for one node name at once (burst 6)", "6 recorded, then 503 RateLimited",
		map[bool]string{true: "6 recorded, then 503 RateLimited", false: strings.Join(got, ", ")}[got[5] == "200 none" && got[6] == "503 RateLimited" && len(e.events.all()) == 6])
	if other := e.postReport("", api.ReportRequest{Pool: "worker", NodeName: "other-1", Stage: "agent", Reason: "Error"}); other != "200 none" {
		t.Errorf("another node's report during the flood: %s", other)
	}
}
