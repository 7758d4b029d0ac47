package kubestore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/storetest"
)

// testDecisionCache: the approver's cached reads answer what the API
// server holds, a miss is read through, and a record is consumed once
// however stale the cache that tries.
func testDecisionCache(t *testing.T, k *cluster) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, err := NewClient(k.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := k.namespace(t)
	now := time.Now().Truncate(time.Second)
	st := k.store(t, sc, ns, func() time.Time { return now })
	cached := func() *Cached {
		c, err := NewCached(k.cfg, st)
		if err != nil {
			t.Fatal(err)
		}
		go c.Start(ctx)
		if !c.WaitForSync(ctx) {
			t.Fatal("the decision cache did not sync")
		}
		return c
	}
	first := storetest.Record(storetest.ID(1), "worker-1", now)
	if err := st.Enrol(ctx, first, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}
	a, b := cached(), cached()

	t.Run("reads what the API server holds", func(t *testing.T) {
		bd, err := a.Binding(ctx, "worker-1")
		if err != nil || bd.Identity != first.Identity {
			t.Fatalf("cached binding: %+v, %v", bd, err)
		}
		recs, err := a.RecordsForNode(ctx, "worker-1")
		if err != nil || len(recs) != 1 || recs[0].ID != first.ID {
			t.Fatalf("cached records: %v, %v", recs, err)
		}
		if _, err := a.Binding(ctx, "nobody"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a name nobody holds: %v", err)
		}
	})

	t.Run("name histories and bans come from the watch", func(t *testing.T) {
		if _, err := a.History(ctx, "hist-1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("the history of a name never released: %v", err)
		}
		r := storetest.Record(storetest.ID(50), "hist-1", now)
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Ban(ctx, store.Ban{NodeName: "hist-1", At: now, By: "alice"}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Release(ctx, "hist-1", store.Act{By: "bob"}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the history in the cache", func() bool {
			h, err := a.History(ctx, "hist-1")
			return err == nil && len(h.Released) == 1 && h.Released[0].Act.By == "bob" && h.Released[0].Revoked
		})
		// The banned identity's record is refused from the cache.
		waitFor(t, "the ban in the cache", func() bool { return a.cachedBan(ctx, r.Identity) })
		if err := a.ConsumeRecord(ctx, r.ID, "csr-x", now); !errors.Is(err, store.ErrRevoked) {
			t.Fatalf("ConsumeRecord of a banned identity's record through the cache: %v, want ErrRevoked", err)
		}
	})

	t.Run("a record written a moment ago is read through", func(t *testing.T) {
		r := storetest.Record(storetest.ID(2), "worker-2", now)
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		// At once: the watch may not have brought them; the answer must
		// not depend on it.
		recs, err := a.RecordsForNode(ctx, "worker-2")
		if err != nil || len(recs) != 1 || recs[0].ID != r.ID {
			t.Fatalf("records right after the write: %v, %v", recs, err)
		}
		if bd, err := a.Binding(ctx, "worker-2"); err != nil || bd.Identity != r.Identity {
			t.Fatalf("binding right after the write: %+v, %v", bd, err)
		}
	})

	t.Run("two approvers with their own caches consume a record once", func(t *testing.T) {
		r := storetest.Record(storetest.ID(3), "worker-3", now)
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []*Cached{a, b} { // both caches hold it, unconsumed
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				recs, _ := c.RecordsForNode(ctx, "worker-3")
				if len(recs) == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the watch did not bring the record")
				}
			}
		}
		var won atomic.Int32
		var wg sync.WaitGroup
		for i, c := range []*Cached{a, b, a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := c.ConsumeRecord(ctx, r.ID, "csr-"+string(rune('a'+i))+"/uid", now)
				switch {
				case err == nil:
					won.Add(1)
				case !errors.Is(err, store.ErrConsumed):
					t.Errorf("consume %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
		if won.Load() != 1 {
			t.Fatalf("%d consumptions succeeded, want exactly 1", won.Load())
		}
	})

	t.Run("a cache that has not seen the consumption is refused", func(t *testing.T) {
		r := storetest.Record(storetest.ID(4), "worker-4", now)
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if recs, _ := a.RecordsForNode(ctx, "worker-4"); len(recs) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the watch did not bring the record")
			}
		}
		// Consumed straight through the API; a's cached copy is (or may
		// be) the unconsumed one.
		if err := st.ConsumeRecord(ctx, r.ID, "csr-x/uid", now); err != nil {
			t.Fatal(err)
		}
		if err := a.ConsumeRecord(ctx, r.ID, "csr-y/uid", now); !errors.Is(err, store.ErrConsumed) {
			t.Fatalf("consuming again through a stale cache: %v, want ErrConsumed", err)
		}
		got, err := st.GetRecord(ctx, r.ID)
		if err != nil || got.ConsumedBy != "csr-x/uid" {
			t.Fatalf("the record is consumed by %q (%v), want the first", got.ConsumedBy, err)
		}
	})

	t.Run("records by bootstrap token, from the watch only", func(t *testing.T) {
		r := storetest.Record(storetest.ID(5), "worker-5", now)
		r.BootstrapTokenID = "tok555"
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			recs, known, err := a.RecordsForToken(ctx, "tok555")
			if err != nil || !known {
				t.Fatalf("a synced watch: known %v, %v", known, err)
			}
			if len(recs) == 1 && recs[0].ID == r.ID && recs[0].NodeName == "worker-5" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the watch did not bring the record by its token: %v", recs)
			}
		}
		if recs, known, err := a.RecordsForToken(ctx, "nosuch"); err != nil || !known || len(recs) != 0 {
			t.Fatalf("a token no record names: %v, %v, %v", recs, known, err)
		}
		unsynced, err := NewCached(k.cfg, st)
		if err != nil {
			t.Fatal(err)
		}
		if _, known, err := unsynced.RecordsForToken(ctx, "tok555"); known || err != nil {
			t.Fatalf("a watch not started answered: known %v, %v", known, err)
		}
	})
}

// testLineages runs the store.Lineages conformance suite on the Store and
// on the approver's cached reads (kubestore.Cached, which writes with the
// resourceVersion its watch holds).
func testLineages(t *testing.T, k *cluster) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, err := NewClient(k.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("Store", func(t *testing.T) {
		storetest.RunLineages(t, func(t *testing.T) store.Lineages { return k.store(t, sc, k.namespace(t), time.Now) })
	})
	t.Run("Cached", func(t *testing.T) {
		storetest.RunLineages(t, func(t *testing.T) store.Lineages {
			c, err := NewCached(k.cfg, k.store(t, sc, k.namespace(t), time.Now))
			if err != nil {
				t.Fatal(err)
			}
			go c.Start(ctx)
			if !c.WaitForSync(ctx) {
				t.Fatal("the cache did not sync")
			}
			return c
		})
	})
	t.Run("Cached, written through another client", func(t *testing.T) {
		storetest.RunLineages(t, func(t *testing.T) store.Lineages {
			ns := k.namespace(t)
			c, err := NewCached(k.cfg, k.store(t, sc, ns, time.Now))
			if err != nil {
				t.Fatal(err)
			}
			go c.Start(ctx)
			if !c.WaitForSync(ctx) {
				t.Fatal("the cache did not sync")
			}
			wc, err := NewClient(k.cfg)
			if err != nil {
				t.Fatal(err)
			}
			l, err := c.LineagesWith(k.store(t, wc, ns, time.Now))
			if err != nil {
				t.Fatal(err)
			}
			return l
		})
		c, err := NewCached(k.cfg, k.store(t, sc, k.namespace(t), time.Now))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.LineagesWith(k.store(t, sc, k.namespace(t), time.Now)); err == nil {
			t.Fatal("LineagesWith accepted a Store of another namespace")
		}
	})
}
