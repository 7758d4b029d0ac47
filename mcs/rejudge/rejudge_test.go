package rejudge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

// The boot chains of the tests' nodes: the same shim and GRUB, kernel A
// (which a policy change denies) or kernel B.
var (
	shim, grub       = strings.Repeat("1", 64), strings.Repeat("2", 64)
	kernelA, kernelB = strings.Repeat("a", 64), strings.Repeat("b", 64)
	t0               = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
)

func claims(t testing.TB, kernel string) []byte {
	t.Helper()
	c := attest.Claims{Kind: attest.KindTPM, Identity: "x", TPM: &attest.TPMClaims{PCRBank: "sha256", EKTrust: "ca:vendor", EKKind: attest.EKKindRSA2048}}
	c.TPM.Boot.SecureBootKnown, c.TPM.Boot.SecureBoot = true, true
	c.TPM.Boot.BootApplications = []string{shim, grub, kernel}
	c.TPM.Boot.DBXKnown, c.TPM.Boot.DBXEntries = true, 3
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Policies: before (any boot), deny (kernel A denied), audited (the same
// denial in audit mode), dbx (a dbx entry required: not in records).
func policies(t testing.TB) (before, deny, audited, dbx *policy.Policy) {
	denyA := func(p *policy.Pool) { p.TPM.DeniedDigests = []string{kernelA} }
	before = policytest.New().Pool("worker", policytest.TPM()).Must(t)
	deny = policytest.New().Pool("worker", policytest.TPM().Edit(denyA)).Must(t)
	audited = policytest.New().Pool("worker", policytest.TPM().Edit(denyA).Audit(policy.RuleDeniedDigests)).Must(t)
	dbx = policytest.New().Pool("worker", policytest.TPM().Edit(func(p *policy.Pool) {
		p.TPM.MinimumDBX = &policy.MinimumDBX{Contains: []string{strings.Repeat("d", 64)}}
	})).Must(t)
	return
}

// node is a node of the test fleet and its state before a pass.
type node struct {
	name    string
	kernel  string // "": never re-attested since its enrolment
	failed  bool   // its last attempt failed
	revoked bool
}

var fleet = []node{
	{name: "pass-a", kernel: kernelA},
	{name: "pass-b", kernel: kernelB},
	{name: "failed-a", kernel: kernelA, failed: true},
	{name: "revoked-a", kernel: kernelA, revoked: true},
	{name: "new"},
}

func identity(name string) string { return "tpm-ek:" + name }

// enrol writes the fleet into st: enrolled at t0, re-attested at t0+1h.
func enrol(t *testing.T, st store.Store) {
	t.Helper()
	ctx := context.Background()
	for i, n := range fleet {
		r := &store.Record{ID: fmt.Sprintf("%024x", i+1), NodeName: n.name, Pool: "worker", Kind: attest.KindTPM, Identity: identity(n.name),
			KubeletKeySHA256: bytes.Repeat([]byte{byte(i + 1)}, 32), CreatedAt: t0, Expires: t0.Add(time.Hour)}
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		if n.kernel != "" {
			at := t0.Add(time.Hour)
			if _, err := st.UpdateStatus(ctx, n.name, r.Identity, func(b *store.Binding) error {
				b.Status = store.AttestationStatus{LastAttempt: at, LastSuccess: at, Passed: true, SessionIssuedAt: at.Add(-time.Second),
					Summary: "tpm", Claims: claims(t, n.kernel)}
				if n.failed {
					b.Status.Passed, b.Status.LastSuccess = false, t0
					b.Status.Reason, b.Status.Message = string(attest.ReasonPolicySecureBootOff), "a real failure"
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		if n.revoked {
			if _, err := st.Revoke(ctx, n.name, "stolen", t0.Add(2*time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// recorder keeps the Events of a pass.
type recorder struct {
	mu     sync.Mutex
	events []string // "node reason warning"
}

func (r *recorder) Decision(identity, node string, warning bool, reason, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("%s %s %v", node, reason, warning))
}

// counting counts the status writes a pass asks for, and can run a
// re-attestation between the list and the writes.
type counting struct {
	store.Store
	updates    int
	afterList  func()
	listedOnce bool
}

func (c *counting) Bindings(ctx context.Context) ([]*store.Binding, error) {
	bs, err := c.Store.Bindings(ctx)
	if c.afterList != nil && !c.listedOnce {
		c.listedOnce = true
		c.afterList()
	}
	return bs, err
}

func (c *counting) UpdateStatus(ctx context.Context, node, id string, fn func(*store.Binding) error) (*store.Binding, error) {
	c.updates++
	return c.Store.UpdateStatus(ctx, node, id, fn)
}

// stores are the two stores: open, called in a test that lasts as long
// as the stores it makes, gives a fresh store per call.
func stores() map[string]func(t *testing.T) func(t *testing.T) store.Store {
	clock := func() time.Time { return t0.Add(3 * time.Hour) }
	return map[string]func(t *testing.T) func(t *testing.T) store.Store{
		"embedded (bbolt)": func(*testing.T) func(t *testing.T) store.Store {
			return func(t *testing.T) store.Store {
				st, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), time.Second, clock)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { st.Close() })
				return st
			}
		},
		"the API server (kubestore)": func(t *testing.T) func(t *testing.T) store.Store {
			cfg := kubetest.Start(t, "../../deploy/crds")
			kc, err := kubestore.NewClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			admin, err := client.New(cfg, client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return func(t *testing.T) store.Store {
				ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "rejudge-"}}
				if err := admin.Create(context.Background(), ns); err != nil {
					t.Fatal(err)
				}
				st, err := kubestore.New(kc, ns.Name, clock)
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
		},
	}
}

// TestRun: a policy change re-judges every node's last verified claims
// at once, on both stores; only the nodes whose state changes are
// written; a revoked node, a node whose last attempt failed and a node
// never re-attested are not touched.
func TestRun(t *testing.T) {
	before, deny, audited, _ := policies(t)
	at := t0.Add(3 * time.Hour)
	type want struct {
		counts Counts            // Took ignored
		passed map[string]bool   // node: Status.Passed after (listed nodes only)
		reason map[string]string // node: Status.Reason after
		events []string
	}
	cases := []struct {
		name string
		// pols are applied in turn; the last pass's counts are checked.
		pols []*policy.Policy
		// race, when set, runs between the last pass's list and its writes.
		race func(t *testing.T, st store.Store)
		want want
		// pass-a, when set, is what pass-a's binding must be after.
		passA func(b *store.Binding) string
	}{
		{
			name: "a denied digest fails the passing node that booted it, without a re-attestation",
			pols: []*policy.Policy{deny},
			want: want{
				counts: Counts{Nodes: 5, Judged: 2, Skipped: 3, Failed: 1},
				passed: map[string]bool{"pass-a": false, "pass-b": true, "failed-a": false, "revoked-a": true},
				reason: map[string]string{"pass-a": string(attest.ReasonPolicyBootDenied), "failed-a": string(attest.ReasonPolicySecureBootOff)},
				events: []string{"pass-a PolicyRejudged true"},
			},
			passA: func(b *store.Binding) string {
				st := b.Status
				ok, why, _ := b.Attested(at, 24*time.Hour)
				switch {
				case ok || why != attest.ReasonAttestationFailed:
					return fmt.Sprintf("attested %v %s; want refused AttestationFailed (the approver taints it)", ok, why)
				case !st.Rejudged.Equal(at):
					return fmt.Sprintf("rejudged %v; want %v", st.Rejudged, at)
				case !strings.HasPrefix(st.Message, "the policy in force changed (version v2) and refuses the claims of the node's last passing attestation (2026-06-01T13:00:00Z): "):
					return "message " + st.Message
				case !st.LastAttempt.Equal(t0.Add(time.Hour)) || !st.LastSuccess.Equal(t0.Add(time.Hour)) || !sameJSON(st.Claims, claims(t, kernelA)):
					return fmt.Sprintf("the attempt's fields changed: %+v", st)
				}
				return ""
			},
		},
		{
			name: "a policy that passes everything writes nothing",
			pols: []*policy.Policy{before},
			want: want{
				counts: Counts{Nodes: 5, Judged: 2, Skipped: 3},
				passed: map[string]bool{"pass-a": true, "pass-b": true, "failed-a": false},
			},
		},
		{
			name: "a rule in audit mode records the audit and does not fail the node",
			pols: []*policy.Policy{audited},
			want: want{
				counts: Counts{Nodes: 5, Judged: 2, Skipped: 3, Audited: 1},
				passed: map[string]bool{"pass-a": true, "pass-b": true},
				events: []string{"pass-a PolicyAuditRefusal true"},
			},
			passA: func(b *store.Binding) string {
				if ok, _, _ := b.Attested(at, 24*time.Hour); !ok || !strings.HasPrefix(b.Status.Audit, "deniedDigests: BootComponentDenied: ") {
					return fmt.Sprintf("attested %v, audit %q; want attested, the audit recorded", ok, b.Status.Audit)
				}
				return ""
			},
		},
		{
			name: "reverting the policy clears only the re-judged failure",
			pols: []*policy.Policy{deny, before},
			want: want{
				counts: Counts{Nodes: 5, Judged: 2, Skipped: 3, Cleared: 1},
				passed: map[string]bool{"pass-a": true, "pass-b": true, "failed-a": false},
				reason: map[string]string{"pass-a": "", "failed-a": string(attest.ReasonPolicySecureBootOff)},
				events: []string{"pass-a PolicyRejudged false"},
			},
			passA: func(b *store.Binding) string {
				if ok, why, _ := b.Attested(at, 24*time.Hour); !ok || !b.Status.Rejudged.IsZero() || b.Status.Message != "" {
					return fmt.Sprintf("attested %v %s, status %+v; want attested, nothing of the re-judge left", ok, why, b.Status)
				}
				return ""
			},
		},
		{
			name: "judged again by the same policy: nothing written",
			pols: []*policy.Policy{deny, deny},
			want: want{
				counts: Counts{Nodes: 5, Judged: 2, Skipped: 3},
				passed: map[string]bool{"pass-a": false, "pass-b": true},
			},
		},
		{
			name: "a re-attestation between the list and the write is not lost",
			pols: []*policy.Policy{deny},
			race: func(t *testing.T, st store.Store) {
				// pass-a reboots into kernel B and re-attests.
				later := at.Add(-time.Minute)
				if _, err := st.UpdateStatus(context.Background(), "pass-a", identity("pass-a"), func(b *store.Binding) error {
					b.Status.LastAttempt, b.Status.LastSuccess, b.Status.SessionIssuedAt = later, later, later
					b.Status.Passed, b.Status.Claims = true, claims(t, kernelB)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			},
			want: want{
				counts: Counts{Nodes: 5, Judged: 2, Skipped: 3, Raced: 1},
				passed: map[string]bool{"pass-a": true, "pass-b": true},
			},
		},
	}
	for sname, open := range stores() {
		t.Run(sname, func(t *testing.T) {
			newStore := open(t)
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					st := newStore(t)
					enrol(t, st)
					ctx := context.Background()
					for _, pol := range tc.pols[:len(tc.pols)-1] {
						if _, err := Run(ctx, Options{Store: st, Policy: pol, Clock: func() time.Time { return at }}); err != nil {
							t.Fatal(err)
						}
					}
					cs := &counting{Store: st}
					if tc.race != nil {
						cs.afterList = func() { tc.race(t, st) }
					}
					ev := &recorder{}
					var log bytes.Buffer
					got, err := Run(ctx, Options{Store: cs, Policy: tc.pols[len(tc.pols)-1], Version: "v2", Clock: func() time.Time { return at },
						Events: ev, Log: slog.New(slog.NewTextHandler(&log, nil))})
					if err != nil {
						t.Fatal(err)
					}
					got.Took = 0
					if got != tc.want.counts {
						t.Errorf("counts %+v; want %+v", got, tc.want.counts)
					}
					// Bounded writes: a status update only for a node listed as
					// changing (the race's node is asked for, and found unchanged).
					wantUpdates := tc.want.counts.Writes() + tc.want.counts.Raced
					if cs.updates != wantUpdates {
						t.Errorf("%d status updates; want %d", cs.updates, wantUpdates)
					}
					for node, passed := range tc.want.passed {
						b, err := st.Binding(ctx, node)
						if err != nil {
							t.Fatal(err)
						}
						if b.Status.Passed != passed {
							t.Errorf("%s: passed %v; want %v (%s %s)", node, b.Status.Passed, passed, b.Status.Reason, b.Status.Message)
						}
						if r, ok := tc.want.reason[node]; ok && b.Status.Reason != r {
							t.Errorf("%s: reason %q; want %q", node, b.Status.Reason, r)
						}
					}
					if tc.passA != nil {
						b, err := st.Binding(ctx, "pass-a")
						if err != nil {
							t.Fatal(err)
						}
						if msg := tc.passA(b); msg != "" {
							t.Errorf("pass-a: %s", msg)
						}
					}
					if fmt.Sprint(ev.events) != fmt.Sprint(tc.want.events) {
						t.Errorf("events %v; want %v", ev.events, tc.want.events)
					}
					if n := strings.Count(log.String(), "policy re-judged the fleet"); n != 1 {
						t.Errorf("%d summary lines; want 1:\n%s", n, &log)
					}
				})
			}
		})
	}
}

// TestJudge: what can and cannot be judged from records: a node is never
// passed or failed on what its status does not hold.
func TestJudge(t *testing.T) {
	before, deny, _, dbx := policies(t)
	at := t0.Add(time.Hour)
	binding := func(edit func(b *store.Binding)) *store.Binding {
		b := &store.Binding{NodeName: "n", Pool: "worker", Kind: attest.KindTPM, Identity: "tpm-ek:n", EnrolledAt: t0,
			Status: store.AttestationStatus{LastAttempt: at, LastSuccess: at, Passed: true, Claims: claims(t, kernelA)}}
		if edit != nil {
			edit(b)
		}
		return b
	}
	cases := []struct {
		name   string
		pol    *policy.Policy
		b      *store.Binding
		want   Outcome
		reason attest.Reason
		why    string // a part of Why
	}{
		{"passing claims", before, binding(nil), Pass, "", ""},
		{"a denied kernel", deny, binding(nil), Fail, attest.ReasonPolicyBootDenied, ""},
		{"no claims recorded (enrolled, not re-attested)", deny, binding(func(b *store.Binding) { b.Status = store.AttestationStatus{} }), NotJudged, "", "no claims recorded"},
		{"enrolled again after the claims recorded", deny, binding(func(b *store.Binding) { b.EnrolledAt = at.Add(time.Minute) }), NotJudged, "", "enrolled again"},
		{"claims that do not decode", deny, binding(func(b *store.Binding) { b.Status.Claims = []byte("{") }), NotJudged, "", "do not decode"},
		{"a dbx entry required: the entries are not recorded", dbx, binding(nil), NotJudged, "", "dbx's entries are not recorded"},
		{"a dbx entry required and a denied kernel: fails by what is recorded", policytest.New().Pool("worker", policytest.TPM().Edit(func(p *policy.Pool) {
			p.TPM.DeniedDigests = []string{kernelA}
			p.TPM.MinimumDBX = &policy.MinimumDBX{Contains: []string{strings.Repeat("d", 64)}}
		})).Must(t), binding(nil), Fail, attest.ReasonPolicyBootDenied, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := Judge(tc.pol, tc.b, at)
			if v.Outcome != tc.want || v.Reason() != tc.reason || !strings.Contains(v.Why, tc.why) {
				t.Errorf("%s %s %q (%v); want %s %s %q", v.Outcome, v.Reason(), v.Why, v.Err, tc.want, tc.reason, tc.why)
			}
		})
	}
}

// sameJSON: a and b are the same claims (the API server orders an
// object's members its own way).
func sameJSON(a, b []byte) bool {
	var x, y attest.Claims
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	return bytes.Equal(ja, jb)
}
