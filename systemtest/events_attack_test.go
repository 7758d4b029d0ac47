package systemtest_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// events lists the Events on node's NodeBinding with reason (and, unless
// "", source component).
func (e *enrolEnv) events(t *testing.T, node, reason, component string) []corev1.Event {
	t.Helper()
	l, err := e.kc.CoreV1().Events("nodeproof").List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.kind=NodeBinding,involvedObject.name=" + node + ",reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range l.Items {
		if component == "" || ev.Source.Component == component {
			out = append(out, ev)
		}
	}
	return out
}

// settled waits until the count of node's reason Events from component
// reaches want, or stops changing for 2 s (at most 30 s), and returns it
// (a repeat is one Event with a count).
func (e *enrolEnv) settled(t *testing.T, node, reason, component string, want int) (int, []corev1.Event) {
	t.Helper()
	last, since := -1, time.Now()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		evs := e.events(t, node, reason, component)
		n := 0
		for _, ev := range evs {
			n += int(max(ev.Count, 1))
		}
		if n != last {
			last, since = n, time.Now()
		}
		if n == want || time.Since(since) > 2*time.Second || time.Now().After(deadline) {
			return n, evs
		}
	}
}

// report sends rep through an agent client (no session: unauthenticated)
// and returns "200 none" or the refusal.
func (e *enrolEnv) report(t *testing.T, rep api.ReportRequest) string {
	t.Helper()
	c, err := agent.NewClient(e.url, e.bundle)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := c.Report(context.Background(), rep)
	var refused *agent.Refused
	switch {
	case err == nil:
		return "200 " + auth
	case errors.As(err, &refused):
		return fmt.Sprintf("%d %s", refused.Status, refused.Refusal.Reason)
	}
	t.Fatalf("report: %v", err)
	return ""
}

// hidesText says whether s holds a character that can hide or reorder
// text: a format character (Cf: bidi controls, zero-width), U+2028 or
// U+2029.
func hidesText(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' })
}

// TestEventRecordAttacks: against `nodeproof serve` on a real API server,
// unauthenticated failure reports cannot bury the security record. Forty
// reports for an enrolled node's name (with the report limits off: the
// attacker that spreads them over time and addresses) spend the report
// path's Event budget for the name, and the security decisions about the
// name that follow — NodeNameTaken, an enrolment refused by policy, a
// revoked machine's attempt — still leave their Events; format
// characters in a report are replaced in its Event and the log; an
// unauthenticated report is cut, and an oversized one refused.
func TestEventRecordAttacks(t *testing.T) {
	e := newEnrolEnv(t, "--limit-unauthenticated-reports", "0", "--limit-unauthenticated-report-bytes", "0")
	// Reports name a pool the server serves: the example MCO objects.
	clustertest.LoadExamples(t, "../deploy/examples/bootstrap").Create(context.Background(), t, e.cluster)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got := e.report(t, api.ReportRequest{Pool: "worker", NodeName: "pool-ready", Stage: "agent", Reason: "Error"})
		if got == "200 none" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker pool is not served after 30 s: %s", got)
		}
	}
	a, b := e.tpmMachine(t), e.tpmMachine(t)
	ka := newKubelet(t)
	e.mustEnrol(t, "machine A enrols as victim-0", a, "worker", "victim-0", ka, true)

	// The flood: 40 unauthenticated reports for victim-0.
	for i := range 40 {
		if got := e.report(t, api.ReportRequest{Pool: "worker", NodeName: "victim-0", Stage: "agent", Reason: "Error",
			Detail: fmt.Sprintf("junk report %d", i)}); got != "200 none" {
			t.Fatalf("report %d: %s", i, got)
		}
	}
	written, _ := e.settled(t, "victim-0", string(attest.ReasonNodeReportUnauthenticated), "", -1)
	attacktable.Check(t, "node reports", "40 unauthenticated reports for an enrolled node's name (report limits off): what they write",
		"the report path's budget for the name spent (at most 25 Events)", map[bool]string{
			true: "the report path's budget for the name spent (at most 25 Events)", false: fmt.Sprintf("%d written", written)}[written >= 10 && written <= 25])

	// Two NodeNameTaken refusals for the name after the flood.
	taken := "403 " + string(attest.ReasonNodeNameTaken)
	got := []string{e.attempt(t, b, "worker", "victim-0", newKubelet(t), true), e.attempt(t, b, "worker", "victim-0", newKubelet(t), true)}
	n, evs := e.settled(t, "victim-0", string(attest.ReasonNodeNameTaken), "nodeproof-server", 2)
	identity := ""
	if len(evs) > 0 {
		identity = evs[0].Annotations[kubestore.IdentityAnnotation]
	}
	attacktable.Check(t, "node reports", "then a second genuine TPM asks twice for that name: its NodeNameTaken refusals are recorded",
		taken+", "+taken+", 2 NodeNameTaken Events naming its identity", fmt.Sprintf("%s, %d NodeNameTaken Events %s", strings.Join(got, ", "), n,
			map[bool]string{true: "naming its identity", false: "annotated " + identity}[strings.HasPrefix(identity, "tpm-ek:")]))

	// An enrolment refused by policy (Secure Boot off) leaves an Event on
	// the name it asked for, after a flood of reports for that name too.
	for i := range 30 {
		if got := e.report(t, api.ReportRequest{Pool: "worker", NodeName: "sb-off-0", Stage: "agent", Reason: "Error", Detail: fmt.Sprint(i)}); got != "200 none" {
			t.Fatalf("report %d: %s", i, got)
		}
	}
	m, err := e.man.NewMachine(context.Background(), t.TempDir(), firmwaretestdata.MustLog("ubuntu-2104-no-secure-boot"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	off := "403 " + string(attest.ReasonPolicySecureBootOff)
	got = []string{e.attempt(t, agent.TPMEvidence{Collector: m.Collector}, "worker", "sb-off-0", newKubelet(t), true)}
	n, evs = e.settled(t, "sb-off-0", string(attest.ReasonPolicySecureBootOff), "nodeproof-server", 1)
	msg := ""
	if len(evs) > 0 {
		msg = evs[0].Message
	}
	attacktable.Check(t, "enrolment", "a genuine TPM booted with Secure Boot off asks to enrol (refused by policy), after 30 reports for the name",
		off+", 1 "+string(attest.ReasonPolicySecureBootOff)+" Event", fmt.Sprintf("%s, %d %s Event%s", got[0], n, attest.ReasonPolicySecureBootOff,
			map[bool]string{true: "", false: " saying " + msg}[n != 1 || strings.Contains(msg, "refused by policy")]))

	// A revoked machine that attests again leaves an Event of the server's.
	var stdout, stderr bytes.Buffer
	if code := cli.Run(context.Background(), append(append([]string{"revoke"}, e.storeFlags...), "--reason", "stolen disk", "victim-0"), &stdout, &stderr); code != 0 {
		t.Fatalf("nodeproof revoke: exit %d: %s", code, stderr.String())
	}
	revoked := "403 " + string(attest.ReasonRevoked)
	got = []string{e.attempt(t, a, "worker", "victim-0", ka, true)}
	n, _ = e.settled(t, "victim-0", string(attest.ReasonRevoked), "nodeproof-server", 1)
	attacktable.Check(t, "node reports", "then the revoked machine attests again: its refusal is recorded",
		revoked+", 1 Revoked Event of the server's", fmt.Sprintf("%s, %d Revoked Event of the server's", got[0], n))

	// Format characters in a report: replaced in its Event and the log.
	rep := api.ReportRequest{Pool: "worker", NodeName: "bidi-0", Stage: "agent", Reason: "Error",
		Detail: "ok\u202e\u2066gnp.exe\u2069\u2028FORGED line\u2029\u200b\u200d\ufeff"}
	if got := e.report(t, rep); got != "200 none" {
		t.Fatalf("the bidi report: %s", got)
	}
	_, evs = e.settled(t, "bidi-0", string(attest.ReasonNodeReportUnauthenticated), "", 1)
	logged := ""
	for _, line := range strings.Split(e.log.String(), "\n") {
		if strings.Contains(line, "bidi-0") && strings.Contains(line, "node report") {
			logged += line
		}
	}
	msg = ""
	if len(evs) == 1 {
		msg = evs[0].Message
	}
	clean := msg != "" && logged != "" && !hidesText(msg) && !hidesText(logged) && strings.Contains(msg, "ok\ufffd\ufffdgnp.exe\ufffd\ufffdFORGED line\ufffd\ufffd\ufffd\ufffd")
	attacktable.Check(t, "node reports", "a report whose detail carries U+202E, bidi isolates, U+2028, U+2029 and zero-width characters (a real API server)",
		"replaced in the Event and the log line", map[bool]string{true: "replaced in the Event and the log line", false: fmt.Sprintf("Event %q, log %q", msg, logged)}[clean])

	// Size: an unauthenticated report's detail is cut to 256 bytes; a
	// body over 8 KiB is refused.
	rep = api.ReportRequest{Pool: "worker", NodeName: "long-0", Stage: "agent", Reason: "Error", Detail: strings.Repeat("x", 1024)}
	if got := e.report(t, rep); got != "200 none" {
		t.Fatalf("the long report: %s", got)
	}
	_, evs = e.settled(t, "long-0", string(attest.ReasonNodeReportUnauthenticated), "", 1)
	size := -1
	if len(evs) == 1 && strings.Contains(evs[0].Message, strings.Repeat("x", 253)+"…") && !strings.Contains(evs[0].Message, strings.Repeat("x", 254)) {
		size = len(evs[0].Message)
	}
	attacktable.Check(t, "node reports", "an unauthenticated report with 1 KiB of detail", "an Event under 1 KiB, the detail cut to 256 bytes",
		map[bool]string{true: "an Event under 1 KiB, the detail cut to 256 bytes", false: fmt.Sprintf("Event of %d bytes: %v", size, evs)}[size > 0 && size < 1024])
	body, _ := json.Marshal(api.ReportRequest{Pool: "worker", NodeName: "long-1", Stage: "agent", Reason: "Error", Detail: strings.Repeat("x", 9000)})
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: rootsOf(t, e.bundle), ServerName: "127.0.0.1"}}}
	resp, err := client.Post(e.url+api.PathReport, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var refusal api.Refusal
	json.Unmarshal(rb, &refusal)
	attacktable.Check(t, "node reports", "an unauthenticated report of 9 KiB (a real API server)", "413 BodyTooLarge, no Event",
		fmt.Sprintf("%d %s, %s", resp.StatusCode, refusal.Reason, map[bool]string{true: "no Event", false: "an Event"}[len(e.events(t, "long-1", string(attest.ReasonNodeReportUnauthenticated), "")) == 0]))
}
