package boltstore

import (
	"context"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/nodeproof/nodeproof/store"
)

// bucketLineages: nodeName -> Lineage JSON. Made by the first write.
var bucketLineages = []byte("lineages")

var (
	_ store.Lineages   = (*Store)(nil)
	_ store.TokenIndex = (*Store)(nil)
)

// Lineage implements store.Lineages.
func (s *Store) Lineage(ctx context.Context, nodeName string) (*store.Lineage, error) {
	var l *store.Lineage
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		l, err = getLineage(tx, nodeName)
		return err
	})
	if err == nil && l == nil {
		err = store.ErrNotFound
	}
	return l, err
}

func getLineage(tx *bolt.Tx, nodeName string) (*store.Lineage, error) {
	b := tx.Bucket(bucketLineages)
	if b == nil {
		return nil, nil
	}
	v := b.Get([]byte(nodeName))
	if v == nil {
		return nil, nil
	}
	l := new(store.Lineage)
	if err := json.Unmarshal(v, l); err != nil {
		return nil, fmt.Errorf("lineage of %s: %w", nodeName, err)
	}
	return l, nil
}

// UpdateLineage implements store.Lineages: one transaction.
func (s *Store) UpdateLineage(ctx context.Context, nodeName string, fn func(*store.Lineage) (*store.Lineage, error)) (*store.Lineage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *store.Lineage
	err := s.db.Update(func(tx *bolt.Tx) error {
		cur, err := getLineage(tx, nodeName)
		if err != nil {
			return err
		}
		next, err := fn(cur)
		if err != nil || next == nil {
			out = cur
			return err
		}
		if next.NodeName != nodeName {
			return fmt.Errorf("boltstore: lineage of %q for node %q", next.NodeName, nodeName)
		}
		data, err := json.Marshal(next)
		if err != nil {
			return err
		}
		b, err := makeBuckets(tx, bucketLineages)
		if err != nil {
			return err
		}
		out = next
		return b[0].Put([]byte(nodeName), data)
	})
	return out, err
}

// RecordsForToken implements store.TokenIndex by reading every record: the
// embedded store holds one host's machines.
func (s *Store) RecordsForToken(ctx context.Context, id string) ([]*store.Record, bool, error) {
	var out []*store.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecords).ForEach(func(k, v []byte) error {
			r := new(store.Record)
			if err := json.Unmarshal(v, r); err != nil {
				return fmt.Errorf("record %s: %w", k, err)
			}
			if id != "" && r.BootstrapTokenID == id {
				out = append(out, r)
			}
			return nil
		})
	})
	return out, err == nil, err
}
