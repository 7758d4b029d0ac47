// Package kubestore is the Kubernetes store backend: records are
// NodeAttestation objects and single-use markers AttestationMarker objects
// (store/kubestore/v1alpha1; CRDs in deploy/crds), in one namespace, so the
// MCS replicas and the CSR approver share them through the API server.
//
// # Durability
//
// The API server answers a create, update or delete only after etcd has
// committed it (a Raft quorum, each member's log fsync'd), so a record or a
// marker survives the loss of any process once the call returned, as the
// store.Store contract requires.
//
// # Atomicity of CreateRecord
//
// The API server has no multi-object transactions. CreateRecord therefore
// creates every marker first, each an object whose name is a hash of its key
// (v1alpha1.MarkerName), so the API server's uniqueness of names decides which
// of two racing writers sets it; then it creates the record. If a marker
// exists and has not expired, the call deletes the markers it already created
// and returns store.ErrUsed; if the record's name exists, it deletes its
// markers and returns store.ErrExists. Each marker names its record
// (spec.recordID).
//
// A crash (or a lost connection) between the markers and the record leaves
// markers with no record: they block until they expire, and GC deletes them.
// That is the safe direction: a session marker orphaned so cannot be
// replayed, and an instance marker blocks that instance's re-enrolment until
// it expires or an administrator deletes it. For the same reason, when the
// record's create fails without a definite answer from the API server (a
// timeout, a dropped connection: the record may exist), the markers are kept.
//
// An expired marker does not count as set: CreateRecord and UseOnce delete it
// (with a precondition on its UID, so a marker another writer has just set is
// never deleted) and create theirs.
//
// # Names
//
// A record's object name is its ID, which must be a DNS label (IDs are 24
// hex digits). RecordsForNode lists with the label selector
// nodeproof.io/node=<hash of the name> (v1alpha1.NodeLabel), so the API
// server filters, and checks spec.nodeName itself.
//
// # Bindings
//
// A node name's binding (store.Enrol) is a NodeBinding named by the node
// name: the API server's uniqueness of names decides which of two
// identities holds it. That an identity holds at most one name is an
// AttestationMarker with the key "enrolled/<identity>" (IdentityMarkerKey)
// that never expires. Enrol sets that marker first, then creates the
// binding, then the record with its markers (as CreateRecord), and undoes
// what it created when a later step is refused. A call cut off by a crash
// leaves the marker (and perhaps the binding) naming its record ID: the same
// enrolment retried completes them. An identity marker that names no
// binding and is older than OrphanAge was left by a call that can no longer
// complete (every call is bounded by DefaultTimeout): the next enrolment of
// the identity replaces it. Enrolling again updates the binding with the
// resourceVersion it read, after the record exists.
//
// # Bans and name histories
//
// An identity's ban (store.Ban) is an IdentityBan named BanName(identity);
// Ban also sets the identity's enrolment marker, so a first enrolment,
// which must create that marker, finds it in the way and reads the ban
// (ErrRevoked): identities never banned pay nothing for the check. Ban
// then revokes the identity's binding (spec.revoked), waiting out an
// enrolment in flight (see Ban). Release writes the released binding to
// the name's NodeNameHistory (named by the node name) before it deletes
// the binding, and keeps the identity's marker while the identity is
// banned; Unban deletes the ban, clears the revocation, and the marker
// when the identity holds no name. Watched and Cached also watch both
// kinds (a ban made by hand, without the marker, is refused from the
// watch; the node controller reads histories from it).
//
// # Bounds
//
// Every call runs under the caller's context, and under DefaultTimeout when
// that context has no deadline (Enrol: never longer); lists are paged
// (PageSize objects a page).
// The CRDs bound every field (a marker key is at most 1024 bytes, a summary
// 4096, at most 32 addresses), so no object can grow without limit.
//
// # Times
//
// Times are kept to the microsecond (metav1.MicroTime) and come back in UTC.
package kubestore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

const (
	// DefaultTimeout bounds a call whose context has no deadline.
	DefaultTimeout = 30 * time.Second
	// PageSize is the limit of one list request.
	PageSize = 500
	// OrphanAge is how old an identity marker without a binding must be
	// before an enrolment replaces it (see Bindings).
	OrphanAge = 2 * DefaultTimeout
	// cleanupTimeout bounds undoing a failed CreateRecord, which runs even
	// when the caller's context is done.
	cleanupTimeout = 10 * time.Second
	// maxAttempts bounds retries after a conflict (an expired marker replaced
	// concurrently; a record's status updated concurrently).
	maxAttempts = 5
)

// IdentityMarkerKey is the key of the marker that an identity is enrolled.
func IdentityMarkerKey(identity string) string { return "enrolled/" + identity }

// Store is a store.Store on the Kubernetes API.
type Store struct {
	c     client.Client
	ns    string
	clock func() time.Time
	// pageSize is PageSize (tests lower it).
	pageSize int64
}

var _ store.Store = (*Store)(nil)

// New returns a store keeping its objects in namespace. c must read from the
// API server itself, not from an informer cache (use client.New or NewClient,
// not a manager's cached client): the store's answers are only as fresh as
// its reads. c's scheme must know v1alpha1 (v1alpha1.AddToScheme). clock
// decides whether a marker has expired.
func New(c client.Client, namespace string, clock func() time.Time) (*Store, error) {
	if c == nil {
		return nil, errors.New("kubestore: a client is required")
	}
	if clock == nil {
		return nil, errors.New("kubestore: a clock is required")
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return nil, fmt.Errorf("kubestore: namespace %q: %v", namespace, errs)
	}
	for _, obj := range []runtime.Object{&v1alpha1.NodeAttestation{}, &v1alpha1.AttestationMarker{}, &v1alpha1.NodeBinding{},
		&v1alpha1.IdentityBan{}, &v1alpha1.NodeNameHistory{}, &v1alpha1.KubeletLineage{}} {
		if _, _, err := c.Scheme().ObjectKinds(obj); err != nil {
			return nil, fmt.Errorf("kubestore: the client's scheme lacks %s (v1alpha1.AddToScheme): %w", v1alpha1.GroupVersion, err)
		}
	}
	return &Store{c: c, ns: namespace, clock: clock, pageSize: PageSize}, nil
}

// NewClient returns a client that reads and writes the API server directly
// (no cache), with a scheme holding the nodeproof.io/v1alpha1 types: what New
// needs.
func NewClient(cfg *rest.Config) (client.Client, error) {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("kubestore: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("kubestore: client: %w", err)
	}
	return c, nil
}

// Close implements store.Store. The client belongs to the caller; there is
// nothing to release.
func (s *Store) Close() error { return nil }

// bound applies DefaultTimeout to a context without a deadline.
func bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultTimeout)
}

// validID reports whether id can be a record's object name.
func validID(id string) error {
	if errs := validation.IsDNS1123Label(id); len(errs) > 0 {
		return fmt.Errorf("kubestore: record ID %q is not a DNS label: %v", id, errs)
	}
	return nil
}

// CreateRecord implements store.Store; see the package documentation for
// how it approximates one atomic write.
func (s *Store) CreateRecord(ctx context.Context, r *store.Record, once ...store.Once) error {
	obj, err := s.toObject(r)
	if err != nil {
		return err
	}
	ctx, cancel := bound(ctx)
	defer cancel()

	// The same key twice in one call is one marker (the later expiry wins,
	// as a second write of the key would).
	var keys []store.Once
	seen := map[string]int{}
	for _, o := range once {
		if i, ok := seen[o.Key]; ok {
			keys[i].Expires = o.Expires
			continue
		}
		seen[o.Key] = len(keys)
		keys = append(keys, o)
	}

	var created []*v1alpha1.AttestationMarker
	undo := func() error {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		var errs []error
		for _, m := range created {
			if err := s.deleteMarker(cctx, m); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	for _, o := range keys {
		m, isNew, err := s.setMarker(ctx, o.Key, o.Expires, r.ID)
		if err != nil {
			if uerr := undo(); uerr != nil {
				return fmt.Errorf("%w (and undoing this call's markers: %w)", err, uerr)
			}
			return err
		}
		if isNew {
			// Only what this call created is its to undo: a marker an
			// earlier call set for this record stays with it.
			created = append(created, m)
		}
	}

	err = s.c.Create(ctx, obj)
	switch {
	case err == nil:
		return nil
	case apierrors.IsAlreadyExists(err):
		err = fmt.Errorf("kubestore: record %s: %w", r.ID, store.ErrExists)
	case !definite(err):
		// The record may have been written: keep the markers (the safe
		// direction; they expire).
		return fmt.Errorf("kubestore: create record %s: %w", r.ID, err)
	default:
		err = fmt.Errorf("kubestore: create record %s: %w", r.ID, err)
	}
	if uerr := undo(); uerr != nil {
		return fmt.Errorf("%w (and undoing this call's markers: %w)", err, uerr)
	}
	return err
}

// definite reports whether err is the API server's refusal of a request
// (which therefore did not happen), rather than a failure that leaves its
// outcome unknown.
func definite(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	code := st.Status().Code
	if code == 0 || code >= 500 || code == 429 {
		return false
	}
	return !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err)
}

// setMarker creates the marker for key, replacing an expired one (isNew);
// ErrUsed if an unexpired one exists for another record. An unexpired one
// for recordID, which an earlier call for the same record set, is returned
// as it is (not isNew).
func (s *Store) setMarker(ctx context.Context, key string, expires time.Time, recordID string) (m *v1alpha1.AttestationMarker, isNew bool, err error) {
	name := v1alpha1.MarkerName(key)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		m = &v1alpha1.AttestationMarker{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns},
			Spec: v1alpha1.AttestationMarkerSpec{
				Key:      key,
				Expires:  metav1.NewMicroTime(expires.UTC()),
				RecordID: recordID,
			},
		}
		err = s.c.Create(ctx, m)
		if err == nil {
			return m, true, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, false, fmt.Errorf("kubestore: set marker %q: %w", key, err)
		}
		var old v1alpha1.AttestationMarker
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: name}, &old); err != nil {
			if apierrors.IsNotFound(err) {
				continue // deleted meanwhile: try again
			}
			return nil, false, fmt.Errorf("kubestore: read marker %q: %w", key, err)
		}
		if s.clock().Before(old.Spec.Expires.Time) {
			if recordID != "" && old.Spec.RecordID == recordID {
				// Set for this same record by a call that did not finish
				// (a crash between the markers and the record): it is
				// this call's to complete.
				return &old, false, nil
			}
			return nil, false, fmt.Errorf("kubestore: marker %q: %w", key, store.ErrUsed)
		}
		// Expired: it counts as unset. Delete exactly that object (another
		// writer may have replaced it since) and try again.
		if err := s.deleteMarker(ctx, &old); err != nil && !apierrors.IsConflict(err) {
			return nil, false, fmt.Errorf("kubestore: delete expired marker %q: %w", key, err)
		}
	}
	return nil, false, fmt.Errorf("kubestore: marker %q: still contended after %d attempts", key, maxAttempts)
}

// deleteMarker deletes exactly m (its UID); already gone is success.
func (s *Store) deleteMarker(ctx context.Context, m *v1alpha1.AttestationMarker) error {
	err := s.c.Delete(ctx, m, client.Preconditions{UID: &m.UID})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// GetRecord implements store.Store.
func (s *Store) GetRecord(ctx context.Context, id string) (*store.Record, error) {
	if validID(id) != nil {
		return nil, fmt.Errorf("kubestore: record %q: %w", id, store.ErrNotFound)
	}
	ctx, cancel := bound(ctx)
	defer cancel()
	var obj v1alpha1.NodeAttestation
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: id}, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kubestore: record %s: %w", id, store.ErrNotFound)
		}
		return nil, fmt.Errorf("kubestore: get record %s: %w", id, err)
	}
	return fromObject(&obj)
}

// RecordsForNode implements store.Store.
func (s *Store) RecordsForNode(ctx context.Context, nodeName string) ([]*store.Record, error) {
	if !attest.ValidNodeName(nodeName) {
		return nil, nil // no record can name it (the CRD refuses such names)
	}
	ctx, cancel := bound(ctx)
	defer cancel()
	var out []*store.Record
	err := s.eachPage(ctx, &v1alpha1.NodeAttestationList{}, []client.ListOption{client.MatchingLabels{v1alpha1.NodeLabel: v1alpha1.LabelValue(nodeName)}},
		func(l client.ObjectList) error {
			for i := range l.(*v1alpha1.NodeAttestationList).Items {
				obj := &l.(*v1alpha1.NodeAttestationList).Items[i]
				if obj.Spec.NodeName != nodeName {
					continue // the API server filtered; never trust a selector blindly
				}
				r, err := fromObject(obj)
				if err != nil {
					return err
				}
				out = append(out, r)
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	sortNewestFirst(out)
	return out, nil
}

// eachPage lists list's kind in the store's namespace, PageSize objects at a
// time, calling fn with each page.
func (s *Store) eachPage(ctx context.Context, list client.ObjectList, opts []client.ListOption, fn func(client.ObjectList) error) error {
	cont := ""
	for {
		o := append([]client.ListOption{client.InNamespace(s.ns), client.Limit(s.pageSize), client.Continue(cont)}, opts...)
		if err := s.c.List(ctx, list, o...); err != nil {
			return fmt.Errorf("kubestore: list: %w", err)
		}
		if err := fn(list); err != nil {
			return err
		}
		if cont = list.GetContinue(); cont == "" {
			return nil
		}
	}
}

// ConsumeRecord implements store.Store: a read of the record and of its
// identity's ban, then a status update carrying the resourceVersion that
// was read, so of two concurrent consumers the API server lets exactly one
// through; the other re-reads and finds it consumed.
func (s *Store) ConsumeRecord(ctx context.Context, id, by string, at time.Time) error {
	if validID(id) != nil {
		return fmt.Errorf("kubestore: record %q: %w", id, store.ErrNotFound)
	}
	ctx, cancel := bound(ctx)
	defer cancel()
	for attempt := 0; attempt < maxAttempts; attempt++ {
		var obj v1alpha1.NodeAttestation
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: id}, &obj); err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("kubestore: record %s: %w", id, store.ErrNotFound)
			}
			return fmt.Errorf("kubestore: get record %s: %w", id, err)
		}
		if obj.Status.ConsumedAt != nil {
			return fmt.Errorf("kubestore: record %s (by %s): %w", id, obj.Status.ConsumedBy, store.ErrConsumed)
		}
		if obj.Spec.Identity != "" {
			if banned, err := s.banned(ctx, obj.Spec.Identity); err != nil {
				return err
			} else if banned {
				return fmt.Errorf("kubestore: record %s: %s is banned: %w", id, obj.Spec.Identity, store.ErrRevoked)
			}
		}
		t := metav1.NewMicroTime(at.UTC())
		obj.Status.ConsumedAt, obj.Status.ConsumedBy = &t, by
		err := s.c.Status().Update(ctx, &obj) // carries obj.ResourceVersion
		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err):
			continue // changed since read: look again
		case apierrors.IsNotFound(err):
			return fmt.Errorf("kubestore: record %s: %w", id, store.ErrNotFound)
		default:
			return fmt.Errorf("kubestore: consume record %s: %w", id, err)
		}
	}
	return fmt.Errorf("kubestore: consume record %s: still contended after %d attempts", id, maxAttempts)
}

// UseOnce implements store.Store.
func (s *Store) UseOnce(ctx context.Context, key string, expires time.Time) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	_, _, err := s.setMarker(ctx, key, expires, "")
	return err
}

// ReleaseOnce implements store.Store. Releasing a marker that is not set is
// not an error.
func (s *Store) ReleaseOnce(ctx context.Context, key string) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	m := &v1alpha1.AttestationMarker{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.MarkerName(key), Namespace: s.ns}}
	if err := s.c.Delete(ctx, m); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubestore: release marker %q: %w", key, err)
	}
	return nil
}

// IsUsed implements store.Store.
func (s *Store) IsUsed(ctx context.Context, key string) (bool, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	var m v1alpha1.AttestationMarker
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: v1alpha1.MarkerName(key)}, &m); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("kubestore: read marker %q: %w", key, err)
	}
	return m.Spec.Key == key && s.clock().Before(m.Spec.Expires.Time), nil
}

// GC implements store.Store: it deletes markers and records whose expiry is
// not after now, each with a precondition on the UID it listed (an object
// replaced meanwhile is left alone), and counts what it deleted.
func (s *Store) GC(ctx context.Context, now time.Time) (int, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	n := 0
	del := func(obj client.Object) error {
		uid := obj.GetUID()
		err := s.c.Delete(ctx, obj, client.Preconditions{UID: &uid})
		switch {
		case err == nil:
			n++
			return nil
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			return nil // gone or replaced meanwhile
		default:
			return fmt.Errorf("kubestore: gc: delete %s: %w", obj.GetName(), err)
		}
	}
	err := s.eachPage(ctx, &v1alpha1.AttestationMarkerList{}, nil, func(l client.ObjectList) error {
		for i := range l.(*v1alpha1.AttestationMarkerList).Items {
			m := &l.(*v1alpha1.AttestationMarkerList).Items[i]
			if !now.Before(m.Spec.Expires.Time) {
				if err := del(m); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return n, err
	}
	err = s.eachPage(ctx, &v1alpha1.NodeAttestationList{}, nil, func(l client.ObjectList) error {
		for i := range l.(*v1alpha1.NodeAttestationList).Items {
			r := &l.(*v1alpha1.NodeAttestationList).Items[i]
			if !now.Before(r.Spec.Expires.Time) {
				if err := del(r); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return n, err
}

// toObject converts a record to its object, refusing what the CRD would
// refuse in ways a caller could not tell from an API error.
func (s *Store) toObject(r *store.Record) (*v1alpha1.NodeAttestation, error) {
	if r == nil {
		return nil, errors.New("kubestore: nil record")
	}
	if err := validID(r.ID); err != nil {
		return nil, err
	}
	if len(r.KubeletKeySHA256) != 32 {
		return nil, fmt.Errorf("kubestore: record %s: kubeletKeySHA256 has %d bytes, want 32", r.ID, len(r.KubeletKeySHA256))
	}
	if r.CreatedAt.IsZero() || r.Expires.IsZero() {
		return nil, fmt.Errorf("kubestore: record %s: createdAt and expires are required", r.ID)
	}
	obj := &v1alpha1.NodeAttestation{
		ObjectMeta: metav1.ObjectMeta{Name: r.ID, Namespace: s.ns, Labels: map[string]string{v1alpha1.NodeLabel: v1alpha1.LabelValue(r.NodeName)}},
		Spec: v1alpha1.NodeAttestationSpec{
			NodeName:         r.NodeName,
			Pool:             r.Pool,
			Kind:             string(r.Kind),
			Identity:         r.Identity,
			KubeletKeySHA256: hex.EncodeToString(r.KubeletKeySHA256),
			Addresses:        append([]string(nil), r.Addresses...),
			BootstrapTokenID: r.BootstrapTokenID,
			Summary:          r.Summary,
			CreatedAt:        metav1.NewMicroTime(r.CreatedAt.UTC()),
			Expires:          metav1.NewMicroTime(r.Expires.UTC()),
		},
	}
	// Status is not written on create (the status subresource ignores it):
	// a record is created unconsumed.
	return obj, nil
}

// fromObject converts an object back to a record. Times come back in UTC, to
// the microsecond (metav1.MicroTime).
func fromObject(obj *v1alpha1.NodeAttestation) (*store.Record, error) {
	key, err := hex.DecodeString(obj.Spec.KubeletKeySHA256)
	if err != nil {
		return nil, fmt.Errorf("kubestore: record %s: kubeletKeySHA256: %w", obj.Name, err)
	}
	r := &store.Record{
		ID:               obj.Name,
		NodeName:         obj.Spec.NodeName,
		Pool:             obj.Spec.Pool,
		Kind:             attest.Kind(obj.Spec.Kind),
		Identity:         obj.Spec.Identity,
		KubeletKeySHA256: key,
		BootstrapTokenID: obj.Spec.BootstrapTokenID,
		Summary:          obj.Spec.Summary,
		CreatedAt:        obj.Spec.CreatedAt.UTC(),
		Expires:          obj.Spec.Expires.UTC(),
		ConsumedBy:       obj.Status.ConsumedBy,
	}
	if len(obj.Spec.Addresses) > 0 {
		r.Addresses = append([]string(nil), obj.Spec.Addresses...)
	}
	if obj.Status.ConsumedAt != nil {
		t := obj.Status.ConsumedAt.UTC()
		r.ConsumedAt = &t
	}
	return r, nil
}
