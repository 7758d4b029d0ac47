package kubestore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

// WatchQuarantine is how long after a watch error its cache is not read
// (reads go to the API server): a watch that fails — RBAC without watch, an
// API server that drops it — is only re-listed by client-go after a
// backoff of up to 30 s, so a cache behind a failing watch may miss a
// revocation for that long. A watch failing again before this passes keeps
// its cache out of use.
const WatchQuarantine = time.Minute

// watchHealth says whether a watch's cache may answer reads: it has synced
// once, has not stopped, and no watch error was reported within
// WatchQuarantine of now.
type watchHealth struct {
	clock           func() time.Time
	synced, stopped atomic.Bool
	mu              sync.Mutex
	errAt           time.Time
	err             error
}

// handler is the watch's error handler (cache.Options).
func (h *watchHealth) handler(ctx context.Context, r *toolscache.Reflector, err error) {
	h.mu.Lock()
	h.errAt, h.err = h.clock(), err
	h.mu.Unlock()
	toolscache.DefaultWatchErrorHandler(ctx, r, err)
}

// trusted reports whether the cache may answer now.
func (h *watchHealth) trusted() bool {
	if !h.synced.Load() || h.stopped.Load() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.errAt.IsZero() || h.clock().Sub(h.errAt) >= WatchQuarantine
}

// lastErr is the last watch error reported (nil if none).
func (h *watchHealth) lastErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Watched is the server's Store: Binding — what a config fetch reads to
// see that the enrolment still stands — is answered from a watch of the
// namespace's NodeBindings instead of a GET per fetch (without the status's
// claims, which the watch does not keep: read them with the Store). It
// also watches IdentityBans (Enrol refuses a banned identity from the
// watch first, so a ban written by hand, without the enrolment marker
// `nodeproof revoke` sets, is enforced too) and NodeNameHistories (History).
// Everything else is the Store's; every write goes to the API server.
//
// Why a fetch stays sound on a cached binding:
//   - a miss (a binding created a moment ago that the watch has not brought
//     yet) is read from the API server, so a lagging watch never refuses a
//     machine that just enrolled;
//   - a stale binding (a revocation or release the watch has not brought
//     yet) is read as a direct read made that much earlier would have been
//     (the watch's delay, milliseconds): the fetch is ordered before the
//     revocation, as the approver's decisions are (Cached);
//   - until the watch has synced, and for WatchQuarantine after it reported
//     an error, every read goes to the API server: a broken watch cannot
//     hide a revocation for longer than it takes to notice it.
type Watched struct {
	*Store
	watch  cache.Cache
	health *watchHealth
}

// NewWatched returns the watch over st's namespace; Start it. Until it has
// synced, reads go to the API server.
func NewWatched(cfg *rest.Config, st *Store) (*Watched, error) {
	c, h, err := newWatch(cfg, st.ns, st.clock, &v1alpha1.NodeBinding{}, &v1alpha1.IdentityBan{}, &v1alpha1.NodeNameHistory{})
	if err != nil {
		return nil, err
	}
	return &Watched{Store: st, watch: c, health: h}, nil
}

// newWatch is a cache of objs' kinds in namespace, with their informers
// made and its watch errors going to the health it returns. It keeps
// objects without their managedFields, and bindings without their status's
// claims (what no cached read uses: up to 128 KiB a binding, the bulk of
// its size), so a cache of every node's binding stays small.
func newWatch(cfg *rest.Config, namespace string, clock func() time.Time, objs ...client.Object) (cache.Cache, *watchHealth, error) {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, nil, fmt.Errorf("kubestore: %w", err)
	}
	h := &watchHealth{clock: clock}
	by := map[client.Object]cache.ByObject{}
	for _, o := range objs {
		by[o] = cache.ByObject{}
	}
	c, err := cache.New(cfg, cache.Options{Scheme: s, DefaultNamespaces: map[string]cache.Config{namespace: {}},
		ByObject: by, DefaultWatchErrorHandler: h.handler, DefaultTransform: slim})
	if err != nil {
		return nil, nil, fmt.Errorf("kubestore: watch: %w", err)
	}
	for _, o := range objs {
		if _, err := c.GetInformer(context.Background(), o); err != nil {
			return nil, nil, fmt.Errorf("kubestore: informer for %T: %w", o, err)
		}
	}
	return c, h, nil
}

// Start runs the watch until ctx ends; reads use it once it has synced.
func (w *Watched) Start(ctx context.Context) error {
	defer w.health.stopped.Store(true) // a stopped watch answers nothing
	go w.WaitForSync(ctx)
	return w.watch.Start(ctx)
}

// WaitForSync waits for the first lists; false if ctx ended first. Reads
// go to the API server until the watch has synced.
func (w *Watched) WaitForSync(ctx context.Context) bool {
	ok := w.watch.WaitForCacheSync(ctx)
	if ok {
		w.health.synced.Store(true)
	}
	return ok
}

// Trusted reports whether reads are answered from the watch now (synced,
// no recent watch error).
func (w *Watched) Trusted() bool { return w.health.trusted() }

// WatchErr is the last error the watch reported, nil if none.
func (w *Watched) WatchErr() error { return w.health.lastErr() }

// Binding implements store.Store from the watch, revoked when the watch
// holds a ban of its identity; a miss, or a watch not trusted now, reads
// the API.
func (w *Watched) Binding(ctx context.Context, nodeName string) (*store.Binding, error) {
	if !w.health.trusted() {
		return w.Store.Binding(ctx, nodeName)
	}
	b, err := cachedBinding(ctx, w.watch, w.Store, nodeName)
	if err == nil && b.Revoked == nil {
		w.banned(ctx, b)
	}
	return b, err
}

// banned sets b.Revoked from a ban of its identity that the watch holds:
// a ban `nodeproof revoke` made has revoked the binding already, but one
// written by hand (an IdentityBan applied with kubectl) has not.
func (w *Watched) banned(ctx context.Context, b *store.Binding) {
	var ban v1alpha1.IdentityBan
	if err := w.watch.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: v1alpha1.BanName(b.Identity)}, &ban); err == nil && ban.Spec.Identity == b.Identity {
		b.Revoked = fromBan(&ban).Revocation()
	}
}

// Enrol implements store.Store: ErrRevoked (ConflictBanned) when the
// watch holds a ban of r's identity, else the Store's Enrol (which finds the bans `nodeproof
// revoke` made through the identity's enrolment marker).
func (w *Watched) Enrol(ctx context.Context, r *store.Record, o store.EnrolOptions, once ...store.Once) error {
	if w.cachedBan(ctx, r.Identity) {
		return store.NewConflict(store.ConflictBanned, nil, nil, "kubestore: %s is banned", r.Identity)
	}
	return w.Store.Enrol(ctx, r, o, once...)
}

// History implements store.Store from the watch; a miss, or a watch not
// trusted now, reads the API.
func (w *Watched) History(ctx context.Context, nodeName string) (*store.NameHistory, error) {
	if !w.health.trusted() || !attest.ValidNodeName(nodeName) {
		return w.Store.History(ctx, nodeName)
	}
	var obj v1alpha1.NodeNameHistory
	err := w.watch.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: nodeName}, &obj)
	switch {
	case err == nil:
		return fromHistory(&obj), nil
	case apierrors.IsNotFound(err):
		return w.Store.History(ctx, nodeName)
	}
	return nil, fmt.Errorf("kubestore: cached history %s: %w", nodeName, err)
}

// cachedBan reports whether the watch holds a ban of identity (false when
// the watch is not trusted now).
func (w *Watched) cachedBan(ctx context.Context, identity string) bool {
	if identity == "" || !w.health.trusted() {
		return false
	}
	var ban v1alpha1.IdentityBan
	err := w.watch.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: v1alpha1.BanName(identity)}, &ban)
	return err == nil && ban.Spec.Identity == identity
}

// UID is the uid of nodeName's binding as the watch has it, "" when the
// watch has none (or has not synced): what binding Events name
// (BindingEvents.UIDs), with no API call.
func (w *Watched) UID(nodeName string) types.UID {
	if !w.health.synced.Load() || !attest.ValidNodeName(nodeName) {
		return ""
	}
	var obj v1alpha1.NodeBinding
	if err := w.watch.Get(context.Background(), client.ObjectKey{Namespace: w.ns, Name: nodeName}, &obj); err != nil {
		return ""
	}
	return obj.UID
}

// cachedBinding reads nodeName's binding from watch, or from st when the
// watch has none.
func cachedBinding(ctx context.Context, watch client.Reader, st *Store, nodeName string) (*store.Binding, error) {
	if !attest.ValidNodeName(nodeName) {
		return nil, fmt.Errorf("kubestore: binding %q: %w", nodeName, store.ErrNotFound)
	}
	var obj v1alpha1.NodeBinding
	err := watch.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: nodeName}, &obj)
	switch {
	case err == nil:
		return fromBinding(&obj)
	case apierrors.IsNotFound(err):
		return st.Binding(ctx, nodeName)
	}
	return nil, fmt.Errorf("kubestore: cached binding %s: %w", nodeName, err)
}

// slim is the caches' transform: no managedFields, and a binding without
// its status's claims.
func slim(in any) (any, error) {
	if b, ok := in.(*v1alpha1.NodeBinding); ok {
		b.Status.Claims = nil
	}
	return cache.TransformStripManagedFields()(in)
}

// OnChange calls fn with the node name of every binding and name history
// added, changed or deleted (and of every one at the first list), and of
// the name a ban names: what the approver's node controller queues its
// judgements by.
func (w *Watched) OnChange(ctx context.Context, fn func(nodeName string)) error {
	name := func(obj any) {
		if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		switch o := obj.(type) {
		case *v1alpha1.NodeBinding:
			fn(o.Name)
		case *v1alpha1.NodeNameHistory:
			fn(o.Name)
		case *v1alpha1.IdentityBan:
			if o.Spec.NodeName != "" {
				fn(o.Spec.NodeName)
			}
		}
	}
	for _, kind := range []client.Object{&v1alpha1.NodeBinding{}, &v1alpha1.NodeNameHistory{}, &v1alpha1.IdentityBan{}} {
		inf, err := w.watch.GetInformer(ctx, kind)
		if err != nil {
			return err
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: name, UpdateFunc: func(_, n any) { name(n) }, DeleteFunc: name,
		}); err != nil {
			return err
		}
	}
	return nil
}
