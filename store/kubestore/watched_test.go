package kubestore

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
	"github.com/nodeproof/nodeproof/store/storetest"
)

// testWatched: the server's binding reads answer what the API server
// holds — a binding written a moment ago, a revocation, a release — and a
// watch that is not synced or is failing answers nothing itself.
func testWatched(t *testing.T, k *cluster) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, err := NewClient(k.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := k.namespace(t)
	now := time.Now().Truncate(time.Second)
	st := k.store(t, sc, ns, func() time.Time { return now })
	w, err := NewWatched(k.cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	first := storetest.Record(storetest.ID(1), "worker-1", now)
	if err := st.Enrol(ctx, first, store.EnrolOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("before the watch syncs, reads go to the API server", func(t *testing.T) {
		if w.Trusted() {
			t.Fatal("a watch never started is trusted")
		}
		b, err := w.Binding(ctx, "worker-1")
		if err != nil || b.Identity != first.Identity {
			t.Fatalf("binding: %+v, %v", b, err)
		}
	})

	done := make(chan error, 1)
	wctx, stop := context.WithCancel(ctx)
	go func() { done <- w.Start(wctx) }()
	waitFor(t, "the watch to sync", w.Trusted)

	t.Run("a binding written a moment ago is read through", func(t *testing.T) {
		r := storetest.Record(storetest.ID(2), "worker-2", now)
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		if b, err := w.Binding(ctx, "worker-2"); err != nil || b.Identity != r.Identity || b.RecordID != r.ID {
			t.Fatalf("binding right after the write: %+v, %v", b, err)
		}
		if _, err := w.Binding(ctx, "nobody"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a name nobody holds: %v", err)
		}
	})

	t.Run("a ban written by hand revokes the binding and refuses the enrolment", func(t *testing.T) {
		// An IdentityBan applied with kubectl (GitOps), not `nodeproof
		// revoke`: no enrolment marker set, no binding revoked.
		r := storetest.Record(storetest.ID(30), "worker-30", now)
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		other := storetest.Record(storetest.ID(40), "worker-40", now)
		for _, id := range []string{r.Identity, other.Identity} {
			ban := &v1alpha1.IdentityBan{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.BanName(id), Namespace: ns},
				Spec: v1alpha1.IdentityBanSpec{Identity: id, At: metav1.NewMicroTime(now), By: "gitops"}}
			if err := k.admin.Create(ctx, ban); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "the ban in the watch", func() bool {
			b, err := w.Binding(ctx, "worker-30")
			return err == nil && b.Revoked != nil && b.Revoked.By == "gitops"
		})
		// A ban written by hand is enforced once the watch holds it (no
		// marker stands for it): wait for the second one too.
		waitFor(t, "the second ban in the watch", func() bool { return w.cachedBan(ctx, other.Identity) })
		if err := w.Enrol(ctx, other, store.EnrolOptions{}); !errors.Is(err, store.ErrRevoked) {
			t.Fatalf("the enrolment of an identity banned by hand: %v, want ErrRevoked", err)
		}
	})

	t.Run("the watch keeps no claims", func(t *testing.T) {
		if _, err := st.UpdateStatus(ctx, "worker-2", storetest.Record(storetest.ID(2), "worker-2", now).Identity, func(b *store.Binding) error {
			b.Status.Summary, b.Status.Claims = "attested", []byte(`{"kind":"tpm"}`)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the status update", func() bool {
			b, err := w.Binding(ctx, "worker-2")
			return err == nil && b.Status.Summary == "attested"
		})
		if b, _ := w.Binding(ctx, "worker-2"); len(b.Status.Claims) != 0 {
			t.Fatalf("the watch kept the claims: %s", b.Status.Claims)
		}
		if b, err := st.Binding(ctx, "worker-2"); err != nil || string(b.Status.Claims) != `{"kind":"tpm"}` {
			t.Fatalf("the store's binding: %+v, %v", b, err)
		}
	})

	t.Run("a revocation reaches the reads", func(t *testing.T) {
		if _, err := st.Revoke(ctx, "worker-1", "stolen", now); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the revocation", func() bool {
			b, err := w.Binding(ctx, "worker-1")
			return err == nil && b.Revoked != nil && b.Revoked.Reason == "stolen"
		})
	})

	t.Run("a release reaches the reads", func(t *testing.T) {
		if _, err := st.Release(ctx, "worker-2"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the release", func() bool {
			_, err := w.Binding(ctx, "worker-2")
			return errors.Is(err, store.ErrNotFound)
		})
	})

	t.Run("a stopped watch answers nothing", func(t *testing.T) {
		stop()
		if err := <-done; err != nil {
			t.Fatalf("Start: %v", err)
		}
		if w.Trusted() {
			t.Fatal("a stopped watch is trusted")
		}
		// Revoked and read straight away: the API server answers.
		r := storetest.Record(storetest.ID(3), "worker-3", now)
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Revoke(ctx, "worker-3", "gone", now); err != nil {
			t.Fatal(err)
		}
		if b, err := w.Binding(ctx, "worker-3"); err != nil || b.Revoked == nil {
			t.Fatalf("binding of a node revoked a moment ago: %+v, %v", b, err)
		}
	})

	t.Run("a failing watch answers nothing", func(t *testing.T) {
		// The server's service account in a namespace where it may get
		// and list bindings but not watch them (and holds the operators'
		// Role too: the test revokes as it): the watch fails after each
		// list, and reads go to the API server.
		_, binding := rbacObjects(t)
		ns := k.namespace(t)
		k.grant(t, ns, withoutVerb(storeRules(t), "nodebindings", "watch"), binding)
		sa := k.store(t, k.saClient(t), ns, time.Now)
		w, err := NewWatched(kubetest.AsServiceAccount(k.cfg, saNamespace, saName), sa)
		if err != nil {
			t.Fatal(err)
		}
		go w.Start(ctx)
		waitFor(t, "the watch's error", func() bool { return w.WatchErr() != nil })
		if err := w.WatchErr(); !apierrors.IsForbidden(err) {
			t.Fatalf("watch error %v, want Forbidden", err)
		}
		if w.Trusted() {
			t.Fatal("a watch failing a moment ago is trusted")
		}
		r := storetest.Record(storetest.ID(4), "worker-4", time.Now())
		if err := sa.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := sa.Revoke(ctx, "worker-4", "gone", time.Now()); err != nil {
			t.Fatal(err)
		}
		if b, err := w.Binding(ctx, "worker-4"); err != nil || b.Revoked == nil {
			t.Fatalf("binding of a node revoked a moment ago: %+v, %v", b, err)
		}
	})
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}
