package certs

import (
	"testing"
	"time"
)

// TestRotateOnDemand: RotateCA rotates a young CA exactly as at 80% (new
// CA cross-signed by the old, the old kept in the bundle, a new serving
// certificate that verifies through the old CA too); RotateServing
// reissues only the serving certificate; a second CA in the same second
// is refused.
func TestRotateOnDemand(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) func() time.Time { return func() time.Time { return t0.Add(d) } }
	first, err := Ensure(dir, Options{Clock: at(0), Hosts: []string{testHost}})
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name       string
		o          Options
		after      time.Duration
		wantErr    bool
		newCA      bool
		newServing bool
	}{
		{"serving certificate only", Options{RotateServing: true}, time.Minute, false, false, true},
		{"the CA, a minute after it was made", Options{RotateCA: true}, 2 * time.Minute, false, true, true},
		{"the CA again in the same second", Options{RotateCA: true}, 2*time.Minute + 500*time.Millisecond, true, false, false},
		{"nothing asked: nothing changes", Options{}, 3 * time.Minute, false, false, false},
	}
	prev := first
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.Clock, o.Hosts = at(tc.after), []string{testHost}
			st, err := Ensure(dir, o)
			if tc.wantErr {
				if err == nil {
					t.Fatal("rotated twice in one second")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkState(t, st, t0.Add(tc.after))
			if got := !st.CACert.Equal(prev.CACert); got != tc.newCA {
				t.Fatalf("new CA: %v, want %v (%q)", got, tc.newCA, st.Changes)
			}
			if got := !st.ServingCert.Equal(prev.ServingCert); got != tc.newServing {
				t.Fatalf("new serving certificate: %v, want %v (%q)", got, tc.newServing, st.Changes)
			}
			if tc.newCA {
				// The first CA stays trusted: what old pointer configs hold
				// still verifies the new serving chain.
				if len(st.CABundle) != 2 || !st.CABundle[1].Equal(first.CACert) || st.CrossSignedCA == nil {
					t.Fatalf("after a CA rotation: %d CAs in the bundle, cross-signed %v", len(st.CABundle), st.CrossSignedCA != nil)
				}
				if err := verifyServed(t, st, t0.Add(tc.after), first.CACert); err != nil {
					t.Fatalf("the served chain does not verify against the first CA alone: %v", err)
				}
			}
			prev = st
		})
	}
}
