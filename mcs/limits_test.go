package mcs_test

import (
	"bytes"
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/limit"
)

// TestLostVerifyAnswer: a node whose verify answer was lost (the server
// crashed after writing the record, or the connection dropped) sends the
// same verify again and gets a token for the same record, which fetches
// the config once; after that, the session answered again is refused.
func TestLostVerifyAnswer(t *testing.T) {
	e := newEnv(t)
	m := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	ch, r := e.challenge(m, "worker", "worker-3")
	if ch == nil {
		t.Fatalf("challenge refused: %d %s", r.status, r.body)
	}
	body := e.verifyBody(m, ch)
	lost, r := e.verify(body) // its answer never reaches the node
	if lost == nil {
		t.Fatalf("verify refused: %d %s", r.status, r.body)
	}
	again, r := e.verify(body)
	if again == nil {
		t.Fatalf("the same verify again: %d %s; want the same record answered again", r.status, r.body)
	}
	if again.Record != lost.Record || again.NodeName != "worker-3" {
		t.Fatalf("answered again with record %s for %s; want record %s", again.Record, again.NodeName, lost.Record)
	}
	if r := e.do("GET", e.secure.URL+"/config/worker", nil, bearer(again.ConfigToken)); r.status != 200 {
		t.Fatalf("fetch with the second answer's token: %d %s", r.status, r.body)
	}
	// Both answers' tokens share one single-use ID: one config per session.
	if r := e.do("GET", e.secure.URL+"/config/worker", nil, bearer(lost.ConfigToken)); r.reason != attest.ReasonTokenUsed {
		t.Fatalf("the lost answer's token after the config was delivered: %d %q", r.status, r.reason)
	}
	if _, r := e.verify(body); r.reason != attest.ReasonSessionReused {
		t.Fatalf("the session answered a third time, after delivery: %d %q", r.status, r.reason)
	}
	if recs, _ := e.store.RecordsForNode(context.Background(), "worker-3"); len(recs) != 1 {
		t.Fatalf("%d records; answering a session again must write none", len(recs))
	}
}

// TestLimits: over a source's or an identity's rate, requests are refused
// RateLimited with a Retry-After, before any work; another source is not
// affected; a full gate refuses Overloaded.
func TestLimits(t *testing.T) {
	type req struct {
		method, path string
		body         []byte
	}
	challengeJunk := req{"POST", api.PathChallenge, []byte(`{"kind":"tpm","pool":"worker","kubeletPublicKey":"AA=="}`)}
	config := req{"GET", "/config/worker", nil}
	cases := []struct {
		name   string
		limits func(clock func() time.Time) mcs.Limits
		// sends, in order, each answered with wantStatus/wantReason.
		sends []req
		want  []attest.Reason // "" for not limited (whatever the request's own answer)
	}{
		{"attestation requests per source",
			func(clock func() time.Time) mcs.Limits {
				return mcs.Limits{AttestPerSource: limit.NewBuckets(limit.Rate{PerSecond: 0.01, Burst: 2}, 0, clock)}
			},
			[]req{challengeJunk, challengeJunk, challengeJunk, config},
			[]attest.Reason{"", "", attest.ReasonRateLimited, ""}},
		{"config requests per source",
			func(clock func() time.Time) mcs.Limits {
				return mcs.Limits{ConfigPerSource: limit.NewBuckets(limit.Rate{PerSecond: 0.01, Burst: 1}, 0, clock)}
			},
			[]req{config, config, challengeJunk},
			[]attest.Reason{"", attest.ReasonRateLimited, ""}},
		{"no slot for an attestation",
			func(clock func() time.Time) mcs.Limits { return mcs.Limits{Attestations: fullGate(t)} },
			[]req{challengeJunk, config},
			[]attest.Reason{attest.ReasonOverloaded, ""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvLimits(t, nil, tc.limits(time.Now))
			for i, s := range tc.sends {
				r := e.do(s.method, e.secure.URL+s.path, s.body, map[string]string{"Content-Type": "application/json"})
				limited := r.reason == attest.ReasonRateLimited || r.reason == attest.ReasonOverloaded
				if tc.want[i] == "" && limited || tc.want[i] != "" && r.reason != tc.want[i] {
					t.Fatalf("request %d (%s %s): %d %q; want %q", i, s.method, s.path, r.status, r.reason, tc.want[i])
				}
				if tc.want[i] != "" {
					secs, err := strconv.Atoi(r.header.Get("Retry-After"))
					if r.status != 503 || err != nil || secs < 1 {
						t.Fatalf("request %d: status %d Retry-After %q; want 503 with a Retry-After of at least 1 s", i, r.status, r.header.Get("Retry-After"))
					}
				}
			}
		})
	}
}

// fullGate is a gate whose only slot is taken for the test's duration.
func fullGate(t *testing.T) *limit.Gate {
	g := limit.NewGate(1, 10*time.Millisecond)
	leave := g.Enter(context.Background())
	t.Cleanup(leave)
	return g
}

// TestPerIdentityLimit: challenges claiming one TPM are held to the
// identity's rate whatever their source, and so are successful
// attestations of one verified identity; another TPM is not affected.
func TestPerIdentityLimit(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(2e9, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	e := newEnvLimits(t, nil, mcs.Limits{PerIdentity: limit.NewBuckets(limit.Rate{PerSecond: 1.0 / 60, Burst: 1}, 0, clock)})
	a := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))
	b := e.newMachine(firmwaretestdata.MustLog("rhel8-uefi"))

	ch1, r := e.challenge(a, "worker", "a")
	if ch1 == nil {
		t.Fatalf("first challenge of TPM a: %d %s", r.status, r.body)
	}
	if _, r := e.challenge(a, "worker", "a"); r.reason != attest.ReasonRateLimited {
		t.Fatalf("second challenge of TPM a at once: %d %q; want RateLimited", r.status, r.reason)
	}
	if ch, r := e.challenge(b, "worker", "b"); ch == nil {
		t.Fatalf("TPM b while a is limited: %d %s", r.status, r.body)
	}
	advance(time.Minute)
	ch2, r := e.challenge(a, "worker", "a")
	if ch2 == nil {
		t.Fatalf("challenge of TPM a a minute later: %d %s", r.status, r.body)
	}
	if vr, r := e.verify(e.verifyBody(a, ch1)); vr == nil {
		t.Fatalf("first attestation of TPM a: %d %s", r.status, r.body)
	}
	// The second session of a is valid, but its verified identity has
	// used its token: no second record now.
	if _, r := e.verify(e.verifyBody(a, ch2)); r.reason != attest.ReasonRateLimited {
		t.Fatalf("second attestation of TPM a at once: %d %q; want RateLimited", r.status, r.reason)
	}
	if recs, _ := e.store.RecordsForNode(context.Background(), "a"); len(recs) != 1 {
		t.Fatalf("%d records for a; a limited attestation must write none", len(recs))
	}
	if !bytes.Contains([]byte(e.log.String()), []byte(`"reason":"RateLimited"`)) {
		t.Fatal("the refusal was not logged with its reason")
	}
}
