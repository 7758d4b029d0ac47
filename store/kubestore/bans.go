package kubestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

// banPoll is how often Ban looks again for the binding of an enrolment in
// flight.
const banPoll = 100 * time.Millisecond

// Revoke implements store.Store: Ban by node name.
func (s *Store) Revoke(ctx context.Context, nodeName, reason string, at time.Time) (*store.Binding, error) {
	if _, err := s.Ban(ctx, store.Ban{NodeName: nodeName, Reason: reason, At: at}); err != nil {
		return nil, err
	}
	return s.Binding(ctx, nodeName)
}

// Ban implements store.Store. The API server has no transactions, so the
// ban holds against an enrolment racing it by order:
//
//  1. the IdentityBan is created (the first one stands);
//  2. the identity's enrolment marker (IdentityMarkerKey) is made to exist:
//     a first enrolment creates that marker before anything else, so one
//     that starts from now on finds it set, reads the ban and is refused
//     (ErrRevoked), at no cost to enrolments of identities never banned;
//  3. every binding of the identity is revoked (spec.revoked, with the
//     resourceVersion read: enrolling again, which updates the binding
//     the same way, either sees it or conflicts and reads it again);
//  4. when the marker names a record but no binding is found yet — an
//     enrolment that created its marker before step 2 and has not yet
//     created its binding — Ban looks again until the binding appears
//     (then step 3) or the marker is older than OrphanAge (every
//     enrolment call is bounded by DefaultTimeout: it cannot complete
//     any more).
//
// So when Ban returns, no binding of the identity stands unrevoked and none
// can be made.
func (s *Store) Ban(ctx context.Context, ban store.Ban) (*store.Ban, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, OrphanAge+DefaultTimeout)
		defer cancel()
	}
	if ban.Identity == "" {
		b, err := s.getBinding(ctx, ban.NodeName)
		if err != nil {
			return nil, err
		}
		ban.Identity = b.Spec.Identity
	}
	if ban.At.IsZero() {
		ban.At = s.clock()
	}
	if bs, err := s.bindingsOf(ctx, ban.Identity); err != nil {
		return nil, err
	} else if len(bs) > 0 {
		ban.NodeName, ban.Kind = bs[0].Spec.NodeName, attest.Kind(bs[0].Spec.Kind)
	}
	stored, err := s.createBan(ctx, ban)
	if err != nil {
		return nil, err
	}
	key := IdentityMarkerKey(ban.Identity)
	if _, _, err := s.setMarker(ctx, key, store.Never, ""); err != nil && !errors.Is(err, store.ErrUsed) {
		return nil, err
	}
	rev := &v1alpha1.Revocation{At: metav1.NewMicroTime(stored.At.UTC()), By: stored.By, Reason: stored.Reason}
	for {
		bs, err := s.bindingsOf(ctx, ban.Identity)
		if err != nil {
			return nil, err
		}
		for _, b := range bs {
			if _, err := s.updateBinding(ctx, b.Name, "revoke", maxAttempts, false, func(obj *v1alpha1.NodeBinding) (bool, error) {
				if obj.Spec.Identity != ban.Identity || obj.Spec.Revoked != nil {
					return false, nil
				}
				obj.Spec.Revoked = rev.DeepCopy()
				return true, nil
			}); err != nil && !errors.Is(err, store.ErrNotFound) {
				return nil, err
			}
		}
		if len(bs) > 0 {
			return stored, nil
		}
		var m v1alpha1.AttestationMarker
		err = s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: v1alpha1.MarkerName(key)}, &m)
		switch {
		case apierrors.IsNotFound(err):
			// Deleted meanwhile (a release completing): set it again.
			if _, _, err := s.setMarker(ctx, key, store.Never, ""); err != nil && !errors.Is(err, store.ErrUsed) {
				return nil, err
			}
			continue
		case err != nil:
			return nil, fmt.Errorf("kubestore: read marker of %s: %w", ban.Identity, err)
		case m.Spec.RecordID == "" || s.clock().Sub(m.CreationTimestamp.Time) >= OrphanAge:
			return stored, nil // no enrolment in flight
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kubestore: ban %s: an enrolment in flight (record %s) did not complete: %w", ban.Identity, m.Spec.RecordID, ctx.Err())
		case <-time.After(banPoll):
		}
	}
}

// createBan creates ban's IdentityBan, or returns the one that exists.
func (s *Store) createBan(ctx context.Context, ban store.Ban) (*store.Ban, error) {
	obj := &v1alpha1.IdentityBan{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.BanName(ban.Identity), Namespace: s.ns},
		Spec: v1alpha1.IdentityBanSpec{Identity: ban.Identity, Kind: string(ban.Kind), NodeName: ban.NodeName,
			At: metav1.NewMicroTime(ban.At.UTC()), By: ban.By, Reason: ban.Reason},
	}
	err := s.c.Create(ctx, obj)
	switch {
	case err == nil:
		return fromBan(obj), nil
	case apierrors.IsAlreadyExists(err):
		return s.BanOf(ctx, ban.Identity)
	}
	return nil, fmt.Errorf("kubestore: create ban of %s: %w", ban.Identity, err)
}

// bindingsOf lists the bindings whose spec.identity is identity (by the
// identity label; at most one, unless written by hand).
func (s *Store) bindingsOf(ctx context.Context, identity string) ([]v1alpha1.NodeBinding, error) {
	var out []v1alpha1.NodeBinding
	err := s.eachPage(ctx, &v1alpha1.NodeBindingList{}, []client.ListOption{client.MatchingLabels{v1alpha1.IdentityLabel: v1alpha1.LabelValue(identity)}},
		func(l client.ObjectList) error {
			for _, b := range l.(*v1alpha1.NodeBindingList).Items {
				if b.Spec.Identity == identity {
					out = append(out, b)
				}
			}
			return nil
		})
	return out, err
}

func fromBan(obj *v1alpha1.IdentityBan) *store.Ban {
	return &store.Ban{Identity: obj.Spec.Identity, Kind: attest.Kind(obj.Spec.Kind), NodeName: obj.Spec.NodeName,
		At: obj.Spec.At.UTC(), By: obj.Spec.By, Reason: obj.Spec.Reason}
}

// banned reports whether identity has an IdentityBan (a GET).
func (s *Store) banned(ctx context.Context, identity string) (bool, error) {
	_, err := s.BanOf(ctx, identity)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	}
	return false, err
}

// BanOf implements store.Store.
func (s *Store) BanOf(ctx context.Context, identity string) (*store.Ban, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	var obj v1alpha1.IdentityBan
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: v1alpha1.BanName(identity)}, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kubestore: ban of %s: %w", identity, store.ErrNotFound)
		}
		return nil, fmt.Errorf("kubestore: get ban of %s: %w", identity, err)
	}
	if obj.Spec.Identity != identity {
		return nil, fmt.Errorf("kubestore: ban of %s: %w", identity, store.ErrNotFound)
	}
	return fromBan(&obj), nil
}

// Bans implements store.Store.
func (s *Store) Bans(ctx context.Context) ([]*store.Ban, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	var out []*store.Ban
	err := s.eachPage(ctx, &v1alpha1.IdentityBanList{}, nil, func(l client.ObjectList) error {
		for i := range l.(*v1alpha1.IdentityBanList).Items {
			out = append(out, fromBan(&l.(*v1alpha1.IdentityBanList).Items[i]))
		}
		return nil
	})
	return out, err
}

// Unban implements store.Store: it deletes the IdentityBan, clears the
// revocation of the identity's bindings, and deletes the identity's
// enrolment marker when it holds no binding (Ban set it).
func (s *Store) Unban(ctx context.Context, identity string) (*store.Ban, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	var obj v1alpha1.IdentityBan
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: v1alpha1.BanName(identity)}, &obj); err != nil || obj.Spec.Identity != identity {
		if err == nil || apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kubestore: ban of %s: %w", identity, store.ErrNotFound)
		}
		return nil, fmt.Errorf("kubestore: get ban of %s: %w", identity, err)
	}
	out := fromBan(&obj)
	uid := obj.UID
	if err := s.c.Delete(ctx, &obj, client.Preconditions{UID: &uid}); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil, fmt.Errorf("kubestore: ban of %s: %w", identity, store.ErrNotFound)
		}
		return nil, fmt.Errorf("kubestore: delete ban of %s: %w", identity, err)
	}
	bs, err := s.bindingsOf(ctx, identity)
	if err != nil {
		return out, err
	}
	for _, b := range bs {
		if _, err := s.updateBinding(ctx, b.Name, "lift the revocation of", maxAttempts, false, func(obj *v1alpha1.NodeBinding) (bool, error) {
			if obj.Spec.Identity != identity || obj.Spec.Revoked == nil {
				return false, nil
			}
			obj.Spec.Revoked = nil
			return true, nil
		}); err != nil && !errors.Is(err, store.ErrNotFound) {
			return out, err
		}
	}
	if len(bs) == 0 {
		if err := s.ReleaseOnce(ctx, IdentityMarkerKey(identity)); err != nil {
			return out, err
		}
	}
	return out, nil
}

// Release implements store.Store. In order: the name's history gets the
// binding (so the node controller, which sees the binding go, finds the
// name was nodeproof's), a revoked binding's revocation becomes the
// identity's ban if it has none, the binding (the exact object read) is
// deleted, and then the identity's enrolment marker unless the identity is
// banned (a ban that appears meanwhile sets it again).
func (s *Store) Release(ctx context.Context, nodeName string, how ...store.Act) (*store.Binding, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	var act store.Act
	if len(how) > 0 {
		act = how[0]
	}
	if act.At.IsZero() {
		act.At = s.clock()
	}
	b, err := s.getBinding(ctx, nodeName)
	if err != nil {
		return nil, err
	}
	out, err := fromBinding(b)
	if err != nil {
		return nil, err
	}
	if _, err := s.updateHistory(ctx, nodeName, func(h *store.NameHistory) bool {
		h.AddReleased(store.Released{Identity: out.Identity, Kind: out.Kind, Pool: out.Pool, CreatedAt: out.CreatedAt, Revoked: out.Revoked != nil, Act: act})
		return true
	}); err != nil {
		return nil, err
	}
	if r := out.Revoked; r != nil {
		if _, err := s.createBan(ctx, store.Ban{Identity: out.Identity, Kind: out.Kind, NodeName: nodeName, At: r.At, By: r.By, Reason: r.Reason}); err != nil {
			return nil, err
		}
	}
	uid := b.UID
	if err := s.c.Delete(ctx, b, client.Preconditions{UID: &uid}); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil, fmt.Errorf("kubestore: binding %s: %w", nodeName, store.ErrNotFound)
		}
		return nil, fmt.Errorf("kubestore: delete binding %s: %w", nodeName, err)
	}
	key := IdentityMarkerKey(out.Identity)
	if banned, err := s.banned(ctx, out.Identity); err != nil || banned {
		return out, err
	}
	if err := s.ReleaseOnce(ctx, key); err != nil {
		return out, err
	}
	if banned, err := s.banned(ctx, out.Identity); err != nil {
		return out, err
	} else if banned {
		if _, _, err := s.setMarker(ctx, key, store.Never, ""); err != nil && !errors.Is(err, store.ErrUsed) {
			return out, err
		}
	}
	return out, nil
}

// Adopt implements store.Store.
func (s *Store) Adopt(ctx context.Context, nodeName string, how store.Act) (*store.NameHistory, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	if how.At.IsZero() {
		how.At = s.clock()
	}
	return s.updateHistory(ctx, nodeName, func(h *store.NameHistory) bool {
		if h.Adopted != nil {
			return false
		}
		h.Adopted = &how
		return true
	})
}

// updateHistory reads nodeName's history (an empty one if it has none),
// lets change modify it (false: no write) and writes it, with the
// resourceVersion read; a conflict reads again.
func (s *Store) updateHistory(ctx context.Context, nodeName string, change func(*store.NameHistory) bool) (*store.NameHistory, error) {
	if !attest.ValidNodeName(nodeName) {
		return nil, fmt.Errorf("kubestore: node name %q is not a DNS-1123 subdomain of at most %d characters", nodeName, attest.MaxNodeNameLength)
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		var obj v1alpha1.NodeNameHistory
		err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: nodeName}, &obj)
		exists := err == nil
		switch {
		case apierrors.IsNotFound(err):
			obj = v1alpha1.NodeNameHistory{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Namespace: s.ns},
				Spec: v1alpha1.NodeNameHistorySpec{NodeName: nodeName}}
		case err != nil:
			return nil, fmt.Errorf("kubestore: get history of %s: %w", nodeName, err)
		}
		h := fromHistory(&obj)
		if !change(h) {
			return h, nil
		}
		obj.Spec = toHistory(h)
		if exists {
			err = s.c.Update(ctx, &obj)
		} else {
			err = s.c.Create(ctx, &obj)
		}
		switch {
		case err == nil:
			return h, nil
		case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
			continue
		}
		return nil, fmt.Errorf("kubestore: write history of %s: %w", nodeName, err)
	}
	return nil, fmt.Errorf("kubestore: history of %s: still contended after %d attempts", nodeName, maxAttempts)
}

// History implements store.Store.
func (s *Store) History(ctx context.Context, nodeName string) (*store.NameHistory, error) {
	if !attest.ValidNodeName(nodeName) {
		return nil, fmt.Errorf("kubestore: history %q: %w", nodeName, store.ErrNotFound)
	}
	ctx, cancel := bound(ctx)
	defer cancel()
	var obj v1alpha1.NodeNameHistory
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: nodeName}, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kubestore: history of %s: %w", nodeName, store.ErrNotFound)
		}
		return nil, fmt.Errorf("kubestore: get history of %s: %w", nodeName, err)
	}
	return fromHistory(&obj), nil
}

// Histories implements store.Store.
func (s *Store) Histories(ctx context.Context) ([]*store.NameHistory, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	var out []*store.NameHistory
	err := s.eachPage(ctx, &v1alpha1.NodeNameHistoryList{}, nil, func(l client.ObjectList) error {
		for i := range l.(*v1alpha1.NodeNameHistoryList).Items {
			out = append(out, fromHistory(&l.(*v1alpha1.NodeNameHistoryList).Items[i]))
		}
		return nil
	})
	return out, err
}

func fromAct(a v1alpha1.OperatorAct) store.Act {
	return store.Act{At: a.At.UTC(), By: a.By, Reason: a.Reason}
}

func toAct(a store.Act) v1alpha1.OperatorAct {
	return v1alpha1.OperatorAct{At: metav1.NewMicroTime(a.At.UTC()), By: a.By, Reason: a.Reason}
}

func fromHistory(obj *v1alpha1.NodeNameHistory) *store.NameHistory {
	h := &store.NameHistory{NodeName: obj.Spec.NodeName}
	for _, r := range obj.Spec.Released {
		h.Released = append(h.Released, store.Released{Identity: r.Identity, Kind: attest.Kind(r.Kind), Pool: r.Pool,
			CreatedAt: r.CreatedAt.UTC(), Revoked: r.Revoked, Act: fromAct(r.Released)})
	}
	if obj.Spec.Adopted != nil {
		a := fromAct(*obj.Spec.Adopted)
		h.Adopted = &a
	}
	return h
}

func toHistory(h *store.NameHistory) v1alpha1.NodeNameHistorySpec {
	spec := v1alpha1.NodeNameHistorySpec{NodeName: h.NodeName}
	for _, r := range h.Released {
		spec.Released = append(spec.Released, v1alpha1.ReleasedBinding{Identity: r.Identity, Kind: string(r.Kind), Pool: r.Pool,
			CreatedAt: metav1.NewMicroTime(r.CreatedAt.UTC()), Revoked: r.Revoked, Released: toAct(r.Act)})
	}
	if h.Adopted != nil {
		a := toAct(*h.Adopted)
		spec.Adopted = &a
	}
	return spec
}
