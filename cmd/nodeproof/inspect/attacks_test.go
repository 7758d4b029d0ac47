package inspect_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"unicode"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/storetest"
)

// evil is what a machine (or its bootstrap token, which may create CSRs
// and, in many clusters, Events) stores to fool the operator's terminal: a
// bidi override that reverses what follows, an isolate, U+2028, ANSI
// escapes that erase the line and move the cursor up, a carriage return, a
// tab that shifts the table's columns, a new line that starts a row of its
// own, and a zero-width space.
const evil = "ok\u202e1-edon\u2069\u2028Attested\x1b[2K\x1b[1A\r\tforged line\nnodeproof: all nodes attested\u200b"

// unsafe lists the characters of out that a terminal would act on or that
// disguise text: control characters other than the line breaks the output
// is made of, format characters, U+2028 and U+2029.
func unsafe(out string) []string {
	var bad []string
	for _, r := range out {
		if r != '\n' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029') {
			bad = append(bad, fmt.Sprintf("%U", r))
		}
	}
	return bad
}

// TestInspectAttacks: strings a machine stored — its failure message and
// evidence summary in the store, a CSR's name and an Event's message in
// the cluster (a real API server) — are printed by `nodeproof inspect`
// cleaned (safetext) in every format: no escape, bidi control, U+2028,
// tab or new line of theirs reaches the terminal, each is shown as a
// space or U+FFFD, and -o json and -o yaml still read back, their values
// cleaned too (what `jq -r` prints).
func TestInspectAttacks(t *testing.T) {
	src, clock := world(t)
	ctx := context.Background()
	kc, err := kubernetes.NewForConfig(kubetest.Start(t))
	if err != nil {
		t.Fatal(err)
	}
	src.Kube = kc
	// The world's store is a whole one (boltstore): the attacker's
	// enrolments are written to it.
	full := src.Store.(store.Store)

	enrol := func(n int, node, summary string) {
		t.Helper()
		r := storetest.Record(storetest.ID(n), node, clock.Now())
		if summary != "" {
			r.Summary = summary
		}
		if err := full.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatalf("enrol %s: %v", node, err)
		}
	}
	// The failure message a node's report left in its binding's status.
	enrol(20, "mallory-status", "")
	if _, err := full.UpdateStatus(ctx, "mallory-status", "ek:"+storetest.ID(20), func(b *store.Binding) error {
		b.Status = store.AttestationStatus{LastAttempt: clock.Now(), Reason: string(attest.ReasonPolicySecureBootOff), Message: evil, Summary: evil}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The evidence summary of an enrolment record.
	enrol(21, "mallory-record", evil)
	// A CSR for the node, named by whoever created it (the API server
	// does not care what a CSR is called), and an Event about it and
	// one about the node.
	enrol(22, "mallory-csr", "")
	enrol(23, "mallory-event", "")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:mallory-csr", Organization: []string{"system:nodes"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	csrName := "csr-" + evil
	if _, err := kc.CertificatesV1().CertificateSigningRequests().Create(ctx, &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: csrName},
		Spec: certv1.CertificateSigningRequestSpec{Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certv1.KubeAPIServerClientKubeletSignerName, Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the API server refused the CSR named %q: %v", csrName, err)
	}
	if _, err := kc.CoreV1().Events("default").Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "mallory-event.1"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "mallory-event"},
		Type:           corev1.EventTypeWarning, Reason: "NodeReport", Message: evil,
		LastTimestamp: metav1.NewTime(clock.Now()), Source: corev1.EventSource{Component: "mallory"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name, node string
	}{
		{"a node's failure message and evidence summary in its stored status", "mallory-status"},
		{"an enrolment record's evidence summary", "mallory-record"},
		{"a CSR for the node, named by whoever created it", "mallory-csr"},
		{"an Event message about the node", "mallory-event"},
	} {
		t.Run(c.node, func(t *testing.T) {
			story, err := inspect.StoryOf(ctx, src, c.node)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, format := range []string{inspect.FormatTable, inspect.FormatJSON, inspect.FormatYAML} {
				var out bytes.Buffer
				if err := inspect.WriteStory(&out, format, story); err != nil {
					t.Fatal(err)
				}
				s := out.String()
				switch {
				case !strings.Contains(s, "forged line"):
					got = append(got, format+": the value is not shown")
					t.Logf("%s:\n%s", format, s)
				case unsafe(s) != nil:
					got = append(got, format+": raw "+strings.Join(unsafe(s), " "))
				case !strings.Contains(s, "\uFFFD"):
					got = append(got, format+": no U+FFFD where the format characters were")
				}
				if format == inspect.FormatTable {
					continue
				}
				// Read back, each string value is clean: what jq -r prints.
				var back any
				if err := yaml.Unmarshal(out.Bytes(), &back); err != nil {
					got = append(got, format+": does not read back: "+err.Error())
					continue
				}
				j, _ := json.Marshal(back)
				var vals []string
				walkStrings(back, func(v string) { vals = append(vals, v) })
				if bad := unsafe(strings.Join(vals, "")); bad != nil {
					got = append(got, format+": values read back hold "+strings.Join(bad, " "))
					t.Logf("%s", j)
				}
			}
			outcome := "shown cleaned (table, json, yaml)"
			if got != nil {
				outcome = strings.Join(got, "; ")
			}
			attacktable.Check(t, "inspect", c.name+": a bidi override, U+2028, ANSI escapes, a tab and a new line", "shown cleaned (table, json, yaml)", outcome)
		})
	}

	// The overview lists the node's failure too.
	o, err := inspect.ListAll(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{inspect.FormatTable, inspect.FormatJSON, inspect.FormatYAML} {
		var out bytes.Buffer
		if err := inspect.WriteOverview(&out, format, o); err != nil {
			t.Fatal(err)
		}
		if bad := unsafe(out.String()); bad != nil {
			t.Errorf("inspect -o %s (every node): raw %v", format, bad)
		}
	}
}

func walkStrings(v any, f func(string)) {
	switch x := v.(type) {
	case string:
		f(x)
	case map[string]any:
		for k, e := range x {
			f(k)
			walkStrings(e, f)
		}
	case []any:
		for _, e := range x {
			walkStrings(e, f)
		}
	}
}
