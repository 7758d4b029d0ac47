package kubestore

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

// statusAttempts bounds UpdateStatus's tries: a node's status has few
// writers (its own attestations, any server replica), but they may meet.
const statusAttempts = 20

// Enrol implements store.Store; see the package documentation (Bindings)
// for the order of its writes.
func (s *Store) Enrol(ctx context.Context, r *store.Record, o store.EnrolOptions, once ...store.Once) error {
	if _, err := s.toObject(r); err != nil {
		return err
	}
	if r.Identity == "" {
		return fmt.Errorf("kubestore: record %s: an enrolment needs an identity", r.ID)
	}
	// Never longer than DefaultTimeout, whatever the caller's deadline:
	// OrphanAge rests on it.
	ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	if o.Again {
		b, err := s.getBinding(ctx, r.NodeName)
		switch {
		case errors.Is(err, store.ErrNotFound):
			// Released meanwhile: a first enrolment.
		case err != nil:
			return err
		default:
			return s.delivered(ctx, s.enrolAgain(ctx, b, r, o, once), o)
		}
	}
	return s.delivered(ctx, s.enrolFirst(ctx, r, once), o)
}

// delivered completes err, when it is a refusal an earlier answer may
// explain, with whether the marker o.Delivered names is set (a read, on
// that path only, when o names one).
func (s *Store) delivered(ctx context.Context, err error, o store.EnrolOptions) error {
	var c *store.EnrolConflict
	if o.Delivered == "" || !errors.As(err, &c) || !c.Answerable() {
		return err
	}
	used, uerr := s.IsUsed(ctx, o.Delivered)
	if uerr != nil {
		return fmt.Errorf("%w (and reading marker %s: %w)", err, o.Delivered, uerr)
	}
	c.Delivered = used
	return err
}

func (s *Store) enrolFirst(ctx context.Context, r *store.Record, once []store.Once) error {
	var undo []client.Object
	undoAll := func(err error) error {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		var errs []error
		for _, obj := range undo {
			uid := obj.GetUID()
			if derr := s.c.Delete(cctx, obj, client.Preconditions{UID: &uid}); derr != nil && !apierrors.IsNotFound(derr) {
				errs = append(errs, derr)
			}
		}
		if uerr := errors.Join(errs...); uerr != nil {
			return fmt.Errorf("%w (and undoing this enrolment: %w)", err, uerr)
		}
		return err
	}

	m, isNew, err := s.setIdentityMarker(ctx, r)
	if err != nil {
		return err
	}
	if isNew {
		undo = append(undo, m)
	}
	b := s.bindingObject(r)
	var seen *store.Binding // the binding found, for a refusal
	err = s.c.Create(ctx, b)
	switch {
	case err == nil:
		undo = append(undo, b)
	case apierrors.IsAlreadyExists(err):
		old, gerr := s.getBinding(ctx, r.NodeName)
		switch {
		case errors.Is(gerr, store.ErrNotFound):
			// Released between our create and our read: let the caller
			// try again.
			return undoAll(s.conflict(ctx, store.ConflictIdentityBound, nil, r, "binding of %s: changed while enrolling", r.NodeName))
		case gerr != nil:
			return undoAll(gerr)
		case old.Spec.Identity != r.Identity:
			return undoAll(s.conflict(ctx, store.ConflictNameBound, bindingOrNil(old), r, "node %s is bound to %s", r.NodeName, old.Spec.Identity))
		case old.Spec.RecordID != r.ID:
			return undoAll(s.conflict(ctx, store.ConflictIdentityBound, bindingOrNil(old), r, "%s is enrolled as %s", r.Identity, r.NodeName))
		}
		// The binding of this same enrolment, by a call that was cut off.
		seen = bindingOrNil(old)
	default:
		if !definite(err) {
			return fmt.Errorf("kubestore: create binding %s: %w", r.NodeName, err)
		}
		return undoAll(fmt.Errorf("kubestore: create binding %s: %w", r.NodeName, err))
	}
	if err := s.CreateRecord(ctx, r, once...); err != nil {
		if !errors.Is(err, store.ErrUsed) && !errors.Is(err, store.ErrExists) && !definite(err) {
			return err // the record may exist: keep the binding (the safe direction)
		}
		// Refused (a replayed session; the same enrolment, completed
		// before, when undo is empty): undo what this call created.
		return undoAll(s.recordConflict(ctx, err, seen, r))
	}
	return nil
}

// setIdentityMarker sets r.Identity's enrolment marker for r's record, or
// finds it set for r's record by an earlier, cut-off call (not isNew). A
// marker set otherwise is ErrRevoked when the identity is banned (Ban
// sets the marker, so this read costs nothing to identities never banned),
// else ErrIdentityEnrolled, unless it is an orphan (no binding of the
// identity, older than OrphanAge): then it is replaced.
func (s *Store) setIdentityMarker(ctx context.Context, r *store.Record) (*v1alpha1.AttestationMarker, bool, error) {
	key := IdentityMarkerKey(r.Identity)
	m, isNew, err := s.setMarker(ctx, key, store.Never, r.ID)
	if !errors.Is(err, store.ErrUsed) {
		return m, isNew, err
	}
	var old v1alpha1.AttestationMarker
	if gerr := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: v1alpha1.MarkerName(key)}, &old); gerr != nil {
		return nil, false, s.conflict(ctx, store.ConflictIdentityBound, nil, r, "%s", r.Identity)
	}
	if banned, berr := s.banned(ctx, r.Identity); berr != nil {
		return nil, false, berr
	} else if banned {
		return nil, false, s.conflict(ctx, store.ConflictBanned, nil, r, "%s is banned", r.Identity)
	}
	if held, berr := s.BindingOf(ctx, r.Identity); !errors.Is(berr, store.ErrNotFound) || s.clock().Sub(old.CreationTimestamp.Time) < OrphanAge {
		return nil, false, s.conflict(ctx, store.ConflictIdentityBound, held, r, "%s", r.Identity)
	}
	if err := s.deleteMarker(ctx, &old); err != nil && !apierrors.IsConflict(err) {
		return nil, false, fmt.Errorf("kubestore: replace orphaned marker of %s: %w", r.Identity, err)
	}
	m, isNew, err = s.setMarker(ctx, key, store.Never, r.ID)
	if errors.Is(err, store.ErrUsed) {
		err = s.conflict(ctx, store.ConflictIdentityBound, nil, r, "%s", r.Identity)
	}
	return m, isNew, err
}

// enrolAgain writes the record, then points the binding b at it (and at
// its key, with o.ReplaceKey), updating with the resourceVersion it read.
// With o.MaxLive it first reads the name's records (the cap).
func (s *Store) enrolAgain(ctx context.Context, b *v1alpha1.NodeBinding, r *store.Record, o store.EnrolOptions, once []store.Once) error {
	key := hex.EncodeToString(r.KubeletKeySHA256)
	check := func(b *v1alpha1.NodeBinding) error {
		switch {
		case b.Spec.Identity != r.Identity:
			return s.conflict(ctx, store.ConflictNameBound, bindingOrNil(b), r, "node %s is bound to %s", r.NodeName, b.Spec.Identity)
		case b.Spec.Revoked != nil:
			return s.conflict(ctx, store.ConflictRevoked, bindingOrNil(b), r, "node %s is revoked", r.NodeName)
		case !o.ReplaceKey && b.Spec.KubeletKeySHA256 != key:
			return s.conflict(ctx, store.ConflictIdentityBound, bindingOrNil(b), r, "%s enrolled %s with another kubelet key", r.Identity, r.NodeName)
		case b.Spec.Pool != r.Pool:
			return s.conflict(ctx, store.ConflictPoolFixed, bindingOrNil(b), r, "%s enrolled %s in pool %s, not %s", r.Identity, r.NodeName, b.Spec.Pool, r.Pool)
		}
		return nil
	}
	if err := check(b); err != nil {
		return err
	}
	if o.MaxLive > 0 {
		recs, err := s.RecordsForNode(ctx, r.NodeName)
		if err != nil {
			return err
		}
		if live := store.LiveOf(recs, r); len(live) >= o.MaxLive {
			c := store.NewConflict(store.ConflictLiveCap, bindingOrNil(b), nil, "kubestore: %s holds %d unexpired enrolments as %s", r.Identity, len(live), r.NodeName)
			c.Live = live
			return c
		}
	}
	if err := s.CreateRecord(ctx, r, once...); err != nil {
		return s.recordConflict(ctx, err, bindingOrNil(b), r)
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if b.Spec.RecordID == r.ID && b.Spec.KubeletKeySHA256 == key && b.Spec.EnrolledAt != nil {
			return nil
		}
		at := metav1.NewMicroTime(r.CreatedAt.UTC())
		b.Spec.RecordID, b.Spec.KubeletKeySHA256, b.Spec.EnrolledAt = r.ID, key, &at
		err := s.c.Update(ctx, b)
		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err):
		default:
			return fmt.Errorf("kubestore: update binding %s: %w", r.NodeName, err)
		}
		if b, err = s.getBinding(ctx, r.NodeName); err != nil {
			return err
		}
		if err := check(b); err != nil {
			return err
		}
	}
	return fmt.Errorf("kubestore: update binding %s: still contended after %d attempts", r.NodeName, maxAttempts)
}

// conflict is Enrol's refusal for reason (*store.EnrolConflict), with the
// binding b this call saw (or nil) and, for the refusals an earlier answer
// to the same session may explain (ConflictRecordExists,
// ConflictMarkerSpent, ConflictIdentityBound), the record stored under
// r.ID: one read, on that path only. A failed read is returned instead.
func (s *Store) conflict(ctx context.Context, reason store.Conflict, b *store.Binding, r *store.Record, detail string, args ...any) error {
	var prev *store.Record
	switch reason {
	case store.ConflictRecordExists, store.ConflictMarkerSpent, store.ConflictIdentityBound:
		p, err := s.GetRecord(ctx, r.ID)
		switch {
		case err == nil:
			prev = p
		case !errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("kubestore: %s (and reading record %s: %w)", fmt.Sprintf(detail, args...), r.ID, err)
		}
	}
	return store.NewConflict(reason, b, prev, "kubestore: "+detail, args...)
}

// recordConflict is CreateRecord's refusal err (ErrUsed, ErrExists) as
// Enrol's conflict, with the binding b; any other error as it is.
func (s *Store) recordConflict(ctx context.Context, err error, b *store.Binding, r *store.Record) error {
	switch {
	case errors.Is(err, store.ErrUsed):
		return s.conflict(ctx, store.ConflictMarkerSpent, b, r, "record %s", r.ID)
	case errors.Is(err, store.ErrExists):
		return s.conflict(ctx, store.ConflictRecordExists, b, r, "record %s", r.ID)
	}
	return err
}

// bindingOrNil is b as a store.Binding, nil when it does not decode (a
// conflict's binding is what the caller may say about it).
func bindingOrNil(b *v1alpha1.NodeBinding) *store.Binding {
	out, err := fromBinding(b)
	if err != nil {
		return nil
	}
	return out
}

func (s *Store) bindingObject(r *store.Record) *v1alpha1.NodeBinding {
	at := metav1.NewMicroTime(r.CreatedAt.UTC())
	return &v1alpha1.NodeBinding{
		ObjectMeta: metav1.ObjectMeta{Name: r.NodeName, Namespace: s.ns, Labels: map[string]string{v1alpha1.IdentityLabel: v1alpha1.LabelValue(r.Identity)}},
		Spec: v1alpha1.NodeBindingSpec{
			NodeName: r.NodeName, Pool: r.Pool, Kind: string(r.Kind), Identity: r.Identity,
			KubeletKeySHA256: hex.EncodeToString(r.KubeletKeySHA256), RecordID: r.ID,
			CreatedAt: at, EnrolledAt: &at,
		},
	}
}

func (s *Store) getBinding(ctx context.Context, nodeName string) (*v1alpha1.NodeBinding, error) {
	if !attest.ValidNodeName(nodeName) {
		return nil, fmt.Errorf("kubestore: binding %q: %w", nodeName, store.ErrNotFound)
	}
	var b v1alpha1.NodeBinding
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: nodeName}, &b); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kubestore: binding %s: %w", nodeName, store.ErrNotFound)
		}
		return nil, fmt.Errorf("kubestore: get binding %s: %w", nodeName, err)
	}
	return &b, nil
}

// Binding implements store.Store.
func (s *Store) Binding(ctx context.Context, nodeName string) (*store.Binding, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	b, err := s.getBinding(ctx, nodeName)
	if err != nil {
		return nil, err
	}
	return fromBinding(b)
}

// BindingOf implements store.Store: a list by the identity label, checked
// against spec.identity.
func (s *Store) BindingOf(ctx context.Context, identity string) (*store.Binding, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	var found *v1alpha1.NodeBinding
	err := s.eachPage(ctx, &v1alpha1.NodeBindingList{}, []client.ListOption{client.MatchingLabels{v1alpha1.IdentityLabel: v1alpha1.LabelValue(identity)}},
		func(l client.ObjectList) error {
			for i := range l.(*v1alpha1.NodeBindingList).Items {
				b := &l.(*v1alpha1.NodeBindingList).Items[i]
				if b.Spec.Identity == identity && found == nil {
					found = b.DeepCopy()
				}
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("kubestore: binding of %s: %w", identity, store.ErrNotFound)
	}
	return fromBinding(found)
}

func fromBinding(b *v1alpha1.NodeBinding) (*store.Binding, error) {
	key, err := hex.DecodeString(b.Spec.KubeletKeySHA256)
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("kubestore: binding %s: kubeletKeySHA256 is not 32 bytes of hex", b.Name)
	}
	out := &store.Binding{
		NodeName: b.Spec.NodeName, Pool: b.Spec.Pool, Kind: attest.Kind(b.Spec.Kind), Identity: b.Spec.Identity,
		KubeletKeySHA256: key, RecordID: b.Spec.RecordID, CreatedAt: b.Spec.CreatedAt.UTC(), EnrolledAt: b.Spec.CreatedAt.UTC(),
		Status: fromStatus(&b.Status), UID: string(b.UID),
	}
	if b.Spec.EnrolledAt != nil {
		out.EnrolledAt = b.Spec.EnrolledAt.UTC()
	}
	if r := b.Spec.Revoked; r != nil {
		out.Revoked = &store.Revocation{At: r.At.UTC(), By: r.By, Reason: r.Reason}
	}
	return out, nil
}

func fromStatus(st *v1alpha1.NodeBindingStatus) store.AttestationStatus {
	out := store.AttestationStatus{
		Passed: st.Passed != nil && *st.Passed, Reason: st.Reason, Message: st.Message, Audit: st.Audit, Boots: st.Boots,
		ResetCount: st.ResetCount, RestartCount: st.RestartCount, Summary: st.Summary,
	}
	if st.LastAttempt != nil {
		out.LastAttempt = st.LastAttempt.UTC()
	}
	if st.LastSuccess != nil {
		out.LastSuccess = st.LastSuccess.UTC()
	}
	if st.SessionIssuedAt != nil {
		out.SessionIssuedAt = st.SessionIssuedAt.UTC()
	}
	if st.Claims != nil && len(st.Claims.Raw) > 0 {
		out.Claims = claimsJSON(st.Claims.Raw)
	}
	if st.Rejudged != nil {
		out.Rejudged = st.Rejudged.UTC()
	}
	return out
}

// claimsJSON is the claims as JSON: an object as stored, or (written
// before claims were an object) a JSON string holding it.
func claimsJSON(raw []byte) []byte {
	if raw[0] != '"' {
		return slices.Clone(raw)
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return nil
	}
	return []byte(s)
}

func toStatus(st store.AttestationStatus) v1alpha1.NodeBindingStatus {
	out := v1alpha1.NodeBindingStatus{
		Reason: st.Reason, Message: st.Message, Audit: st.Audit, Boots: st.Boots,
		ResetCount: st.ResetCount, RestartCount: st.RestartCount, Summary: st.Summary,
	}
	if !st.LastAttempt.IsZero() {
		passed := st.Passed
		out.Passed = &passed
	}
	// Claims are kept as an object (kubectl describe shows them field by
	// field) when they are one and within MaxClaims.
	if c := bytes.TrimSpace(st.Claims); len(c) > 0 && len(c) <= v1alpha1.MaxClaims && c[0] == '{' && json.Valid(c) {
		out.Claims = &apiextensionsv1.JSON{Raw: slices.Clone(c)}
	}
	if !st.LastAttempt.IsZero() {
		t := metav1.NewMicroTime(st.LastAttempt.UTC())
		out.LastAttempt = &t
	}
	if !st.LastSuccess.IsZero() {
		t := metav1.NewMicroTime(st.LastSuccess.UTC())
		out.LastSuccess = &t
	}
	if !st.SessionIssuedAt.IsZero() {
		t := metav1.NewMicroTime(st.SessionIssuedAt.UTC())
		out.SessionIssuedAt = &t
	}
	if !st.Rejudged.IsZero() {
		t := metav1.NewMicroTime(st.Rejudged.UTC())
		out.Rejudged = &t
	}
	return out
}

// Bindings implements store.Store.
func (s *Store) Bindings(ctx context.Context) ([]*store.Binding, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	var out []*store.Binding
	err := s.eachPage(ctx, &v1alpha1.NodeBindingList{}, nil, func(l client.ObjectList) error {
		for i := range l.(*v1alpha1.NodeBindingList).Items {
			b, err := fromBinding(&l.(*v1alpha1.NodeBindingList).Items[i])
			if err != nil {
				return err
			}
			out = append(out, b)
		}
		return nil
	})
	return out, err
}

// UpdateStatus implements store.Store: a read, fn, and a status update
// carrying the resourceVersion read (one write; a conflict reads again,
// after a short random pause, up to statusAttempts times).
func (s *Store) UpdateStatus(ctx context.Context, nodeName, identity string, fn func(*store.Binding) error) (*store.Binding, error) {
	return s.updateBinding(ctx, nodeName, "update status of", statusAttempts, true, func(obj *v1alpha1.NodeBinding) (bool, error) {
		if obj.Spec.Identity != identity {
			return false, fmt.Errorf("kubestore: node %s is bound to %s: %w", nodeName, obj.Spec.Identity, store.ErrNameTaken)
		}
		b, err := fromBinding(obj)
		if err != nil {
			return false, err
		}
		if err := fn(b); err != nil {
			return false, err
		}
		obj.Status = toStatus(b.Status)
		return true, nil
	})
}

// updateBinding reads nodeName's binding, lets change modify it (false: no
// write, the binding as read is the answer) and writes it — its status
// subresource when status is set — with the resourceVersion read. A
// conflict reads again, after a short random pause, up to attempts times.
func (s *Store) updateBinding(ctx context.Context, nodeName, what string, attempts int, status bool, change func(*v1alpha1.NodeBinding) (bool, error)) (*store.Binding, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	for attempt := 0; attempt < attempts; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Duration(rand.Int64N(int64(10 * time.Millisecond)))):
			}
		}
		obj, err := s.getBinding(ctx, nodeName)
		if err != nil {
			return nil, err
		}
		write, err := change(obj)
		if err != nil {
			return nil, err
		}
		if !write {
			return fromBinding(obj)
		}
		if status {
			err = s.c.Status().Update(ctx, obj)
		} else {
			err = s.c.Update(ctx, obj)
		}
		switch {
		case err == nil:
			return fromBinding(obj)
		case apierrors.IsConflict(err):
			continue
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("kubestore: binding %s: %w", nodeName, store.ErrNotFound)
		default:
			return nil, fmt.Errorf("kubestore: %s %s: %w", what, nodeName, err)
		}
	}
	return nil, fmt.Errorf("kubestore: %s %s: still contended after %d attempts", what, nodeName, attempts)
}
