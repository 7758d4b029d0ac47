package kubestore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

var _ store.Lineages = (*Store)(nil)

// Lineage implements store.Lineages: a KubeletLineage named by the node
// name.
func (s *Store) Lineage(ctx context.Context, nodeName string) (*store.Lineage, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	obj, err := s.getLineage(ctx, s.c, nodeName)
	if err != nil {
		return nil, err
	}
	return fromLineage(obj)
}

func (s *Store) getLineage(ctx context.Context, r client.Reader, nodeName string) (*v1alpha1.KubeletLineage, error) {
	if !attest.ValidNodeName(nodeName) {
		return nil, fmt.Errorf("kubestore: lineage %q: %w", nodeName, store.ErrNotFound)
	}
	var obj v1alpha1.KubeletLineage
	if err := r.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: nodeName}, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kubestore: lineage %s: %w", nodeName, store.ErrNotFound)
		}
		return nil, fmt.Errorf("kubestore: get lineage %s: %w", nodeName, err)
	}
	return &obj, nil
}

// UpdateLineage implements store.Lineages: a read, fn, and a create or an
// update carrying the resourceVersion read; a conflict (or a create that
// lost to another) reads again, after a short random pause, up to
// statusAttempts times (a lineage has few writers: the approver's
// workers, a successor finishing a term).
func (s *Store) UpdateLineage(ctx context.Context, nodeName string, fn func(*store.Lineage) (*store.Lineage, error)) (*store.Lineage, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	for attempt := 0; attempt < statusAttempts; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Duration(rand.Int64N(int64(10 * time.Millisecond)))):
			}
		}
		out, retry, err := s.writeLineage(ctx, s.c, nodeName, fn)
		if !retry {
			return out, err
		}
	}
	return nil, fmt.Errorf("kubestore: update lineage %s: still contended after %d attempts", nodeName, statusAttempts)
}

// writeLineage reads nodeName's lineage from r, applies fn and writes the
// result with the resourceVersion read; retry reports a lost race.
func (s *Store) writeLineage(ctx context.Context, r client.Reader, nodeName string, fn func(*store.Lineage) (*store.Lineage, error)) (out *store.Lineage, retry bool, err error) {
	obj, err := s.getLineage(ctx, r, nodeName)
	var cur *store.Lineage
	switch {
	case err == nil:
		if cur, err = fromLineage(obj); err != nil {
			return nil, false, err
		}
	case errors.Is(err, store.ErrNotFound):
		obj = nil
	default:
		return nil, false, err
	}
	next, err := fn(cur)
	if err != nil || next == nil {
		return cur, false, err
	}
	if next.NodeName != nodeName {
		return nil, false, fmt.Errorf("kubestore: lineage of %q for node %q", next.NodeName, nodeName)
	}
	want := toLineage(next)
	if obj == nil {
		want.Name, want.Namespace = nodeName, s.ns
		err = s.c.Create(ctx, want)
	} else {
		obj.Spec = want.Spec
		want = obj // carries the resourceVersion read
		err = s.c.Update(ctx, want)
	}
	switch {
	case err == nil:
		return next, false, nil
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err), apierrors.IsNotFound(err):
		return nil, true, nil
	}
	return nil, false, fmt.Errorf("kubestore: write lineage %s: %w", nodeName, err)
}

func toLineage(l *store.Lineage) *v1alpha1.KubeletLineage {
	obj := &v1alpha1.KubeletLineage{Spec: v1alpha1.KubeletLineageSpec{
		NodeName: l.NodeName, Identity: l.Identity, BoundAt: metav1.NewMicroTime(l.BoundAt.UTC()),
		KubeletKeySHA256: hex.EncodeToString(l.KubeletKeySHA256),
	}}
	for _, c := range l.Certificates {
		obj.Spec.Certificates = append(obj.Spec.Certificates, v1alpha1.IssuedCertificate{
			SHA256: hex.EncodeToString(c.SHA256), CSR: c.CSR,
			NotAfter: metav1.NewMicroTime(c.NotAfter.UTC()), RecordedAt: metav1.NewMicroTime(c.RecordedAt.UTC()),
		})
	}
	return obj
}

func fromLineage(obj *v1alpha1.KubeletLineage) (*store.Lineage, error) {
	key, err := hex.DecodeString(obj.Spec.KubeletKeySHA256)
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("kubestore: lineage %s: kubeletKeySHA256 is not 32 bytes of hex", obj.Name)
	}
	out := &store.Lineage{NodeName: obj.Spec.NodeName, Identity: obj.Spec.Identity, BoundAt: obj.Spec.BoundAt.UTC(), KubeletKeySHA256: key}
	for _, c := range obj.Spec.Certificates {
		sum, err := hex.DecodeString(c.SHA256)
		if err != nil || len(sum) != 32 {
			return nil, fmt.Errorf("kubestore: lineage %s: a certificate's sha256 is not 32 bytes of hex", obj.Name)
		}
		out.Certificates = append(out.Certificates, store.IssuedCertificate{
			SHA256: sum, CSR: c.CSR, NotAfter: c.NotAfter.UTC(), RecordedAt: c.RecordedAt.UTC(),
		})
	}
	return out, nil
}
