package leader

import (
	"context"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

// TestRunRefusesIncompleteOptions: a Lease without a namespace, a name or
// an identity would be shared by accident (two roles on one Lease, two
// replicas of one identity); Run refuses before it campaigns.
func TestRunRefusesIncompleteOptions(t *testing.T) {
	full := Options{Client: fake.NewClientset(), Namespace: "nodeproof", Name: "nodeproof-approver", Identity: "a"}
	for _, tc := range []struct {
		name string
		edit func(*Options)
	}{
		{"no client", func(o *Options) { o.Client = nil }},
		{"no namespace", func(o *Options) { o.Namespace = "" }},
		{"no name", func(o *Options) { o.Name = "" }},
		{"no identity", func(o *Options) { o.Identity = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := full
			tc.edit(&o)
			ran := false
			if err := Run(context.Background(), o, func(context.Context) { ran = true }); err == nil || ran {
				t.Fatalf("Run = %v (ran %v), want a refusal before campaigning", err, ran)
			}
		})
	}
}

// TestTermsRunAfresh: a term that gives up (run returns while the Lease
// is held) releases the Lease and Run campaigns again, running a new
// term; Run returns nil when ctx ends. The Lease lives in client-go's
// fake clientset (a Lease is one object: its semantics are client-go's
// elector's, tested upstream; what is nodeproof's is the loop around it).
func TestTermsRunAfresh(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	terms := 0
	o := Options{Client: fake.NewClientset(), Namespace: "nodeproof", Name: "nodeproof-test", Identity: "a",
		LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 50 * time.Millisecond}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, o, func(context.Context) {
			terms++
			if terms == 3 {
				cancel()
			}
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not start three terms within a minute")
	}
	if terms != 3 {
		t.Fatalf("%d terms, want 3", terms)
	}
}

// TestIdentity: the flag's value, else $POD_NAME, else the host name.
func TestIdentity(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, given, pod, want string }{
		{"given wins", "replica-a", "pod-1", "replica-a"},
		{"the pod's name", "", "pod-1", "pod-1"},
		{"the host's name", "", "", host},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("POD_NAME", tc.pod)
			if got, err := Identity(tc.given); err != nil || got != tc.want {
				t.Fatalf("Identity(%q) = %q, %v; want %q", tc.given, got, err, tc.want)
			}
		})
	}
}
