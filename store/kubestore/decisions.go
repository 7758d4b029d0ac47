package kubestore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

// recordNodeIndex and recordTokenIndex index cached NodeAttestations by
// spec.nodeName and spec.bootstrapTokenID.
const (
	recordNodeIndex  = "spec.nodeName"
	recordTokenIndex = "spec.bootstrapTokenID"
)

// Cached is the approver's Store: Watched (Binding from a watch, and the
// node controller's OnChange), and RecordsForNode read from a watch of the
// namespace's NodeAttestations instead of a LIST per CSR, and ConsumeRecord first writes with the cached
// record's resourceVersion instead of reading it again. Everything else is
// the Store's.
//
// What the cache may get wrong, and why decisions stay sound:
//   - a miss (no binding for the name, or no record for the node: an
//     object written a moment ago that the watch has not brought yet) is
//     read from the API server, so a lagging watch never leaves a CSR
//     undecided or denies it for want of a record;
//   - a stale record cannot be consumed twice: the consumption is a status
//     update carrying the cached resourceVersion, which the API server
//     refuses (Conflict) if the record changed since; then it is read
//     again and decided as the Store does. A record the cache shows
//     consumed stays consumed (nothing unsets it);
//   - a stale binding (a revocation or release the watch has not brought
//     yet, milliseconds) is read as a direct read made that much earlier
//     would have been: the decision is ordered before the revocation;
//   - until the watch has synced, and for WatchQuarantine after it reported
//     an error, every read goes to the API server (see Watched).
//
// Cached bindings come without their status's claims (newWatch), which no
// decision reads.
//
// Lineages (store.Lineages) are read from the watch too, a miss read
// through; UpdateLineage writes with the cached lineage's resourceVersion
// and, on a conflict, reads it again from the API server. RecordsForToken
// (store.TokenIndex) answers from an index of the watched records only.
type Cached struct {
	*Watched
}

var (
	_ store.Lineages   = (*Cached)(nil)
	_ store.TokenIndex = (*Cached)(nil)
)

// NewCached returns the cache over st's namespace; Start it and wait for
// it to sync before deciding.
func NewCached(cfg *rest.Config, st *Store) (*Cached, error) {
	c, h, err := newWatch(cfg, st.ns, st.clock, &v1alpha1.NodeBinding{}, &v1alpha1.NodeAttestation{}, &v1alpha1.IdentityBan{}, &v1alpha1.NodeNameHistory{},
		&v1alpha1.KubeletLineage{})
	if err != nil {
		return nil, err
	}
	if err := c.IndexField(context.Background(), &v1alpha1.NodeAttestation{}, recordNodeIndex, func(o client.Object) []string {
		return []string{o.(*v1alpha1.NodeAttestation).Spec.NodeName}
	}); err != nil {
		return nil, fmt.Errorf("kubestore: record index: %w", err)
	}
	if err := c.IndexField(context.Background(), &v1alpha1.NodeAttestation{}, recordTokenIndex, func(o client.Object) []string {
		if id := o.(*v1alpha1.NodeAttestation).Spec.BootstrapTokenID; id != "" {
			return []string{id}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("kubestore: record index: %w", err)
	}
	return &Cached{&Watched{Store: st, watch: c, health: h}}, nil
}

// RecordsForNode implements store.Store from the cache (newest first); a
// node with no cached record is read from the API.
func (c *Cached) RecordsForNode(ctx context.Context, nodeName string) ([]*store.Record, error) {
	if !attest.ValidNodeName(nodeName) {
		return nil, nil
	}
	if !c.health.trusted() {
		return c.Store.RecordsForNode(ctx, nodeName)
	}
	var l v1alpha1.NodeAttestationList
	if err := c.watch.List(ctx, &l, client.InNamespace(c.ns), client.MatchingFields{recordNodeIndex: nodeName}); err != nil {
		return nil, fmt.Errorf("kubestore: cached records for %s: %w", nodeName, err)
	}
	if len(l.Items) == 0 {
		return c.Store.RecordsForNode(ctx, nodeName)
	}
	out := make([]*store.Record, 0, len(l.Items))
	for i := range l.Items {
		if l.Items[i].Spec.NodeName != nodeName {
			continue
		}
		r, err := fromObject(&l.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	sortNewestFirst(out)
	return out, nil
}

// ConsumeRecord implements store.Store: ErrRevoked when the watch holds a
// ban of the record's identity, else one status update with the cached
// record's resourceVersion; on a conflict, a miss or anything unexpected,
// the Store's read-then-write (which reads the ban from the API server).
func (c *Cached) ConsumeRecord(ctx context.Context, id, by string, at time.Time) error {
	if validID(id) != nil {
		return fmt.Errorf("kubestore: record %q: %w", id, store.ErrNotFound)
	}
	if !c.health.trusted() {
		return c.Store.ConsumeRecord(ctx, id, by, at)
	}
	var obj v1alpha1.NodeAttestation
	if err := c.watch.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: id}, &obj); err != nil {
		return c.Store.ConsumeRecord(ctx, id, by, at)
	}
	if obj.Status.ConsumedAt != nil {
		return fmt.Errorf("kubestore: record %s (by %s): %w", id, obj.Status.ConsumedBy, store.ErrConsumed)
	}
	if c.cachedBan(ctx, obj.Spec.Identity) {
		return fmt.Errorf("kubestore: record %s: %s is banned: %w", id, obj.Spec.Identity, store.ErrRevoked)
	}
	t := metav1.NewMicroTime(at.UTC())
	obj.Status.ConsumedAt, obj.Status.ConsumedBy = &t, by
	bctx, cancel := bound(ctx)
	err := c.Store.c.Status().Update(bctx, &obj) // carries the cached resourceVersion
	cancel()
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("kubestore: record %s: %w", id, store.ErrNotFound)
	}
	// A conflict (the record changed since the watch brought it) or a
	// failed call: read it and write as the Store does.
	return c.Store.ConsumeRecord(ctx, id, by, at)
}

// History implements store.Store from the watch. Unlike the server's
// (Watched.History), a miss is the answer (ErrNotFound), not a read: the
// node controller asks for the history of every Node without a binding,
// most of them never nodeproof's, and a read per judgement of each would
// cost the API server what the watch saves; a history the watch brings a
// moment later queues its node again (OnChange). A watch not trusted now
// reads the API.
func (c *Cached) History(ctx context.Context, nodeName string) (*store.NameHistory, error) {
	if !c.health.trusted() || !attest.ValidNodeName(nodeName) {
		return c.Store.History(ctx, nodeName)
	}
	var obj v1alpha1.NodeNameHistory
	err := c.watch.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: nodeName}, &obj)
	switch {
	case err == nil:
		return fromHistory(&obj), nil
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("kubestore: history of %s: %w", nodeName, store.ErrNotFound)
	}
	return nil, fmt.Errorf("kubestore: cached history %s: %w", nodeName, err)
}

// sortNewestFirst orders records as RecordsForNode returns them.
func sortNewestFirst(out []*store.Record) {
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.After(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
}

// RecordsForToken implements store.TokenIndex from the watch's index (never
// a read of the API server): unknown (known false) while the watch is not
// trusted.
func (c *Cached) RecordsForToken(ctx context.Context, id string) ([]*store.Record, bool, error) {
	if !c.health.trusted() {
		return nil, false, nil
	}
	if id == "" {
		return nil, true, nil
	}
	var l v1alpha1.NodeAttestationList
	if err := c.watch.List(ctx, &l, client.InNamespace(c.ns), client.MatchingFields{recordTokenIndex: id}); err != nil {
		return nil, false, fmt.Errorf("kubestore: cached records of token %s: %w", id, err)
	}
	out := make([]*store.Record, 0, len(l.Items))
	for i := range l.Items {
		if l.Items[i].Spec.BootstrapTokenID != id {
			continue
		}
		r, err := fromObject(&l.Items[i])
		if err != nil {
			return nil, false, err
		}
		out = append(out, r)
	}
	sortNewestFirst(out)
	return out, true, nil
}

// Lineage implements store.Lineages from the watch; a miss, or a watch not
// trusted now, reads the API.
func (c *Cached) Lineage(ctx context.Context, nodeName string) (*store.Lineage, error) {
	if !c.health.trusted() {
		return c.Store.Lineage(ctx, nodeName)
	}
	obj, err := c.getLineage(ctx, c.watch, nodeName)
	switch {
	case err == nil:
		return fromLineage(obj)
	case errors.Is(err, store.ErrNotFound):
		return c.Store.Lineage(ctx, nodeName)
	}
	return nil, err
}

// UpdateLineage implements store.Lineages: the first try reads the
// lineage from the watch and writes with its resourceVersion (one call);
// a lost race, or a watch not trusted now, is the Store's read-then-write.
func (c *Cached) UpdateLineage(ctx context.Context, nodeName string, fn func(*store.Lineage) (*store.Lineage, error)) (*store.Lineage, error) {
	if c.health.trusted() {
		bctx, cancel := bound(ctx)
		out, retry, err := c.writeLineage(bctx, c.watch, nodeName, fn)
		cancel()
		if !retry {
			return out, err
		}
	}
	return c.Store.UpdateLineage(ctx, nodeName, fn)
}

// LineagesWith returns the lineages of c's namespace read as c reads them
// (the watch; a miss or an untrusted watch read through w) but written
// through w, a Store in the same namespace with a client of its own: so
// that recording certificates does not spend the rate limit of the
// client that consumes records for approvals.
func (c *Cached) LineagesWith(w *Store) (store.Lineages, error) {
	if w == nil || w.ns != c.ns {
		return nil, errors.New("kubestore: LineagesWith needs a Store in the cache's namespace")
	}
	return &cachedLineages{c: c, w: w}, nil
}

type cachedLineages struct {
	c *Cached
	w *Store
}

// Lineage implements store.Lineages.
func (l *cachedLineages) Lineage(ctx context.Context, nodeName string) (*store.Lineage, error) {
	if l.c.health.trusted() {
		obj, err := l.c.getLineage(ctx, l.c.watch, nodeName)
		if err == nil {
			return fromLineage(obj)
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
	}
	return l.w.Lineage(ctx, nodeName)
}

// UpdateLineage implements store.Lineages as Cached does, through w.
func (l *cachedLineages) UpdateLineage(ctx context.Context, nodeName string, fn func(*store.Lineage) (*store.Lineage, error)) (*store.Lineage, error) {
	if l.c.health.trusted() {
		bctx, cancel := bound(ctx)
		out, retry, err := l.w.writeLineage(bctx, l.c.watch, nodeName, fn)
		cancel()
		if !retry {
			return out, err
		}
	}
	return l.w.UpdateLineage(ctx, nodeName, fn)
}
