package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/mcs/rejudge"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// listCounter counts the passes (one list each).
type listCounter struct {
	rejudge.Store
	lists atomic.Int32
}

func (l *listCounter) Bindings(ctx context.Context) ([]*store.Binding, error) {
	l.lists.Add(1)
	return l.Store.Bindings(ctx)
}

// TestFleetJudge: when serve re-judges the fleet. Only while this replica
// leads; the version in force once it leads (at its start, or when it
// wins the Lease); each version applied at once and once more a settle
// later; never two passes at once; the counts in
// nodeproof_server_policy_rejudged_nodes_total.
func TestFleetJudge(t *testing.T) {
	ctx := context.Background()
	var (
		mu  sync.Mutex
		now = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), time.Second, clock)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	kernel := strings.Repeat("a", 64)
	c := attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{PCRBank: "sha256", EKTrust: "ca:vendor", EKKind: attest.EKKindRSA2048}}
	c.TPM.Boot.BootApplications = []string{strings.Repeat("1", 64), strings.Repeat("2", 64), kernel}
	cl, _ := json.Marshal(c)
	r := &store.Record{ID: strings.Repeat("0", 24), NodeName: "w-1", Pool: "worker", Kind: attest.KindTPM, Identity: "tpm-ek:1",
		KubeletKeySHA256: make([]byte, 32), CreatedAt: now, Expires: now.Add(time.Hour)}
	if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpdateStatus(ctx, "w-1", r.Identity, func(b *store.Binding) error {
		at := now.Add(time.Minute)
		b.Status = store.AttestationStatus{LastAttempt: at, LastSuccess: at, Passed: true, Claims: cl}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	before := policytest.New().Pool("worker", policytest.TPM()).Must(t)
	deny := policytest.New().Pool("worker", policytest.TPM().Edit(func(p *policy.Pool) { p.TPM.DeniedDigests = []string{kernel} })).Must(t)

	var leading atomic.Bool
	lc := &listCounter{Store: st}
	var log bytes.Buffer
	reg := prometheus.NewRegistry()
	f, err := newFleetJudge(rejudge.Options{Store: lc, Clock: clock, Log: slog.New(slog.NewTextHandler(&log, nil))}, leading.Load, time.Minute, reg)
	if err != nil {
		t.Fatal(err)
	}
	settled := func() {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			f.mu.Lock()
			running := f.running
			f.mu.Unlock()
			if !running {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("a pass did not end")
			}
		}
	}
	passed := func() bool {
		b, err := st.Binding(ctx, "w-1")
		if err != nil {
			t.Fatal(err)
		}
		return b.Status.Passed
	}
	steps := []struct {
		name    string
		lead    bool
		pol     *policy.Policy
		version string
		applied bool
		advance time.Duration
		lists   int32 // passes so far
		passed  bool
	}{
		{name: "not leading: no pass", lead: false, pol: before, version: "v1", lists: 0, passed: true},
		{name: "leading: the version in force judged", lead: true, pol: before, version: "v1", lists: 1, passed: true},
		{name: "the next look, before the settle: nothing", lead: true, pol: before, version: "v1", lists: 1, passed: true},
		{name: "a settle later: judged once more", lead: true, pol: before, version: "v1", advance: time.Minute, lists: 2, passed: true},
		{name: "then no more within the hour", lead: true, pol: before, version: "v1", advance: 30 * time.Minute, lists: 2, passed: true},
		{name: "an hour after the last pass: judged again", lead: true, pol: before, version: "v1", advance: 30 * time.Minute, lists: 3, passed: true},
		{name: "a version applied: judged at once, the node fails", lead: true, pol: deny, version: "v2", applied: true, lists: 4, passed: false},
		{name: "the Lease lost: nothing", lead: false, pol: before, version: "v3", applied: true, advance: time.Hour, lists: 4, passed: false},
		{name: "the Lease won again: the version in force judged, the node cleared", lead: true, pol: before, version: "v3", lists: 5, passed: true},
	}
	for _, s := range steps {
		leading.Store(s.lead)
		advance(s.advance)
		f.look(ctx, s.pol, s.version, s.applied)
		settled()
		if got := lc.lists.Load(); got != s.lists || passed() != s.passed {
			t.Errorf("%s: %d passes, node passed %v; want %d, %v", s.name, got, passed(), s.lists, s.passed)
		}
	}
	if got := testutil.ToFloat64(f.nodes.WithLabelValues("failed")); got != 1 {
		t.Errorf("failed nodes counted %v; want 1", got)
	}
	if got := testutil.ToFloat64(f.nodes.WithLabelValues("cleared")); got != 1 {
		t.Errorf("cleared nodes counted %v; want 1", got)
	}
	if n := strings.Count(log.String(), "policy re-judged the fleet"); n != 5 {
		t.Errorf("%d summary lines; want one per pass (5):\n%s", n, &log)
	}
	// The fleet's Secure Boot CA standings, counted in each pass's list:
	// one node, from its recorded claims.
	if n := testutil.CollectAndCount(f.cas); n != 1 {
		t.Errorf("%d Secure Boot CA standings; want the one node's", n)
	}
}
