package kubestore

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
)

// BindingCache is a read cache of the NodeBindings in one namespace, kept
// current by a watch: what the approver's node controller reads, so that
// judging every node costs no request. Reads may lag the API server by
// the watch's delay; writers use the Store.
type BindingCache struct {
	c  cache.Cache
	ns string
}

// NewBindingCache returns a cache of namespace's NodeBindings; Start it.
func NewBindingCache(cfg *rest.Config, namespace string) (*BindingCache, error) {
	c, _, err := newWatch(cfg, namespace, time.Now, &v1alpha1.NodeBinding{})
	if err != nil {
		return nil, err
	}
	return &BindingCache{c: c, ns: namespace}, nil
}

// Start runs the watch until ctx ends.
func (b *BindingCache) Start(ctx context.Context) error { return b.c.Start(ctx) }

// WaitForSync waits for the first list; false if ctx ended first.
func (b *BindingCache) WaitForSync(ctx context.Context) bool { return b.c.WaitForCacheSync(ctx) }

// Binding returns the cached binding of nodeName (store.ErrNotFound).
func (b *BindingCache) Binding(ctx context.Context, nodeName string) (*store.Binding, error) {
	var obj v1alpha1.NodeBinding
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: nodeName}, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("kubestore: binding %s: %w", nodeName, store.ErrNotFound)
		}
		return nil, err
	}
	return fromBinding(&obj)
}

// OnChange calls fn with the node name of every binding added, changed or
// deleted (and of every one at the first list).
func (b *BindingCache) OnChange(ctx context.Context, fn func(nodeName string)) error {
	inf, err := b.c.GetInformer(ctx, &v1alpha1.NodeBinding{})
	if err != nil {
		return err
	}
	name := func(obj any) {
		if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if o, ok := obj.(*v1alpha1.NodeBinding); ok {
			fn(o.Name)
		}
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: name, UpdateFunc: func(_, n any) { name(n) }, DeleteFunc: name,
	})
	return err
}
