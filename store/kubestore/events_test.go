package kubestore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/kubetest"
)

// TestBindingEventsAttack: on a real API server, each of BindingEvents'
// budgets is its own — a decision's per node name, reason and identity,
// a report's per node name and reason — and every Event is cleaned and
// bounded (SafeRecorder).
func TestBindingEventsAttack(t *testing.T) {
	cfg := kubetest.Start(t, crdDir)
	kc := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	const ns = "events"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e := NewBindingEvents(kc, kubernetes.NewForConfigOrDie(cfg), ns, "nodeproof-server")
	t.Cleanup(e.Close)

	// count waits until the Events on node with reason (and, unless "",
	// identity) add up to want, or stop changing for 2 s.
	count := func(node, reason, identity string, want int) (int, []corev1.Event) {
		t.Helper()
		last, since := -1, time.Now()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			l, err := kc.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + node + ",reason=" + reason})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			var evs []corev1.Event
			for _, ev := range l.Items {
				if identity == "" || ev.Annotations[IdentityAnnotation] == identity {
					n += int(max(ev.Count, 1))
					evs = append(evs, ev)
				}
			}
			if n != last {
				last, since = n, time.Now()
			}
			if n == want || time.Since(since) > 2*time.Second || time.Now().After(deadline) {
				return n, evs
			}
		}
	}

	// One identity asks for a taken name 40 times: its budget for the
	// name is spent, another identity's is not.
	// (The server's message for one identity, name and owner is the same
	// each time: one Event, counted.)
	for range 40 {
		e.Decision("tpm-ek:sha256:aaaa", "victim-0", true, "NodeNameTaken", "tpm-ek:sha256:aaaa asked for node victim-0, which is bound to tpm-ek:sha256:cccc; refused")
	}
	spent, _ := count("victim-0", "NodeNameTaken", "tpm-ek:sha256:aaaa", -1)
	e.Decision("tpm-ek:sha256:bbbb", "victim-0", true, "NodeNameTaken", "tpm-ek:sha256:bbbb asked for node victim-0; refused")
	e.Decision("tpm-ek:sha256:aaaa", "victim-0", true, "IdentityAlreadyEnrolled", "tpm-ek:sha256:aaaa enrolled again; refused")
	other, _ := count("victim-0", "NodeNameTaken", "tpm-ek:sha256:bbbb", 1)
	reason, _ := count("victim-0", "IdentityAlreadyEnrolled", "", 1)
	attacktable.Check(t, "node reports", "one identity's 40 NodeNameTaken decisions for a name, then another identity's, and another reason's (Events on a real API server)",
		"the first's budget spent, the other's and the other reason's Events recorded",
		map[bool]string{true: "the first's budget spent, the other's and the other reason's Events recorded",
			false: fmt.Sprintf("the first wrote %d, the other %d, the other reason %d", spent, other, reason)}[spent >= 10 && spent <= 25 && other == 1 && reason == 1])

	// 40 unauthenticated reports for a name, then the node's own: the
	// report path keeps a budget per reason.
	for i := range 40 {
		e.Report("victim-1", "NodeReportedFailureUnauthenticated", fmt.Sprintf("UNAUTHENTICATED report %d", i))
	}
	spent, _ = count("victim-1", "NodeReportedFailureUnauthenticated", "", -1)
	e.Report("victim-1", "NodeReportedFailure", "node victim-1 reports re-attestation failed")
	own, evs := count("victim-1", "NodeReportedFailure", "", 1)
	component := ""
	if len(evs) > 0 {
		component = evs[0].Source.Component
	}
	attacktable.Check(t, "node reports", "40 unauthenticated reports for a name, then the node's own report (Events on a real API server)",
		"the node's own recorded, as nodeproof-server-reports", fmt.Sprintf("%s, as %s", map[bool]string{true: "the node's own recorded", false: fmt.Sprintf("%d of the node's own (%d unauthenticated)", own, spent)}[own == 1], component))

	// SafeRecorder: reason, message and annotation cleaned, message cut.
	e.Decision("tpm-ek:\u202eevil", "clean-0", true, "Bad\u2028Reason", "line one\nline\u202etwo\u2029"+strings.Repeat("y", 10<<10))
	_, evs = count("clean-0", "Bad\ufffdReason", "", 1)
	got := "no Event"
	if len(evs) == 1 {
		ev := evs[0]
		hidden := func(s string) bool {
			return strings.ContainsFunc(s, func(r rune) bool { return unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' || r == '\n' })
		}
		switch {
		case hidden(ev.Message) || hidden(ev.Reason) || hidden(ev.Annotations[IdentityAnnotation]):
			got = fmt.Sprintf("kept: %q %q %q", ev.Reason, ev.Annotations, ev.Message[:40])
		case len(ev.Message) > MaxEventMessage || !strings.HasPrefix(ev.Message, "line one line\ufffdtwo\ufffdyyy"):
			got = fmt.Sprintf("a message of %d bytes beginning %q", len(ev.Message), ev.Message[:40])
		default:
			got = "cleaned, the message cut to 4 KiB"
		}
	}
	attacktable.Check(t, "node reports", "an Event whose reason, message and identity carry new lines, U+202E, U+2028, U+2029, with 10 KiB of message", "cleaned, the message cut to 4 KiB", got)
}
