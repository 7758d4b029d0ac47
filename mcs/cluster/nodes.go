package cluster

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/nodeproof/nodeproof/mcs"
)

// ErrNodesNotSynced: the Node watch has not listed yet.
var ErrNodesNotSynced = errors.New("cluster: the Node watch has not synced")

// Nodes is mcs.Nodes: which Nodes exist, from a watch of their metadata
// (PartialObjectMetadata: names, no status or spec), kept without labels,
// annotations or managedFields — a few dozen bytes a Node — so an
// enrolment asking for a requested name reads no API. It needs list and
// watch on nodes (deploy/cluster/rbac.yaml).
type Nodes struct {
	inf toolscache.SharedIndexInformer
}

var _ mcs.Nodes = (*Nodes)(nil)

// NewNodes returns the watch; Run it.
func NewNodes(cfg *rest.Config) (*Nodes, error) {
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("cluster: nodes: %w", err)
	}
	inf := metadatainformer.NewFilteredMetadataInformer(mc, schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", 0,
		toolscache.Indexers{}, nil).Informer()
	if err := inf.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			m.ObjectMeta = metav1.ObjectMeta{Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion}
		}
		return obj, nil
	}); err != nil {
		return nil, err
	}
	return &Nodes{inf: inf}, nil
}

// Run watches until ctx ends.
func (n *Nodes) Run(ctx context.Context) { n.inf.RunWithContext(ctx) }

// Synced reports whether the watch has listed.
func (n *Nodes) Synced() bool { return n.inf.HasSynced() }

// Exists implements mcs.Nodes.
func (n *Nodes) Exists(name string) (bool, error) {
	if !n.inf.HasSynced() {
		return false, ErrNodesNotSynced
	}
	_, ok, err := n.inf.GetStore().GetByKey(name)
	return ok, err
}
