package storetest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/store"
)

// Lineage returns a lineage of node for identity, bound at T0, with n
// certificates recorded a second apart (the newest first) that expire a
// day after T0.
func Lineage(node, identity string, n int) *store.Lineage {
	key := sha256.Sum256([]byte("kubelet key of " + node))
	l := &store.Lineage{NodeName: node, Identity: identity, BoundAt: T0, KubeletKeySHA256: key[:]}
	for i := n - 1; i >= 0; i-- {
		l.Add(Certificate(node, i), T0)
	}
	return l
}

// Certificate returns the i-th certificate of node's lineage.
func Certificate(node string, i int) store.IssuedCertificate {
	sum := sha256.Sum256(fmt.Appendf(nil, "certificate %d of %s", i, node))
	return store.IssuedCertificate{SHA256: sum[:], CSR: fmt.Sprintf("csr-%d/uid-%d", i, i),
		NotAfter: T0.Add(24 * time.Hour), RecordedAt: T0.Add(time.Duration(i) * time.Second)}
}

// LineageEqual reports how got differs from want ("" if it does not).
func LineageEqual(got, want *store.Lineage) string {
	switch {
	case got == nil || want == nil:
		if got != want {
			return fmt.Sprintf("got %v, want %v", got, want)
		}
		return ""
	case got.NodeName != want.NodeName || got.Identity != want.Identity || !got.BoundAt.Equal(want.BoundAt) ||
		!slices.Equal(got.KubeletKeySHA256, want.KubeletKeySHA256):
		return fmt.Sprintf("enrolment %s/%s/%s/%x, want %s/%s/%s/%x", got.NodeName, got.Identity, got.BoundAt, got.KubeletKeySHA256,
			want.NodeName, want.Identity, want.BoundAt, want.KubeletKeySHA256)
	case len(got.Certificates) != len(want.Certificates):
		return fmt.Sprintf("%d certificates, want %d", len(got.Certificates), len(want.Certificates))
	}
	for i, g := range got.Certificates {
		w := want.Certificates[i]
		if !slices.Equal(g.SHA256, w.SHA256) || g.CSR != w.CSR || !g.NotAfter.Equal(w.NotAfter) || !g.RecordedAt.Equal(w.RecordedAt) {
			return fmt.Sprintf("certificate %d = %+v, want %+v", i, g, w)
		}
	}
	return ""
}

// NewLineages returns a new, empty store.Lineages for one test.
type NewLineages func(t *testing.T) store.Lineages

// RunLineages is the conformance suite of store.Lineages: every case on a
// fresh store of its own, in parallel. Reads after a write are retried
// for a few seconds: a store that reads from a watch (kubestore.Cached)
// sees its own writes a moment later.
func RunLineages(t *testing.T, newStore NewLineages) {
	ctx := context.Background()
	// readBack reads node's lineage until diff says nothing is missing.
	readBack := func(t *testing.T, s store.Lineages, node string, diff func(*store.Lineage) string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			got, err := s.Lineage(ctx, node)
			if err != nil {
				t.Fatal(err)
			}
			d := diff(got)
			if d == "" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("read back: %s", d)
			}
		}
	}
	put := func(l *store.Lineage) func(*store.Lineage) (*store.Lineage, error) {
		return func(*store.Lineage) (*store.Lineage, error) { return l, nil }
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, s store.Lineages)
	}{
		{"none yet", func(t *testing.T, s store.Lineages) {
			if _, err := s.Lineage(ctx, "worker-1"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("Lineage of a name never written: %v, want ErrNotFound", err)
			}
		}},
		{"written, read back", func(t *testing.T, s store.Lineages) {
			want := Lineage("worker-1", "ek:a", 3)
			var saw *store.Lineage
			got, err := s.UpdateLineage(ctx, "worker-1", func(cur *store.Lineage) (*store.Lineage, error) { saw = cur; return want, nil })
			if err != nil || saw != nil {
				t.Fatalf("first UpdateLineage: %v (fn saw %v, want nil)", err, saw)
			}
			if d := LineageEqual(got, want); d != "" {
				t.Fatalf("UpdateLineage returned: %s", d)
			}
			readBack(t, s, "worker-1", func(got *store.Lineage) string { return LineageEqual(got, want) })
		}},
		{"fn sees the stored lineage and replaces it", func(t *testing.T, s store.Lineages) {
			first := Lineage("worker-1", "ek:a", 2)
			if _, err := s.UpdateLineage(ctx, "worker-1", put(first)); err != nil {
				t.Fatal(err)
			}
			next := Lineage("worker-1", "ek:b", 1) // another owner
			next.BoundAt = T0.Add(time.Hour)
			var last *store.Lineage // fn may run more than once: the write rests on its last view
			_, err := s.UpdateLineage(ctx, "worker-1", func(cur *store.Lineage) (*store.Lineage, error) {
				last = cur
				return next, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if d := LineageEqual(last, first); d != "" {
				t.Fatalf("the write rests on fn seeing %s", d)
			}
			readBack(t, s, "worker-1", func(got *store.Lineage) string { return LineageEqual(got, next) })
		}},
		{"nil from fn writes nothing, an error from fn is returned", func(t *testing.T, s store.Lineages) {
			if _, err := s.UpdateLineage(ctx, "worker-1", put(nil)); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Lineage(ctx, "worker-1"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("after fn returned nil: %v, want ErrNotFound", err)
			}
			boom := errors.New("boom")
			if _, err := s.UpdateLineage(ctx, "worker-1", func(*store.Lineage) (*store.Lineage, error) { return nil, boom }); !errors.Is(err, boom) {
				t.Fatalf("fn's error: got %v", err)
			}
		}},
		{"a lineage for another name is refused", func(t *testing.T, s store.Lineages) {
			if _, err := s.UpdateLineage(ctx, "worker-1", put(Lineage("worker-2", "ek:a", 1))); err == nil {
				t.Fatal("stored worker-2's lineage under worker-1")
			}
		}},
		{"concurrent additions are all kept", func(t *testing.T, s store.Lineages) {
			if _, err := s.UpdateLineage(ctx, "worker-1", put(Lineage("worker-1", "ek:a", 0))); err != nil {
				t.Fatal(err)
			}
			errs := race(func(i int) error {
				_, err := s.UpdateLineage(ctx, "worker-1", func(cur *store.Lineage) (*store.Lineage, error) {
					if cur == nil { // a cache a moment behind: the write fails, fn runs again
						cur = Lineage("worker-1", "ek:a", 0)
					}
					next := *cur
					next.Certificates = slices.Clone(cur.Certificates)
					next.Add(Certificate("worker-1", i), T0)
					return &next, nil
				})
				return err
			})
			for i, err := range errs {
				if err != nil {
					t.Fatalf("caller %d: %v", i, err)
				}
			}
			readBack(t, s, "worker-1", func(got *store.Lineage) string {
				for i := range Concurrency {
					if _, ok := got.Has(Certificate("worker-1", i).SHA256); !ok {
						return fmt.Sprintf("certificate %d of %d concurrent additions was lost", i, Concurrency)
					}
				}
				return ""
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, newStore(t))
		})
	}
}
