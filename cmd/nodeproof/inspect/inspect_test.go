package inspect_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
	"github.com/nodeproof/nodeproof/store/storetest"
)

var t0 = time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC)

// world is an embedded store with five nodes, one in each state, and a
// released name that only records remember.
func world(t *testing.T) (inspect.Sources, *storetest.Clock) {
	t.Helper()
	clock := &storetest.Clock{}
	clock.Set(t0)
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), time.Second, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	enrol := func(n int, node string) {
		t.Helper()
		if err := st.Enrol(ctx, storetest.Record(storetest.ID(n), node, clock.Now()), store.EnrolOptions{}); err != nil {
			t.Fatalf("enrol %s: %v", node, err)
		}
	}
	enrol(1, "stale-1") // enrolled 4 h before the others: stale
	clock.Set(t0.Add(4 * time.Hour))
	enrol(2, "fresh-1")
	enrol(3, "failed-1")
	enrol(4, "revoked-1")
	enrol(5, "gone-1")
	enrol(6, "banned-gone-1")
	clock.Set(t0.Add(4*time.Hour + time.Minute))
	claims, _ := json.Marshal(attest.Claims{Kind: attest.KindTPM, Identity: "ek:" + storetest.ID(3),
		TPM: &attest.TPMClaims{ResetCount: 7, Boot: attest.BootState{SecureBootKnown: true}}})
	if _, err := st.UpdateStatus(ctx, "failed-1", "ek:"+storetest.ID(3), func(b *store.Binding) error {
		b.Status = store.AttestationStatus{LastAttempt: clock.Now(), Passed: false, Reason: string(attest.ReasonPolicySecureBootOff),
			Message: "Secure Boot is off", Boots: 2, ResetCount: 7, Summary: "EK trusted; Secure Boot off", Claims: claims, SessionIssuedAt: clock.Now()}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateStatus(ctx, "fresh-1", "ek:"+storetest.ID(2), func(b *store.Binding) error {
		b.Status = store.AttestationStatus{LastAttempt: clock.Now(), LastSuccess: clock.Now(), Passed: true, Boots: 1, SessionIssuedAt: clock.Now(),
			Audit: "bootComponents.kernel: BootComponentNotAllowed: kernel 6b1bf35c is not in pools.worker.tpm.bootComponents.kernel.allow"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Revoke(ctx, "revoked-1", "RMA ticket 42", clock.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Release(ctx, "gone-1", store.Act{By: "alice", Reason: "RMA"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Ban(ctx, store.Ban{NodeName: "banned-gone-1", At: clock.Now(), By: "bob", Reason: "disk stolen"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Release(ctx, "banned-gone-1", store.Act{By: "bob"}); err != nil {
		t.Fatal(err)
	}
	return inspect.Sources{Store: st, Clock: clock.Now, Fresh: func(string) time.Duration { return 3 * time.Hour }}, clock
}

func TestList(t *testing.T) {
	src, _ := world(t)
	nodes, err := inspect.List(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ name, state, reason string }{
		{"failed-1", inspect.StateFailed, string(attest.ReasonPolicySecureBootOff)},
		{"fresh-1", inspect.StateAttested, ""},
		{"revoked-1", inspect.StateRevoked, string(attest.ReasonRevoked)},
		{"stale-1", inspect.StateStale, string(attest.ReasonAttestationStale)},
	}
	if len(nodes) != len(want) {
		t.Fatalf("listed %d nodes, want %d (a released name is no node): %+v", len(nodes), len(want), nodes)
	}
	for i, w := range want {
		n := nodes[i]
		if n.Name != w.name || n.State != w.state || n.Reason != w.reason {
			t.Errorf("row %d: %s %s %q, want %s %s %q", i, n.Name, n.State, n.Reason, w.name, w.state, w.reason)
		}
	}
	if nodes[0].Boots != 2 || !nodes[0].LastAttempt.Equal(t0.Add(4*time.Hour+time.Minute)) {
		t.Errorf("failed-1: boots %d, last attempt %s; want 2 and the failed attempt's time", nodes[0].Boots, nodes[0].LastAttempt)
	}

	var tbl bytes.Buffer
	if err := inspect.WriteList(&tbl, inspect.FormatTable, nodes); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(tbl.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "NODE") {
		t.Fatalf("table:\n%s", tbl.String())
	}
	if f := strings.Fields(lines[1]); f[0] != "failed-1" || f[len(f)-2] != "Failed" || f[len(f)-1] != string(attest.ReasonPolicySecureBootOff) {
		t.Errorf("table row %q: want failed-1 … Failed %s", lines[1], attest.ReasonPolicySecureBootOff)
	}

	for _, format := range []string{inspect.FormatJSON, inspect.FormatYAML} {
		var out bytes.Buffer
		if err := inspect.WriteList(&out, format, nodes); err != nil {
			t.Fatal(err)
		}
		var back struct{ Nodes []inspect.Node }
		if err := yaml.Unmarshal(out.Bytes(), &back); err != nil { // YAML is a superset of JSON
			t.Fatalf("%s does not read back: %v\n%s", format, err, out.String())
		}
		if len(back.Nodes) != 4 || back.Nodes[2].Name != "revoked-1" || back.Nodes[2].Message != "RMA ticket 42" {
			t.Errorf("%s read back as %+v", format, back.Nodes)
		}
	}
}

// TestListAll: the overview shows the banned identities (by identity, with
// the name each held) and the released names no machine holds now.
func TestListAll(t *testing.T) {
	src, _ := world(t)
	o, err := inspect.ListAll(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	var bans, released []string
	for _, b := range o.Bans {
		bans = append(bans, b.Identity+"@"+b.NodeName+" by "+b.By)
	}
	for _, h := range o.Released {
		released = append(released, h.NodeName)
	}
	wantBans := []string{"ek:" + storetest.ID(4) + "@revoked-1 by ", "ek:" + storetest.ID(6) + "@banned-gone-1 by bob"}
	if len(o.Nodes) != 4 || strings.Join(bans, ",") != strings.Join(wantBans, ",") || strings.Join(released, ",") != "banned-gone-1,gone-1" {
		t.Fatalf("overview: %d nodes, bans %q, released %q; want 4, %q, [banned-gone-1 gone-1]", len(o.Nodes), bans, released, wantBans)
	}
	var tbl bytes.Buffer
	if err := inspect.WriteOverview(&tbl, inspect.FormatTable, o); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"Banned identities (2", "disk stolen", "Released names no machine holds now (2", "ek:" + storetest.ID(6) + " (revoked)", "alice"} {
		if !strings.Contains(tbl.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, tbl.String())
		}
	}
	var js bytes.Buffer
	if err := inspect.WriteOverview(&js, inspect.FormatJSON, o); err != nil {
		t.Fatal(err)
	}
	var back inspect.Overview
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Nodes) != 4 || len(back.Bans) != 2 || len(back.Released) != 2 {
		t.Fatalf("JSON read back: %+v, %v", back, err)
	}
}

func TestStory(t *testing.T) {
	src, _ := world(t)
	ctx := context.Background()
	cases := []struct {
		node, state string
		records     int
		in          []string // in the table output
	}{
		{"fresh-1", inspect.StateAttested, 1, []string{"State:", "Attested", storetest.ID(2), "EK trusted; Secure Boot on", "embedded store has no cluster",
			"Audit:", "rules in audit mode would have refused it: bootComponents.kernel: BootComponentNotAllowed"}},
		{"failed-1", inspect.StateFailed, 1, []string{"Failed (" + string(attest.ReasonPolicySecureBootOff) + ")", "Secure Boot is off", "failed: " + string(attest.ReasonPolicySecureBootOff),
			"EK trusted; Secure Boot off", "Claims (latest attestation):", "resetCount: 7", "2 since enrolment (TPM reset count 7"}},
		{"revoked-1", inspect.StateRevoked, 1, []string{"Revoked (Revoked)", "RMA ticket 42"}},
		{"stale-1", inspect.StateStale, 1, []string{"Stale (" + string(attest.ReasonAttestationStale) + ")", "window 3h0m0s"}},
		{"gone-1", inspect.StateReleased, 1, []string{"Released", "no identity owns the name", storetest.ID(5), "by alice from ek:" + storetest.ID(5)}},
		{"banned-gone-1", inspect.StateReleased, 1, []string{"Banned:", "ek:" + storetest.ID(6), "by bob: disk stolen", ", revoked)"}},
	}
	for _, c := range cases {
		t.Run(c.node, func(t *testing.T) {
			s, err := inspect.StoryOf(ctx, src, c.node)
			if err != nil {
				t.Fatal(err)
			}
			if s.State != c.state || len(s.Records) != c.records || s.Cluster != nil {
				t.Errorf("state %s, %d records, cluster %v; want %s, %d, none", s.State, len(s.Records), s.Cluster, c.state, c.records)
			}
			var out bytes.Buffer
			if err := inspect.WriteStory(&out, inspect.FormatTable, s); err != nil {
				t.Fatal(err)
			}
			for _, w := range c.in {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			out.Reset()
			if err := inspect.WriteStory(&out, inspect.FormatJSON, s); err != nil {
				t.Fatal(err)
			}
			var back inspect.Story
			if err := json.Unmarshal(out.Bytes(), &back); err != nil || back.Name != c.node || back.State != c.state {
				t.Errorf("JSON read back as %s %s (%v)", back.Name, back.State, err)
			}
		})
	}
	if _, err := inspect.StoryOf(ctx, src, "never-1"); !errors.Is(err, inspect.ErrUnknownNode) {
		t.Errorf("an unknown name: %v, want ErrUnknownNode", err)
	}
}

func TestCheckFormat(t *testing.T) {
	for _, f := range []string{"table", "json", "yaml"} {
		if err := inspect.CheckFormat(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	for _, f := range []string{"", "xml", "JSON"} {
		if err := inspect.CheckFormat(f); err == nil {
			t.Errorf("%q accepted", f)
		}
	}
}
