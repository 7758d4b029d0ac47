// Package storetest is the conformance suite of store.Store: one table of
// behaviours, each case on a fresh, empty store, that every backend's tests
// run (store/boltstore, store/kubestore), so the backends cannot drift apart
// in what the MCS and the approver rely on: all-or-nothing CreateRecord,
// markers that stop counting when they expire, newest-first RecordsForNode,
// single consumption, GC, node bindings (one identity per name, one name
// per identity, until released), bans (an identity's, outliving releases,
// until lifted), each name's history (releases, adoption) — and the same
// under concurrent callers.
//
// Times in the suite are whole seconds, so a backend that keeps times to the
// microsecond (kubestore) round-trips them exactly.
package storetest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
)

// T0 is the suite's start time.
var T0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// Clock is a settable clock, safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set sets the clock's time.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// NewStore returns a new, empty store for one test, whose clock is clock. It
// is closed when the test ends (t.Cleanup), by NewStore or by Run.
type NewStore func(t *testing.T, clock func() time.Time) store.Store

// Concurrency is how many goroutines race in the concurrent cases.
const Concurrency = 8

// ID returns a record ID of the form the MCS makes (24 hex digits).
func ID(n int) string { return fmt.Sprintf("%024x", n) }

// Record returns a complete record: every field set, times whole seconds.
func Record(id, node string, created time.Time) *store.Record {
	key := sha256.Sum256([]byte("kubelet key of " + id))
	return &store.Record{
		ID:               id,
		NodeName:         node,
		Pool:             "worker",
		Kind:             attest.KindTPM,
		Identity:         "ek:" + id,
		KubeletKeySHA256: key[:],
		Addresses:        []string{"10.0.0.7", node + ".example.com"},
		BootstrapTokenID: "abc123",
		Summary:          "EK trusted; Secure Boot on",
		CreatedAt:        created,
		Expires:          created.Add(time.Hour),
	}
}

type env struct {
	s     store.Store
	clock *Clock
	ctx   context.Context
}

// Run runs the suite: every case is a subtest, in parallel with the others,
// on a store of its own.
func Run(t *testing.T, newStore NewStore) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := &Clock{now: T0}
			s := newStore(t, c.Now)
			t.Cleanup(func() { s.Close() })
			tc.run(t, &env{s: s, clock: c, ctx: context.Background()})
		})
	}
}

func once(key string, exp time.Time) store.Once { return store.Once{Key: key, Expires: exp} }

func is(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want)
	}
}

func (e *env) create(t *testing.T, r *store.Record, o ...store.Once) {
	t.Helper()
	is(t, "CreateRecord "+r.ID, e.s.CreateRecord(e.ctx, r, o...), nil)
}

func (e *env) get(t *testing.T, id string) *store.Record {
	t.Helper()
	r, err := e.s.GetRecord(e.ctx, id)
	if err != nil {
		t.Fatalf("GetRecord %s: %v", id, err)
	}
	return r
}

func (e *env) absent(t *testing.T, id string) {
	t.Helper()
	_, err := e.s.GetRecord(e.ctx, id)
	is(t, "GetRecord "+id+" (should not exist)", err, store.ErrNotFound)
}

// unset checks that a marker is not set: UseOnce succeeds (and sets it).
func (e *env) unset(t *testing.T, key string) {
	t.Helper()
	is(t, "UseOnce "+key+" (should not be set)", e.s.UseOnce(e.ctx, key, e.clock.Now().Add(time.Hour)), nil)
}

// set checks that a marker is set.
func (e *env) set(t *testing.T, key string) {
	t.Helper()
	is(t, "UseOnce "+key+" (should be set)", e.s.UseOnce(e.ctx, key, e.clock.Now().Add(time.Hour)), store.ErrUsed)
}

func ids(rs []*store.Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

// Equal reports how got differs from want ("" if it does not): times compared
// as instants, nil and empty slices alike.
func Equal(got, want *store.Record) string {
	var d []string
	check := func(field string, ok bool, g, w any) {
		if !ok {
			d = append(d, fmt.Sprintf("%s = %v, want %v", field, g, w))
		}
	}
	check("ID", got.ID == want.ID, got.ID, want.ID)
	check("NodeName", got.NodeName == want.NodeName, got.NodeName, want.NodeName)
	check("Pool", got.Pool == want.Pool, got.Pool, want.Pool)
	check("Kind", got.Kind == want.Kind, got.Kind, want.Kind)
	check("Identity", got.Identity == want.Identity, got.Identity, want.Identity)
	check("KubeletKeySHA256", slices.Equal(got.KubeletKeySHA256, want.KubeletKeySHA256), got.KubeletKeySHA256, want.KubeletKeySHA256)
	check("Addresses", slices.Equal(got.Addresses, want.Addresses), got.Addresses, want.Addresses)
	check("BootstrapTokenID", got.BootstrapTokenID == want.BootstrapTokenID, got.BootstrapTokenID, want.BootstrapTokenID)
	check("Summary", got.Summary == want.Summary, got.Summary, want.Summary)
	check("CreatedAt", got.CreatedAt.Equal(want.CreatedAt), got.CreatedAt, want.CreatedAt)
	check("Expires", got.Expires.Equal(want.Expires), got.Expires, want.Expires)
	check("ConsumedAt", (got.ConsumedAt == nil) == (want.ConsumedAt == nil) &&
		(got.ConsumedAt == nil || got.ConsumedAt.Equal(*want.ConsumedAt)), got.ConsumedAt, want.ConsumedAt)
	check("ConsumedBy", got.ConsumedBy == want.ConsumedBy, got.ConsumedBy, want.ConsumedBy)
	return strings.Join(d, "; ")
}

// race runs fn(i) for i in [0, Concurrency) at once and returns the errors.
func race(fn func(i int) error) []error {
	errs := make([]error, Concurrency)
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range errs {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			errs[i] = fn(i)
		}()
	}
	start.Done()
	done.Wait()
	return errs
}

// oneWins checks that exactly one error is nil and every other is want; it
// returns the winner.
func oneWins(t *testing.T, errs []error, want error) int {
	t.Helper()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("callers %d and %d both succeeded", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, want):
			t.Fatalf("caller %d: got %v, want %v", i, err, want)
		}
	}
	if winner < 0 {
		t.Fatalf("no caller succeeded: %v", errs)
	}
	return winner
}

// enrolment returns a record of identity for node, whose kubelet key is
// named by key.
func enrolment(id int, node, identity, key string) *store.Record {
	r := Record(ID(id), node, T0)
	r.Identity = identity
	k := sha256.Sum256([]byte(key))
	r.KubeletKeySHA256 = k[:]
	return r
}

func (e *env) enrol(t *testing.T, r *store.Record, o store.EnrolOptions, once ...store.Once) {
	t.Helper()
	is(t, "Enrol "+r.ID, e.s.Enrol(e.ctx, r, o, once...), nil)
}

// bound checks that node is bound to r's identity and key, with r's record.
func (e *env) bound(t *testing.T, r *store.Record) {
	t.Helper()
	for what, get := range map[string]func() (*store.Binding, error){
		"Binding":   func() (*store.Binding, error) { return e.s.Binding(e.ctx, r.NodeName) },
		"BindingOf": func() (*store.Binding, error) { return e.s.BindingOf(e.ctx, r.Identity) },
	} {
		b, err := get()
		if err != nil {
			t.Fatalf("%s of %s/%s: %v", what, r.NodeName, r.Identity, err)
		}
		if b.NodeName != r.NodeName || b.Identity != r.Identity || b.Kind != r.Kind || b.Pool != r.Pool ||
			!slices.Equal(b.KubeletKeySHA256, r.KubeletKeySHA256) || b.RecordID != r.ID {
			t.Fatalf("%s = %+v; want node %s, identity %s, record %s and its key", what, b, r.NodeName, r.Identity, r.ID)
		}
	}
}

// unbound checks that neither the name nor the identity is bound.
func (e *env) unbound(t *testing.T, node, identity string) {
	t.Helper()
	if _, err := e.s.Binding(e.ctx, node); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Binding %s: %v, want ErrNotFound", node, err)
	}
	if _, err := e.s.BindingOf(e.ctx, identity); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("BindingOf %s: %v, want ErrNotFound", identity, err)
	}
}

var cases = []struct {
	name string
	run  func(t *testing.T, e *env)
}{
	{"create then get returns the record as written", func(t *testing.T, e *env) {
		r := Record(ID(1), "worker-1", T0)
		e.create(t, r, once("session/1", T0.Add(5*time.Minute)))
		if d := Equal(e.get(t, r.ID), r); d != "" {
			t.Fatalf("round trip: %s", d)
		}
		// The minimal record: no optional field.
		m := &store.Record{ID: ID(2), NodeName: "worker-2", Pool: "infra", Kind: attest.KindGCP,
			KubeletKeySHA256: r.KubeletKeySHA256, CreatedAt: T0, Expires: T0.Add(time.Minute)}
		e.create(t, m)
		if d := Equal(e.get(t, m.ID), m); d != "" {
			t.Fatalf("round trip of a minimal record: %s", d)
		}
	}},
	{"get of an unknown ID is ErrNotFound", func(t *testing.T, e *env) {
		for _, id := range []string{ID(404), "Not_An_ID", ""} {
			_, err := e.s.GetRecord(e.ctx, id)
			is(t, fmt.Sprintf("GetRecord %q", id), err, store.ErrNotFound)
		}
	}},
	{"an existing ID is ErrExists and sets none of the call's markers", func(t *testing.T, e *env) {
		e.create(t, Record(ID(1), "worker-1", T0), once("session/1", T0.Add(time.Minute)))
		err := e.s.CreateRecord(e.ctx, Record(ID(1), "worker-2", T0), once("session/2", T0.Add(time.Minute)), once("instance/2", T0.Add(time.Hour)))
		is(t, "CreateRecord with an existing ID", err, store.ErrExists)
		if got := e.get(t, ID(1)).NodeName; got != "worker-1" {
			t.Fatalf("the existing record was overwritten: node %s", got)
		}
		e.unset(t, "session/2")
		e.unset(t, "instance/2")
	}},
	{"the same record again is ErrUsed or ErrExists and changes nothing", func(t *testing.T, e *env) {
		r := Record(ID(1), "worker-1", T0)
		e.create(t, r, once("session/1", T0.Add(time.Minute)), once("instance/1", T0.Add(time.Hour)))
		err := e.s.CreateRecord(e.ctx, Record(ID(1), "worker-1", T0), once("session/1", T0.Add(time.Minute)), once("instance/1", T0.Add(time.Hour)))
		if !errors.Is(err, store.ErrUsed) && !errors.Is(err, store.ErrExists) {
			t.Fatalf("the same CreateRecord again: %v, want ErrUsed or ErrExists", err)
		}
		if d := Equal(e.get(t, ID(1)), r); d != "" {
			t.Fatalf("record changed: %s", d)
		}
		e.set(t, "session/1")
		e.set(t, "instance/1")
	}},
	{"a marker already set refuses the whole write", func(t *testing.T, e *env) {
		e.create(t, Record(ID(1), "worker-1", T0), once("session/1", T0.Add(time.Minute)))
		err := e.s.CreateRecord(e.ctx, Record(ID(2), "worker-1", T0), once("instance/9", T0.Add(time.Hour)), once("session/1", T0.Add(time.Minute)))
		is(t, "CreateRecord with a used marker", err, store.ErrUsed)
		e.absent(t, ID(2))
		e.unset(t, "instance/9")
		e.set(t, "session/1")
	}},
	{"a marker set by UseOnce blocks CreateRecord", func(t *testing.T, e *env) {
		is(t, "UseOnce", e.s.UseOnce(e.ctx, "instance/1", T0.Add(time.Hour)), nil)
		is(t, "CreateRecord", e.s.CreateRecord(e.ctx, Record(ID(1), "worker-1", T0), once("instance/1", T0.Add(time.Hour))), store.ErrUsed)
		e.absent(t, ID(1))
	}},
	{"an expired marker counts as unset", func(t *testing.T, e *env) {
		e.create(t, Record(ID(1), "worker-1", T0), once("instance/1", T0.Add(time.Minute)))
		is(t, "UseOnce", e.s.UseOnce(e.ctx, "token/1", T0.Add(time.Minute)), nil)
		e.clock.Set(T0.Add(time.Minute)) // expiry is exclusive: at Expires it is over
		e.create(t, Record(ID(2), "worker-1", e.clock.Now()), once("instance/1", T0.Add(time.Hour)))
		is(t, "UseOnce of an expired marker", e.s.UseOnce(e.ctx, "token/1", T0.Add(time.Hour)), nil)
		// Set again, with the new expiry.
		e.set(t, "instance/1")
		e.set(t, "token/1")
		is(t, "CreateRecord", e.s.CreateRecord(e.ctx, Record(ID(3), "worker-1", T0), once("instance/1", T0.Add(time.Hour))), store.ErrUsed)
	}},
	{"the same key twice in one call is one marker", func(t *testing.T, e *env) {
		e.create(t, Record(ID(1), "worker-1", T0), once("session/1", T0.Add(time.Minute)), once("session/1", T0.Add(time.Hour)))
		e.clock.Set(T0.Add(30 * time.Minute))
		e.set(t, "session/1") // the later expiry counts
	}},
	{"records for a node: newest first, expired included, exact name", func(t *testing.T, e *env) {
		old := Record(ID(1), "node-1", T0)
		old.Expires = T0.Add(time.Second)
		e.create(t, old)
		e.create(t, Record(ID(3), "node-1", T0.Add(2*time.Second)))
		e.create(t, Record(ID(2), "node-1", T0.Add(time.Second)))
		e.create(t, Record(ID(4), "node-10", T0.Add(3*time.Second)))
		e.create(t, Record(ID(5), "node-2", T0.Add(3*time.Second)))
		e.clock.Set(T0.Add(time.Minute))
		for _, tc := range []struct {
			node string
			want []string
		}{
			{"node-1", []string{ID(3), ID(2), ID(1)}},
			{"node-10", []string{ID(4)}},
			{"node-", nil},
			{"node-3", nil},
			{"", nil},
			{"Node-1", nil},
		} {
			rs, err := e.s.RecordsForNode(e.ctx, tc.node)
			if err != nil {
				t.Fatalf("RecordsForNode %q: %v", tc.node, err)
			}
			if got := ids(rs); !slices.Equal(got, tc.want) {
				t.Fatalf("RecordsForNode %q = %v, want %v", tc.node, got, tc.want)
			}
		}
		rs, _ := e.s.RecordsForNode(e.ctx, "node-1")
		if d := Equal(rs[2], old); d != "" {
			t.Fatalf("listed record differs: %s", d)
		}
	}},
	{"a record is consumed once", func(t *testing.T, e *env) {
		r := Record(ID(1), "worker-1", T0)
		e.create(t, r)
		at := T0.Add(2 * time.Minute)
		is(t, "ConsumeRecord", e.s.ConsumeRecord(e.ctx, r.ID, "csr-1", at), nil)
		is(t, "ConsumeRecord again", e.s.ConsumeRecord(e.ctx, r.ID, "csr-2", at.Add(time.Second)), store.ErrConsumed)
		is(t, "ConsumeRecord of an unknown ID", e.s.ConsumeRecord(e.ctx, ID(2), "csr-3", at), store.ErrNotFound)
		r.ConsumedAt, r.ConsumedBy = &at, "csr-1"
		if d := Equal(e.get(t, r.ID), r); d != "" {
			t.Fatalf("after consumption: %s", d)
		}
		rs, err := e.s.RecordsForNode(e.ctx, "worker-1")
		if err != nil || len(rs) != 1 || rs[0].ConsumedBy != "csr-1" {
			t.Fatalf("RecordsForNode after consumption: %v %v", ids(rs), err)
		}
	}},
	{"IsUsed reads a marker without setting it", func(t *testing.T, e *env) {
		used := func(key string) bool {
			t.Helper()
			u, err := e.s.IsUsed(e.ctx, key)
			if err != nil {
				t.Fatalf("IsUsed %s: %v", key, err)
			}
			return u
		}
		if used("token/1") || used("token/1") {
			t.Fatal("an unset marker reads as used")
		}
		e.unset(t, "token/1") // IsUsed set nothing
		if !used("token/1") {
			t.Fatal("a set marker reads as unused")
		}
		e.create(t, Record(ID(1), "worker-1", T0), once("session/1", T0.Add(time.Minute)))
		if !used("session/1") {
			t.Fatal("a marker CreateRecord set reads as unused")
		}
		e.clock.Set(T0.Add(2 * time.Minute))
		if used("session/1") {
			t.Fatal("an expired marker reads as used")
		}
	}},
	{"use once, release, use again", func(t *testing.T, e *env) {
		is(t, "UseOnce", e.s.UseOnce(e.ctx, "config-token/1", T0.Add(time.Minute)), nil)
		is(t, "UseOnce again", e.s.UseOnce(e.ctx, "config-token/1", T0.Add(time.Minute)), store.ErrUsed)
		is(t, "ReleaseOnce", e.s.ReleaseOnce(e.ctx, "config-token/1"), nil)
		is(t, "UseOnce after release", e.s.UseOnce(e.ctx, "config-token/1", T0.Add(time.Minute)), nil)
		is(t, "ReleaseOnce of a marker never set", e.s.ReleaseOnce(e.ctx, "config-token/2"), nil)
		// Any string is a key.
		for _, k := range []string{"a", "with spaces/and:colons", "ünïcode", strings.Repeat("long", 250)} {
			is(t, fmt.Sprintf("UseOnce %q", k), e.s.UseOnce(e.ctx, k, T0.Add(time.Minute)), nil)
			e.set(t, k)
		}
	}},
	{"GC deletes what expired and counts it", func(t *testing.T, e *env) {
		e.create(t, Record(ID(1), "worker-1", T0), once("session/1", T0.Add(time.Minute))) // record expires T0+1h
		late := Record(ID(2), "worker-1", T0)
		late.Expires = T0.Add(2 * time.Hour)
		e.create(t, late, once("instance/2", T0.Add(3*time.Hour)))
		is(t, "UseOnce", e.s.UseOnce(e.ctx, "token/1", T0.Add(time.Hour)), nil)

		n, err := e.s.GC(e.ctx, T0.Add(time.Hour)) // expiry == now counts as expired
		if err != nil || n != 3 {
			t.Fatalf("GC = %d, %v; want 3 (record 1, session/1, token/1)", n, err)
		}
		e.absent(t, ID(1))
		e.get(t, ID(2))
		if rs, err := e.s.RecordsForNode(e.ctx, "worker-1"); err != nil || !slices.Equal(ids(rs), []string{ID(2)}) {
			t.Fatalf("RecordsForNode after GC = %v, %v", ids(rs), err)
		}
		e.unset(t, "session/1") // even with the clock still at T0
		e.unset(t, "token/1")
		e.set(t, "instance/2")
		if n, err := e.s.GC(e.ctx, T0.Add(59*time.Minute)); err != nil || n != 0 {
			t.Fatalf("GC before anything left expired = %d, %v; want 0", n, err)
		}
		// Left: record 2, instance/2, and session/1 and token/1 as set again.
		if n, err := e.s.GC(e.ctx, T0.Add(4*time.Hour)); err != nil || n != 4 {
			t.Fatalf("GC of everything = %d, %v; want 4", n, err)
		}
	}},
	{"concurrent consumers: exactly one wins", func(t *testing.T, e *env) {
		e.create(t, Record(ID(1), "worker-1", T0))
		errs := race(func(i int) error {
			return e.s.ConsumeRecord(e.ctx, ID(1), fmt.Sprintf("csr-%d", i), T0.Add(time.Minute))
		})
		w := oneWins(t, errs, store.ErrConsumed)
		if got, want := e.get(t, ID(1)).ConsumedBy, fmt.Sprintf("csr-%d", w); got != want {
			t.Fatalf("consumed by %s, but %s won", got, want)
		}
	}},
	{"concurrent creates with the same marker: exactly one wins", func(t *testing.T, e *env) {
		errs := race(func(i int) error {
			return e.s.CreateRecord(e.ctx, Record(ID(i), "worker-1", T0),
				once(fmt.Sprintf("instance/%d", i), T0.Add(time.Hour)), once("session/1", T0.Add(time.Minute)))
		})
		w := oneWins(t, errs, store.ErrUsed)
		rs, err := e.s.RecordsForNode(e.ctx, "worker-1")
		if err != nil || !slices.Equal(ids(rs), []string{ID(w)}) {
			t.Fatalf("records = %v, %v; want only the winner's %s", ids(rs), err, ID(w))
		}
		for i := range Concurrency {
			if i == w {
				e.set(t, fmt.Sprintf("instance/%d", i))
			} else {
				e.unset(t, fmt.Sprintf("instance/%d", i))
			}
		}
	}},
	{"concurrent creates with the same ID: exactly one wins", func(t *testing.T, e *env) {
		errs := race(func(i int) error {
			return e.s.CreateRecord(e.ctx, Record(ID(1), fmt.Sprintf("worker-%d", i), T0), once(fmt.Sprintf("session/%d", i), T0.Add(time.Minute)))
		})
		w := oneWins(t, errs, store.ErrExists)
		if got, want := e.get(t, ID(1)).NodeName, fmt.Sprintf("worker-%d", w); got != want {
			t.Fatalf("record is for %s, but %s won", got, want)
		}
		for i := range Concurrency {
			if i == w {
				e.set(t, fmt.Sprintf("session/%d", i))
			} else {
				e.unset(t, fmt.Sprintf("session/%d", i))
			}
		}
	}},
	{"concurrent UseOnce of an expired marker: exactly one wins", func(t *testing.T, e *env) {
		is(t, "UseOnce", e.s.UseOnce(e.ctx, "token/1", T0.Add(time.Minute)), nil)
		e.clock.Set(T0.Add(2 * time.Minute))
		errs := race(func(int) error { return e.s.UseOnce(e.ctx, "token/1", T0.Add(time.Hour)) })
		oneWins(t, errs, store.ErrUsed)
		e.set(t, "token/1")
	}},
	{"enrolment binds the name to the identity; another identity is ErrNameTaken and writes nothing", func(t *testing.T, e *env) {
		a := enrolment(1, "master-0", "tpm-ek:aaa", "key-a")
		e.unbound(t, "master-0", a.Identity)
		e.enrol(t, a, store.EnrolOptions{}, once("session/1", T0.Add(time.Minute)))
		e.bound(t, a)
		if d := Equal(e.get(t, a.ID), a); d != "" {
			t.Fatalf("the enrolment's record: %s", d)
		}
		for _, o := range []store.EnrolOptions{{}, {Again: true}, {Again: true, ReplaceKey: true}} {
			b := enrolment(2, "master-0", "tpm-ek:bbb", "key-b")
			is(t, fmt.Sprintf("Enrol of a taken name %+v", o), e.s.Enrol(e.ctx, b, o, once("session/2", T0.Add(time.Minute))), store.ErrNameTaken)
			e.absent(t, b.ID)
			e.unset(t, "session/2")
			is(t, "ReleaseOnce", e.s.ReleaseOnce(e.ctx, "session/2"), nil)
			if _, err := e.s.BindingOf(e.ctx, b.Identity); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the refused identity is bound: %v", err)
			}
		}
		e.bound(t, a)
	}},
	{"an enrolled identity is ErrIdentityEnrolled under another name, or again unless asked", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "gcp:1/us-a/7", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		for _, tc := range []struct {
			name string
			r    *store.Record
			o    store.EnrolOptions
		}{
			{"another name", enrolment(2, "worker-2", a.Identity, "key-a"), store.EnrolOptions{}},
			{"another name, again", enrolment(3, "worker-2", a.Identity, "key-a"), store.EnrolOptions{Again: true}},
			{"the same name, not again", enrolment(4, "worker-1", a.Identity, "key-a"), store.EnrolOptions{}},
			{"the same name again with another key", enrolment(5, "worker-1", a.Identity, "key-x"), store.EnrolOptions{Again: true}},
		} {
			err := e.s.Enrol(e.ctx, tc.r, tc.o, once("session/"+tc.r.ID, T0.Add(time.Minute)))
			is(t, "Enrol: "+tc.name, err, store.ErrIdentityEnrolled)
			e.absent(t, tc.r.ID)
			e.unset(t, "session/"+tc.r.ID)
		}
		if _, err := e.s.Binding(e.ctx, "worker-2"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("worker-2 was bound: %v", err)
		}
		e.bound(t, a)
	}},
	{"enrolling again keeps the binding: the same key, or another with ReplaceKey", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "aws:1/r/i-1", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		again := enrolment(2, "worker-1", a.Identity, "key-a")
		e.enrol(t, again, store.EnrolOptions{Again: true}, once("session/2", T0.Add(time.Minute)))
		e.bound(t, again)
		e.set(t, "session/2")
		re := enrolment(3, "worker-1", a.Identity, "key-new")
		e.enrol(t, re, store.EnrolOptions{Again: true, ReplaceKey: true})
		e.bound(t, re)
		b, _ := e.s.Binding(e.ctx, "worker-1")
		if !b.CreatedAt.Equal(a.CreatedAt) {
			t.Fatalf("the binding's creation moved: %v, want %v", b.CreatedAt, a.CreatedAt)
		}
		if rs, err := e.s.RecordsForNode(e.ctx, "worker-1"); err != nil || len(rs) != 3 {
			t.Fatalf("RecordsForNode = %v, %v; want the three enrolments", ids(rs), err)
		}
	}},
	{"enrolling again after a release is a first enrolment", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		if _, err := e.s.Release(e.ctx, "worker-1"); err != nil {
			t.Fatal(err)
		}
		b := enrolment(2, "worker-1", a.Identity, "key-b")
		e.enrol(t, b, store.EnrolOptions{Again: true})
		e.bound(t, b)
	}},
	{"release frees the name for another identity and the identity for another name", func(t *testing.T, e *env) {
		a := enrolment(1, "master-0", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		got, err := e.s.Release(e.ctx, "master-0")
		if err != nil || got.Identity != a.Identity || got.RecordID != a.ID {
			t.Fatalf("Release = %+v, %v; want the binding of %s", got, err, a.Identity)
		}
		e.unbound(t, "master-0", a.Identity)
		if _, err := e.s.Release(e.ctx, "master-0"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Release again: %v, want ErrNotFound", err)
		}
		b := enrolment(2, "master-0", "tpm-ek:bbb", "key-b")
		e.enrol(t, b, store.EnrolOptions{})
		e.bound(t, b)
		c := enrolment(3, "master-1", a.Identity, "key-c")
		e.enrol(t, c, store.EnrolOptions{})
		e.bound(t, c)
		e.get(t, a.ID) // records stay until they expire
	}},
	{"the same enrolment again is ErrUsed or ErrExists and changes nothing", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{}, once("session/1", T0.Add(time.Minute)))
		err := e.s.Enrol(e.ctx, enrolment(1, "worker-1", a.Identity, "key-a"), store.EnrolOptions{}, once("session/1", T0.Add(time.Minute)))
		if !errors.Is(err, store.ErrUsed) && !errors.Is(err, store.ErrExists) {
			t.Fatalf("the same Enrol again: %v, want ErrUsed or ErrExists", err)
		}
		e.bound(t, a)
		e.set(t, "session/1")
	}},
	{"an enrolment with a used marker binds nothing", func(t *testing.T, e *env) {
		is(t, "UseOnce", e.s.UseOnce(e.ctx, "session/1", T0.Add(time.Minute)), nil)
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		is(t, "Enrol with a used marker", e.s.Enrol(e.ctx, a, store.EnrolOptions{}, once("session/1", T0.Add(time.Minute))), store.ErrUsed)
		e.absent(t, a.ID)
		e.unbound(t, "worker-1", a.Identity)
		e.enrol(t, enrolment(2, "worker-1", a.Identity, "key-a"), store.EnrolOptions{}) // nothing left in the way
	}},
	{"a refused enrolment is a typed conflict carrying what conflicts", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		again := enrolment(2, "worker-1", a.Identity, "key-a")
		e.enrol(t, again, store.EnrolOptions{Again: true}) // the binding now names record 2
		is(t, "UseOnce", e.s.UseOnce(e.ctx, "session/spent", T0.Add(time.Minute)), nil)
		banned := enrolment(3, "worker-9", "gcp:1/us-a/9", "key-9")
		if _, err := e.s.Ban(e.ctx, store.Ban{Identity: banned.Identity, Kind: attest.KindGCP, At: T0}); err != nil {
			t.Fatal(err)
		}
		otherPool := enrolment(4, "worker-1", a.Identity, "key-a")
		otherPool.Pool = "master"
		for _, tc := range []struct {
			name    string
			r       *store.Record
			o       store.EnrolOptions
			once    []store.Once
			reason  store.Conflict
			want    error
			binding string // the conflict's binding's record ID ("" for none)
			record  string // the conflict's record's ID ("" for none)
		}{
			{"NameBound: the name is another identity's", enrolment(10, "worker-1", "tpm-ek:bbb", "key-b"), store.EnrolOptions{},
				nil, store.ConflictNameBound, store.ErrNameTaken, again.ID, ""},
			{"IdentityBound: under another name", enrolment(11, "worker-2", a.Identity, "key-a"), store.EnrolOptions{},
				nil, store.ConflictIdentityBound, store.ErrIdentityEnrolled, again.ID, ""},
			{"IdentityBound: the same name, not again", enrolment(12, "worker-1", a.Identity, "key-a"), store.EnrolOptions{},
				nil, store.ConflictIdentityBound, store.ErrIdentityEnrolled, again.ID, ""},
			{"IdentityBound: again with another key", enrolment(13, "worker-1", a.Identity, "key-x"), store.EnrolOptions{Again: true},
				nil, store.ConflictIdentityBound, store.ErrIdentityEnrolled, again.ID, ""},
			{"IdentityBound: an earlier session's record is reported", enrolment(1, "worker-1", a.Identity, "key-a"), store.EnrolOptions{},
				nil, store.ConflictIdentityBound, store.ErrIdentityEnrolled, again.ID, a.ID},
			{"RecordExists: the same enrolment again", enrolment(2, "worker-1", a.Identity, "key-a"), store.EnrolOptions{Again: true},
				nil, store.ConflictRecordExists, store.ErrExists, "", again.ID},
			{"PoolFixed: again in another pool", otherPool, store.EnrolOptions{Again: true},
				nil, store.ConflictPoolFixed, store.ErrPoolFixed, again.ID, ""},
			{"MarkerSpent: a marker is set", enrolment(14, "worker-5", "tpm-ek:ccc", "key-c"), store.EnrolOptions{},
				[]store.Once{once("session/spent", T0.Add(time.Minute))}, store.ConflictMarkerSpent, store.ErrUsed, "", ""},
			{"Banned: the identity is banned", banned, store.EnrolOptions{},
				nil, store.ConflictBanned, store.ErrRevoked, "", ""},
		} {
			err := e.s.Enrol(e.ctx, tc.r, tc.o, tc.once...)
			is(t, tc.name, err, tc.want)
			var c *store.EnrolConflict
			if !errors.As(err, &c) {
				t.Fatalf("%s: %v (%T) is no *store.EnrolConflict", tc.name, err, err)
			}
			if c.Reason != tc.reason {
				t.Fatalf("%s: reason %s, want %s", tc.name, c.Reason, tc.reason)
			}
			if tc.binding != "" && (c.Binding == nil || c.Binding.RecordID != tc.binding || c.Binding.Identity != a.Identity ||
				c.Binding.NodeName != "worker-1" || c.Binding.Pool != a.Pool) {
				t.Fatalf("%s: binding %+v, want worker-1's, naming record %s", tc.name, c.Binding, tc.binding)
			}
			if tc.record == "" && c.Record != nil && c.Record.ID == tc.r.ID {
				t.Fatalf("%s: record %s reported, which was never written", tc.name, c.Record.ID)
			}
			if tc.record != "" {
				if c.Record == nil {
					t.Fatalf("%s: no record reported, want %s", tc.name, tc.record)
				}
				if d := Equal(c.Record, e.get(t, tc.record)); d != "" {
					t.Fatalf("%s: the reported record: %s", tc.name, d)
				}
			}
		}
		e.bound(t, again)

		// LiveCap: at MaxLive unexpired records of the identity for the
		// name (an expired one does not count), enrolling again is
		// refused, with their expiries; below it, it goes through.
		old := enrolment(5, "worker-1", a.Identity, "key-a")
		old.CreatedAt, old.Expires = T0.Add(-2*time.Hour), T0.Add(-time.Hour)
		e.create(t, old)
		capped := enrolment(15, "worker-1", a.Identity, "key-a")
		err := e.s.Enrol(e.ctx, capped, store.EnrolOptions{Again: true, MaxLive: 2})
		is(t, "LiveCap", err, store.ErrEnrolmentCap)
		var c *store.EnrolConflict
		if !errors.As(err, &c) || c.Reason != store.ConflictLiveCap || len(c.Live) != 2 || !c.Live[0].Equal(a.Expires) ||
			c.Binding == nil || c.Binding.RecordID != again.ID {
			t.Fatalf("LiveCap: %v (%+v), want the two unexpired records' expiries and the binding", err, c)
		}
		e.absent(t, capped.ID)

		// Delivered: whether the named marker is set, for a refusal an
		// earlier answer to the same session may explain.
		for _, set := range []bool{false, true} {
			if set {
				is(t, "UseOnce", e.s.UseOnce(e.ctx, "config/1", T0.Add(time.Minute)), nil)
			}
			err := e.s.Enrol(e.ctx, enrolment(1, "worker-1", a.Identity, "key-a"), store.EnrolOptions{Delivered: "config/1"})
			if c = nil; !errors.As(err, &c) || c.Reason != store.ConflictIdentityBound || c.Delivered != set || c.Record == nil || c.Record.ID != a.ID {
				t.Fatalf("Delivered (marker set %v): %v (%+v)", set, err, c)
			}
		}

		e.enrol(t, capped, store.EnrolOptions{Again: true, MaxLive: 3})
		e.bound(t, capped)
	}},
	{"bindings outlive GC", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		if _, err := e.s.GC(e.ctx, T0.Add(1000*time.Hour)); err != nil {
			t.Fatal(err)
		}
		e.absent(t, a.ID)
		b, err := e.s.Binding(e.ctx, "worker-1")
		if err != nil || b.Identity != a.Identity {
			t.Fatalf("binding after GC: %+v, %v", b, err)
		}
		is(t, "Enrol of the GC'd identity under another name", e.s.Enrol(e.ctx, enrolment(2, "worker-2", a.Identity, "key-a"), store.EnrolOptions{}), store.ErrIdentityEnrolled)
	}},
	{"concurrent enrolments of one name by many identities: exactly one wins", func(t *testing.T, e *env) {
		errs := race(func(i int) error {
			return e.s.Enrol(e.ctx, enrolment(i, "master-0", fmt.Sprintf("tpm-ek:%d", i), fmt.Sprint("key-", i)), store.EnrolOptions{},
				once(fmt.Sprintf("session/%d", i), T0.Add(time.Minute)))
		})
		w := oneWins(t, errs, store.ErrNameTaken)
		e.bound(t, enrolment(w, "master-0", fmt.Sprintf("tpm-ek:%d", w), fmt.Sprint("key-", w)))
		for i := range Concurrency {
			if i != w {
				e.absent(t, ID(i))
				e.unset(t, fmt.Sprintf("session/%d", i))
				e.unbound(t, "nobody", fmt.Sprintf("tpm-ek:%d", i))
			}
		}
	}},
	{"concurrent enrolments of one identity under many names: exactly one wins", func(t *testing.T, e *env) {
		errs := race(func(i int) error {
			return e.s.Enrol(e.ctx, enrolment(i, fmt.Sprintf("node-%d", i), "tpm-ek:one", "key"), store.EnrolOptions{},
				once(fmt.Sprintf("session/%d", i), T0.Add(time.Minute)))
		})
		w := oneWins(t, errs, store.ErrIdentityEnrolled)
		e.bound(t, enrolment(w, fmt.Sprintf("node-%d", w), "tpm-ek:one", "key"))
		for i := range Concurrency {
			if i != w {
				e.absent(t, ID(i))
				e.unset(t, fmt.Sprintf("session/%d", i))
				if _, err := e.s.Binding(e.ctx, fmt.Sprintf("node-%d", i)); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("node-%d bound by a loser: %v", i, err)
				}
			}
		}
	}},
	{"unknown names and identities are ErrNotFound", func(t *testing.T, e *env) {
		for _, n := range []string{"worker-9", "", "Not_A_Name"} {
			if _, err := e.s.Binding(e.ctx, n); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("Binding %q: %v", n, err)
			}
			if _, err := e.s.Release(e.ctx, n); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("Release %q: %v", n, err)
			}
		}
		if _, err := e.s.BindingOf(e.ctx, "tpm-ek:nobody"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("BindingOf: %v", err)
		}
	}},
	{"status: updated in one write, by the owning identity only", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		b, err := e.s.Binding(e.ctx, "worker-1")
		if err != nil || !b.EnrolledAt.Equal(a.CreatedAt) || !b.Status.LastAttempt.IsZero() || b.Revoked != nil {
			t.Fatalf("a new binding: %+v, %v", b, err)
		}
		at := T0.Add(time.Hour)
		got, err := e.s.UpdateStatus(e.ctx, "worker-1", a.Identity, func(b *store.Binding) error {
			b.Status = store.AttestationStatus{LastAttempt: at, LastSuccess: at, Passed: true, Boots: b.Status.Boots + 1,
				ResetCount: 7, RestartCount: 2, Summary: "tpm secureBoot=on", Claims: []byte(`{"kind":"tpm"}`), SessionIssuedAt: at.Add(-time.Second),
				Rejudged: at.Add(time.Minute)}
			b.Pool = "changed" // not the status: ignored
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		b, _ = e.s.Binding(e.ctx, "worker-1")
		for _, x := range []*store.Binding{got, b} {
			st := x.Status
			if !st.LastAttempt.Equal(at) || !st.LastSuccess.Equal(at) || !st.Passed || st.Boots != 1 || st.ResetCount != 7 ||
				st.RestartCount != 2 || st.Summary != "tpm secureBoot=on" || string(st.Claims) != `{"kind":"tpm"}` || x.Pool != "worker" ||
				!st.SessionIssuedAt.Equal(at.Add(-time.Second)) || !st.Rejudged.Equal(at.Add(time.Minute)) {
				t.Fatalf("status after the update: %+v (pool %s)", st, x.Pool)
			}
		}
		if _, err := e.s.UpdateStatus(e.ctx, "worker-1", "tpm-ek:bbb", func(*store.Binding) error { return nil }); !errors.Is(err, store.ErrNameTaken) {
			t.Fatalf("another identity's update: %v, want ErrNameTaken", err)
		}
		if _, err := e.s.UpdateStatus(e.ctx, "worker-9", a.Identity, func(*store.Binding) error { return nil }); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("an unbound name's update: %v, want ErrNotFound", err)
		}
		boom := errors.New("boom")
		if _, err := e.s.UpdateStatus(e.ctx, "worker-1", a.Identity, func(b *store.Binding) error { b.Status.Passed = false; return boom }); !errors.Is(err, boom) {
			t.Fatalf("fn's error: %v", err)
		}
		if b, _ := e.s.Binding(e.ctx, "worker-1"); !b.Status.Passed {
			t.Fatal("a failed fn wrote its change")
		}
	}},
	{"status: concurrent updates lose nothing", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		errs := race(func(int) error {
			_, err := e.s.UpdateStatus(e.ctx, "worker-1", a.Identity, func(b *store.Binding) error { b.Status.Boots++; return nil })
			return err
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("updater %d: %v", i, err)
			}
		}
		if b, _ := e.s.Binding(e.ctx, "worker-1"); b.Status.Boots != Concurrency {
			t.Fatalf("boots = %d after %d concurrent increments", b.Status.Boots, Concurrency)
		}
	}},
	{"revoke: once, kept by status updates; the next owner of the released name is not revoked", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		at := T0.Add(time.Minute)
		b, err := e.s.Revoke(e.ctx, "worker-1", "stolen", at)
		if err != nil || b.Revoked == nil || !b.Revoked.At.Equal(at) || b.Revoked.Reason != "stolen" {
			t.Fatalf("Revoke = %+v, %v", b, err)
		}
		if b, err := e.s.Revoke(e.ctx, "worker-1", "again", at.Add(time.Hour)); err != nil || b.Revoked.Reason != "stolen" || !b.Revoked.At.Equal(at) {
			t.Fatalf("Revoke again = %+v, %v; want the first revocation kept", b.Revoked, err)
		}
		if _, err := e.s.UpdateStatus(e.ctx, "worker-1", a.Identity, func(b *store.Binding) error { b.Revoked = nil; return nil }); err != nil {
			t.Fatal(err)
		}
		if b, _ := e.s.Binding(e.ctx, "worker-1"); b.Revoked == nil {
			t.Fatal("a status update cleared the revocation")
		}
		if _, err := e.s.Revoke(e.ctx, "worker-9", "", at); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Revoke of an unbound name: %v", err)
		}
		if _, err := e.s.Release(e.ctx, "worker-1"); err != nil {
			t.Fatal(err)
		}
		e.enrol(t, enrolment(2, "worker-1", "tpm-ek:bbb", "key-b"), store.EnrolOptions{})
		if b, _ := e.s.Binding(e.ctx, "worker-1"); b.Revoked != nil {
			t.Fatal("the new owner inherited the revocation")
		}
	}},
	{"bindings: all of them", func(t *testing.T, e *env) {
		want := map[string]string{}
		for i := range 5 {
			r := enrolment(i, fmt.Sprintf("node-%d", i), fmt.Sprintf("tpm-ek:%d", i), fmt.Sprint("key-", i))
			e.enrol(t, r, store.EnrolOptions{})
			want[r.NodeName] = r.Identity
		}
		bs, err := e.s.Bindings(e.ctx)
		if err != nil || len(bs) != len(want) {
			t.Fatalf("Bindings = %d, %v; want %d", len(bs), err, len(want))
		}
		for _, b := range bs {
			if want[b.NodeName] != b.Identity {
				t.Fatalf("binding %s → %s, want %s", b.NodeName, b.Identity, want[b.NodeName])
			}
		}
	}},
	{"enrolling again moves EnrolledAt, not CreatedAt", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		again := enrolment(2, "worker-1", a.Identity, "key-a")
		again.CreatedAt = T0.Add(time.Hour)
		e.enrol(t, again, store.EnrolOptions{Again: true})
		b, _ := e.s.Binding(e.ctx, "worker-1")
		if !b.CreatedAt.Equal(T0) || !b.EnrolledAt.Equal(T0.Add(time.Hour)) {
			t.Fatalf("CreatedAt %v EnrolledAt %v", b.CreatedAt, b.EnrolledAt)
		}
	}},
	{"ban: the identity's, under any name and pool, through release, until lifted", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		at := T0.Add(time.Minute)
		ban, err := e.s.Ban(e.ctx, store.Ban{NodeName: "worker-1", At: at, By: "alice", Reason: "disk stolen"})
		if err != nil || ban.Identity != a.Identity || ban.NodeName != "worker-1" || ban.Kind != a.Kind || ban.By != "alice" ||
			ban.Reason != "disk stolen" || !ban.At.Equal(at) {
			t.Fatalf("Ban = %+v, %v", ban, err)
		}
		b, _ := e.s.Binding(e.ctx, "worker-1")
		if b.Revoked == nil || b.Revoked.By != "alice" || b.Revoked.Reason != "disk stolen" || !b.Revoked.At.Equal(at) {
			t.Fatalf("the binding's revocation: %+v", b.Revoked)
		}
		// Records of the banned identity approve nothing.
		is(t, "ConsumeRecord of a banned identity's record", e.s.ConsumeRecord(e.ctx, a.ID, "csr-1", at), store.ErrRevoked)
		if r := e.get(t, a.ID); r.ConsumedAt != nil {
			t.Fatal("a refused consumption consumed the record")
		}
		is(t, "Enrol again (the same name, key and pool)", e.s.Enrol(e.ctx, enrolment(2, "worker-1", a.Identity, "key-a"), store.EnrolOptions{Again: true}), store.ErrRevoked)
		e.absent(t, ID(2))
		if _, err := e.s.Release(e.ctx, "worker-1", store.Act{At: at.Add(time.Minute), By: "bob", Reason: "RMA"}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			r    *store.Record
			o    store.EnrolOptions
		}{
			{"the released name", enrolment(3, "worker-1", a.Identity, "key-a"), store.EnrolOptions{}},
			{"a new name", enrolment(4, "worker-2", a.Identity, "key-new"), store.EnrolOptions{}},
			{"a new name, again", enrolment(5, "worker-3", a.Identity, "key-new"), store.EnrolOptions{Again: true, ReplaceKey: true}},
		} {
			tc.r.Pool = "master"
			is(t, "Enrol of the banned identity after its release: "+tc.name, e.s.Enrol(e.ctx, tc.r, tc.o, once("session/"+tc.r.ID, T0.Add(time.Minute))), store.ErrRevoked)
			e.absent(t, tc.r.ID)
			e.unset(t, "session/"+tc.r.ID)
		}
		e.unbound(t, "worker-2", a.Identity)
		if got, err := e.s.BanOf(e.ctx, a.Identity); err != nil || got.By != "alice" || !got.At.Equal(at) {
			t.Fatalf("BanOf after the release = %+v, %v", got, err)
		}
		// Another identity takes the released name; it is not banned.
		other := enrolment(6, "worker-1", "tpm-ek:bbb", "key-b")
		e.enrol(t, other, store.EnrolOptions{})
		if b, _ := e.s.Binding(e.ctx, "worker-1"); b.Revoked != nil {
			t.Fatal("the next owner inherited the ban")
		}
		is(t, "ConsumeRecord of the next owner's record", e.s.ConsumeRecord(e.ctx, other.ID, "csr-2", at), nil)
		// Lifted: the identity enrols again, after attesting.
		lifted, err := e.s.Unban(e.ctx, a.Identity)
		if err != nil || lifted.By != "alice" {
			t.Fatalf("Unban = %+v, %v", lifted, err)
		}
		if _, err := e.s.BanOf(e.ctx, a.Identity); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("BanOf after Unban: %v", err)
		}
		if _, err := e.s.Unban(e.ctx, a.Identity); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Unban again: %v", err)
		}
		e.enrol(t, enrolment(7, "worker-2", a.Identity, "key-new"), store.EnrolOptions{})
		e.bound(t, enrolment(7, "worker-2", a.Identity, "key-new"))
		is(t, "ConsumeRecord once the ban is lifted", e.s.ConsumeRecord(e.ctx, ID(7), "csr-3", at), nil)
	}},
	{"ban: of an identity that holds no name refuses its first enrolment", func(t *testing.T, e *env) {
		ban, err := e.s.Ban(e.ctx, store.Ban{Identity: "gcp:1/us-a/7", Kind: attest.KindGCP, At: T0, By: "alice"})
		if err != nil || ban.Identity != "gcp:1/us-a/7" || ban.NodeName != "" {
			t.Fatalf("Ban = %+v, %v", ban, err)
		}
		r := enrolment(1, "worker-1", "gcp:1/us-a/7", "key-a")
		is(t, "Enrol of a banned identity", e.s.Enrol(e.ctx, r, store.EnrolOptions{}, once("session/1", T0.Add(time.Minute))), store.ErrRevoked)
		e.absent(t, r.ID)
		e.unset(t, "session/1")
		e.unbound(t, "worker-1", r.Identity)
		// Lifted: its first enrolment goes through.
		if _, err := e.s.Unban(e.ctx, r.Identity); err != nil {
			t.Fatal(err)
		}
		e.enrol(t, enrolment(2, "worker-1", r.Identity, "key-a"), store.EnrolOptions{})
	}},
	{"ban: again keeps the first; an unbound name is ErrNotFound; Bans lists them", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		if _, err := e.s.Ban(e.ctx, store.Ban{NodeName: "worker-1", At: T0, By: "alice", Reason: "first"}); err != nil {
			t.Fatal(err)
		}
		again, err := e.s.Ban(e.ctx, store.Ban{Identity: a.Identity, At: T0.Add(time.Hour), By: "bob", Reason: "second"})
		if err != nil || again.By != "alice" || again.Reason != "first" || !again.At.Equal(T0) {
			t.Fatalf("Ban again = %+v, %v; want the first", again, err)
		}
		if b, err := e.s.Revoke(e.ctx, "worker-1", "third", T0.Add(2*time.Hour)); err != nil || b.Revoked.Reason != "first" {
			t.Fatalf("Revoke of a banned node = %+v, %v; want the first ban", b, err)
		}
		if _, err := e.s.Ban(e.ctx, store.Ban{NodeName: "worker-9", At: T0}); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Ban of an unbound name: %v", err)
		}
		if _, err := e.s.Ban(e.ctx, store.Ban{Identity: "aws:1/r/i-2", At: T0}); err != nil {
			t.Fatal(err)
		}
		bans, err := e.s.Bans(e.ctx)
		var got []string
		for _, b := range bans {
			got = append(got, b.Identity)
		}
		slices.Sort(got)
		if err != nil || !slices.Equal(got, []string{"aws:1/r/i-2", a.Identity}) {
			t.Fatalf("Bans = %v, %v", got, err)
		}
		if _, err := e.s.BanOf(e.ctx, "tpm-ek:nobody"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("BanOf of an identity never banned: %v", err)
		}
	}},
	{"release: a revoked binding's revocation becomes the identity's ban", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		if _, err := e.s.Revoke(e.ctx, "worker-1", "stolen", T0); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.Release(e.ctx, "worker-1"); err != nil {
			t.Fatal(err)
		}
		if ban, err := e.s.BanOf(e.ctx, a.Identity); err != nil || ban.Reason != "stolen" {
			t.Fatalf("BanOf after releasing a revoked node = %+v, %v", ban, err)
		}
		is(t, "Enrol under another name", e.s.Enrol(e.ctx, enrolment(2, "worker-2", a.Identity, "key-b"), store.EnrolOptions{}), store.ErrRevoked)
	}},
	{"history: each release, newest first, with who and why, at most MaxReleased", func(t *testing.T, e *env) {
		if _, err := e.s.History(e.ctx, "worker-1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("History of a name never released: %v", err)
		}
		n := store.MaxReleased + 2
		for i := range n {
			r := enrolment(i, "worker-1", fmt.Sprintf("tpm-ek:%d", i), fmt.Sprint("key-", i))
			e.enrol(t, r, store.EnrolOptions{})
			if i == 0 {
				if _, err := e.s.Revoke(e.ctx, "worker-1", "", T0); err != nil {
					t.Fatal(err)
				}
			}
			at := T0.Add(time.Duration(i+1) * time.Minute)
			if _, err := e.s.Release(e.ctx, "worker-1", store.Act{At: at, By: fmt.Sprint("op-", i), Reason: "replaced"}); err != nil {
				t.Fatal(err)
			}
		}
		h, err := e.s.History(e.ctx, "worker-1")
		if err != nil || h.NodeName != "worker-1" || len(h.Released) != store.MaxReleased {
			t.Fatalf("History = %+v, %v; want %d releases", h, err, store.MaxReleased)
		}
		for j, r := range h.Released {
			i := n - 1 - j
			if r.Identity != fmt.Sprintf("tpm-ek:%d", i) || r.Act.By != fmt.Sprint("op-", i) || r.Act.Reason != "replaced" ||
				!r.Act.At.Equal(T0.Add(time.Duration(i+1)*time.Minute)) || r.Pool != "worker" || r.Kind != attest.KindTPM || !r.CreatedAt.Equal(T0) || r.Revoked {
				t.Fatalf("release %d = %+v; want identity %d's", j, r, i)
			}
		}
		// A release without who and when: the store's clock.
		e.enrol(t, enrolment(100, "worker-2", "tpm-ek:x", "key-x"), store.EnrolOptions{})
		e.clock.Set(T0.Add(5 * time.Hour))
		if _, err := e.s.Release(e.ctx, "worker-2"); err != nil {
			t.Fatal(err)
		}
		if h, err := e.s.History(e.ctx, "worker-2"); err != nil || len(h.Released) != 1 || !h.Released[0].Act.At.Equal(T0.Add(5*time.Hour)) {
			t.Fatalf("History of worker-2 = %+v, %v", h, err)
		}
		hs, err := e.s.Histories(e.ctx)
		if err != nil || len(hs) != 2 {
			t.Fatalf("Histories = %d, %v; want 2", len(hs), err)
		}
	}},
	{"history: a revoked release says so", func(t *testing.T, e *env) {
		e.enrol(t, enrolment(1, "worker-1", "tpm-ek:aaa", "key-a"), store.EnrolOptions{})
		if _, err := e.s.Revoke(e.ctx, "worker-1", "", T0); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.Release(e.ctx, "worker-1"); err != nil {
			t.Fatal(err)
		}
		if h, err := e.s.History(e.ctx, "worker-1"); err != nil || len(h.Released) != 1 || !h.Released[0].Revoked {
			t.Fatalf("History = %+v, %v", h, err)
		}
	}},
	{"adopt: once, kept by releases", func(t *testing.T, e *env) {
		h, err := e.s.Adopt(e.ctx, "legacy-1", store.Act{At: T0, By: "alice", Reason: "predates nodeproof"})
		if err != nil || h.Adopted == nil || h.Adopted.By != "alice" || !h.Adopted.At.Equal(T0) {
			t.Fatalf("Adopt = %+v, %v", h, err)
		}
		if h, err := e.s.Adopt(e.ctx, "legacy-1", store.Act{At: T0.Add(time.Hour), By: "bob"}); err != nil || h.Adopted.By != "alice" {
			t.Fatalf("Adopt again = %+v, %v; want the first", h, err)
		}
		e.enrol(t, enrolment(1, "legacy-1", "tpm-ek:aaa", "key-a"), store.EnrolOptions{})
		if _, err := e.s.Release(e.ctx, "legacy-1"); err != nil {
			t.Fatal(err)
		}
		h, err = e.s.History(e.ctx, "legacy-1")
		if err != nil || h.Adopted == nil || h.Adopted.By != "alice" || len(h.Released) != 1 {
			t.Fatalf("History = %+v, %v", h, err)
		}
	}},
	{"enrolling again cannot move the node to another pool", func(t *testing.T, e *env) {
		a := enrolment(1, "worker-1", "tpm-ek:aaa", "key-a")
		e.enrol(t, a, store.EnrolOptions{})
		for _, o := range []store.EnrolOptions{{Again: true}, {Again: true, ReplaceKey: true}} {
			r := enrolment(2, "worker-1", a.Identity, "key-a")
			r.Pool = "master"
			is(t, fmt.Sprintf("Enrol again in another pool %+v", o), e.s.Enrol(e.ctx, r, o, once("session/2", T0.Add(time.Minute))), store.ErrPoolFixed)
			e.absent(t, r.ID)
			e.unset(t, "session/2")
			is(t, "ReleaseOnce", e.s.ReleaseOnce(e.ctx, "session/2"), nil)
		}
		e.bound(t, a)
		// Released, the machine may enrol in another pool: an operator's act.
		if _, err := e.s.Release(e.ctx, "worker-1"); err != nil {
			t.Fatal(err)
		}
		r := enrolment(3, "worker-1", a.Identity, "key-b")
		r.Pool = "master"
		e.enrol(t, r, store.EnrolOptions{Again: true})
		e.bound(t, r)
	}},
	{"concurrent ban and enrolments of the identity: when Ban returns, no binding of it stands unrevoked", func(t *testing.T, e *env) {
		const identity = "tpm-ek:racer"
		errs := race(func(i int) error {
			if i == 0 {
				_, err := e.s.Ban(e.ctx, store.Ban{Identity: identity, At: T0, By: "alice"})
				return err
			}
			return e.s.Enrol(e.ctx, enrolment(i, fmt.Sprintf("node-%d", i), identity, "key"), store.EnrolOptions{})
		})
		if errs[0] != nil {
			t.Fatalf("Ban: %v", errs[0])
		}
		for i, err := range errs[1:] {
			if err != nil && !errors.Is(err, store.ErrRevoked) && !errors.Is(err, store.ErrIdentityEnrolled) {
				t.Fatalf("enrolment %d: %v", i+1, err)
			}
		}
		if b, err := e.s.BindingOf(e.ctx, identity); err == nil && b.Revoked == nil {
			t.Fatalf("binding %s of the banned identity is not revoked", b.NodeName)
		} else if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		is(t, "Enrol after the ban", e.s.Enrol(e.ctx, enrolment(99, "node-99", identity, "key"), store.EnrolOptions{}), store.ErrRevoked)
	}},
}
