package mcs_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/seal"
)

// rotateLikeTheCLI rotates e's keyring file as `nodeproof keys rotate`
// does (its own load of the file, then a rotation), with activate.
func (e *env) rotateLikeTheCLI(activate time.Duration) seal.Rotation {
	e.t.Helper()
	k, err := seal.LoadOrCreate(e.keysPath, e.clock)
	if err != nil {
		e.t.Fatal(err)
	}
	rot, err := k.Rotate(seal.DefaultRetain, activate)
	if err != nil {
		e.t.Fatal(err)
	}
	return rot
}

// outcome is a status and reason as the attack table shows it.
func outcome(r result) string {
	if r.reason != "" {
		return fmt.Sprintf("%d %s", r.status, r.reason)
	}
	return fmt.Sprint(r.status)
}

// TestAttackKeyRotationInFlight: an operator rotates a sealing key made
// 25 hours ago with the defaults of `nodeproof keys rotate` (and, for a
// single server, with --activate-after 0) while a session (challenge
// answered, verify not yet sent) and a config token (not yet spent) are in
// flight. Both still work: a key is retired from when it stopped sealing,
// not from its creation. Sessions that straddle the new key's activation
// work too.
func TestAttackKeyRotationInFlight(t *testing.T) {
	cases := []struct {
		name     string
		activate time.Duration
	}{
		{"defaults (staged 2 minutes)", seal.DefaultActivateAfter},
		{"--activate-after 0", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.advance(25 * time.Hour) // the key was made 25 hours ago
			log := firmwaretestdata.MustLog("rhel8-uefi")
			inFlight := e.newMachine(log)
			ch, r := e.challenge(inFlight, "worker", "rotation-session")
			if ch == nil {
				t.Fatalf("challenge: %d %s", r.status, r.body)
			}
			holder := e.newMachine(log)
			ch2, _ := e.challenge(holder, "worker", "rotation-token")
			vr, r := e.verify(e.verifyBody(holder, ch2))
			if vr == nil {
				t.Fatalf("verify: %d %s", r.status, r.body)
			}

			rot := e.rotateLikeTheCLI(tc.activate)
			if len(rot.Kept) != 1 || len(rot.Dropped) != 0 {
				t.Errorf("rotation kept %v, dropped %v", rot.Kept, rot.Dropped)
			}
			if changed, err := e.opts.Keys.Reload(); err != nil || !changed {
				t.Fatalf("server reload: %v %v", changed, err)
			}
			attack := "sealing key made 25 h ago rotated with " + tc.name + ": "
			_, r = e.verify(e.verifyBody(inFlight, ch))
			attacktable.Check(t, "sealing keys", attack+"the session of a challenge answered before the rotation", "200", outcome(r))
			r = e.do("GET", e.secure.URL+"/config/worker", nil, bearer(vr.ConfigToken))
			attacktable.Check(t, "sealing keys", attack+"a config token issued before the rotation", "200", outcome(r))

			// A session sealed just before the new key's activation is
			// answered after it.
			e.advance(tc.activate - time.Second)
			late := e.newMachine(log)
			ch3, _ := e.challenge(late, "worker", "rotation-straddle")
			e.advance(2 * time.Second)
			vr3, r := e.verify(e.verifyBody(late, ch3))
			if vr3 == nil {
				t.Fatalf("a session sealed before activation, answered after: %d %s", r.status, r.body)
			}
			if r := e.do("GET", e.secure.URL+"/config/worker", nil, bearer(vr3.ConfigToken)); r.status != 200 {
				t.Fatalf("fetch after activation: %d %s", r.status, r.body)
			}
		})
	}
}

// TestAttackKeyRotationTwoReplicas: two replicas share a store and a
// keyring file; an operator rotates with the defaults and one replica
// picks the file up at once, the other 90 seconds later. Machines go
// back and forth between them (challenge on one, verify and fetch on the
// other) before, during and after the staged activation: nothing is
// refused, and after activation the new key seals.
func TestAttackKeyRotationTwoReplicas(t *testing.T) {
	e := newEnv(t)
	e.advance(25 * time.Hour)
	keysB, err := seal.LoadOrCreate(e.keysPath, e.clock)
	if err != nil {
		t.Fatal(err)
	}
	keysB.SetMaxLife(15 * time.Minute)
	e.opts.Keys.SetMaxLife(15 * time.Minute)
	ob := e.opts
	ob.Keys = keysB
	srvB, err := mcs.New(ob)
	if err != nil {
		t.Fatal(err)
	}
	b := httptest.NewTLSServer(srvB.Handler(mcs.Secure))
	t.Cleanup(b.Close)
	a := e.secure
	oldOnly, err := seal.LoadOrCreate(e.keysPath, e.clock) // a copy that never sees the rotation
	if err != nil {
		t.Fatal(err)
	}

	log := firmwaretestdata.MustLog("rhel8-uefi")
	var refusals, exchanges, n int
	exchange := func(first, second *httptest.Server) (session string) {
		n++
		m := e.newMachine(log)
		ch, r := e.challengeAt(first.URL, m, "worker", fmt.Sprintf("replica-%d", n))
		exchanges++
		if ch == nil {
			t.Logf("challenge %d refused: %d %s", n, r.status, r.body)
			refusals++
			return ""
		}
		vr, r := e.verifyAt(second.URL, e.verifyBody(m, ch))
		if vr == nil {
			t.Logf("verify %d refused: %d %s", n, r.status, r.body)
			refusals++
			return ch.Session
		}
		if r := e.do("GET", first.URL+api.PathConfig+"worker", nil, bearer(vr.ConfigToken)); r.status != 200 {
			t.Logf("fetch %d refused: %d %s", n, r.status, r.body)
			refusals++
		}
		return ch.Session
	}
	both := func() {
		exchange(a, b)
		exchange(b, a)
	}
	both()
	e.rotateLikeTheCLI(seal.DefaultActivateAfter)
	if _, err := e.opts.Keys.Reload(); err != nil {
		t.Fatal(err)
	}
	both() // A has the new key, B does not
	e.advance(60 * time.Second)
	both()
	e.advance(30 * time.Second)
	if _, err := keysB.Reload(); err != nil {
		t.Fatal(err)
	}
	both() // both have it; it is not active yet
	e.advance(seal.DefaultActivateAfter - 90*time.Second + time.Second)
	session := exchange(a, b) // after activation
	both()
	attacktable.Check(t, "sealing keys", "two replicas through a staged rotation, one reloading 90 s late, machines crossing between them: refusals",
		"0", fmt.Sprint(refusals))
	if _, err := oldOnly.Open("attest-session", session); err == nil {
		t.Error("after activation the old key still seals")
	}
	t.Logf("%d exchanges across the rotation", exchanges)
}

// challengeAt is challenge against the server at base.
func (e *env) challengeAt(base string, m *machine, pool, node string) (*api.ChallengeResponse, result) {
	req, err := m.collector.Request()
	if err != nil {
		e.t.Fatal(err)
	}
	body, _ := json.Marshal(api.ChallengeRequest{Kind: attest.KindTPM, Pool: pool, KubeletPublicKey: m.keyDER, NodeName: node, Request: api.Message(req)})
	r := e.do("POST", base+api.PathChallenge, body, map[string]string{"Content-Type": "application/json"})
	if r.status != 200 {
		return nil, r
	}
	var resp api.ChallengeResponse
	if err := json.Unmarshal(r.body, &resp); err != nil {
		e.t.Fatal(err)
	}
	return &resp, r
}

// verifyAt is verify against the server at base.
func (e *env) verifyAt(base string, body []byte) (*api.VerifyResponse, result) {
	r := e.do("POST", base+api.PathVerify, body, nil)
	if r.status != 200 {
		return nil, r
	}
	var resp api.VerifyResponse
	if err := json.Unmarshal(r.body, &resp); err != nil {
		e.t.Fatal(err)
	}
	return &resp, r
}
