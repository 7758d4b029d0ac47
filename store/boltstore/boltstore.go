// Package boltstore is the embedded store backend: one bbolt file in the
// server's state directory. Every write is one bbolt transaction, fsync'd
// before it returns (bbolt's default), so a record or marker survives
// kill -9 and power loss once the call returned; a crash mid-write leaves
// the previous state.
package boltstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/nodeproof/nodeproof/store"
)

var (
	bucketRecords = []byte("records")    // id -> Record JSON
	bucketNodes   = []byte("nodes")      // nodeName \x00 id -> nil
	bucketOnce    = []byte("once")       // key -> expiry (RFC 3339)
	bucketBinds   = []byte("bindings")   // nodeName -> Binding JSON
	bucketIDs     = []byte("identities") // identity -> nodeName
	bucketBans    = []byte("bans")       // identity -> Ban JSON
	bucketHistory = []byte("history")    // nodeName -> NameHistory JSON
)

// buckets are the buckets Open makes; bucketLineages is made by its first
// write.
var buckets = [][]byte{bucketRecords, bucketNodes, bucketOnce, bucketBinds, bucketIDs, bucketBans, bucketHistory}

// makeBuckets returns tx's buckets named names, in order, making those
// missing: the one place a bucket is made.
func makeBuckets(tx *bolt.Tx, names ...[]byte) ([]*bolt.Bucket, error) {
	out := make([]*bolt.Bucket, len(names))
	for i, name := range names {
		b, err := tx.CreateBucketIfNotExists(name)
		if err != nil {
			return nil, fmt.Errorf("bucket %s: %w", name, err)
		}
		out[i] = b
	}
	return out, nil
}

// Store is a bbolt-backed store.Store.
type Store struct {
	db    *guardedDB // no panic of bbolt's escapes it (integrity.go)
	clock func() time.Time
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the store file at path. Only one process
// may hold it: a second Open waits up to timeout, then fails. clock decides
// whether a marker has expired. A file that is missing or empty where
// the store committed before, or damaged, is a *DamagedError (ErrDamaged):
// Open checks the whole file first (openChecked, checkTx).
func Open(path string, timeout time.Duration, clock func() time.Time) (*Store, error) {
	if clock == nil {
		return nil, fmt.Errorf("boltstore: a clock is required")
	}
	db, _, err := openChecked(path, timeout)
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := makeBuckets(tx, buckets...)
		return err
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init store: %w", err)
	}
	return &Store{db: db, clock: clock}, nil
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

func nodeKey(node, id string) []byte { return []byte(node + "\x00" + id) }

// onceSet reports whether key is set and unexpired at now.
func onceSet(b *bolt.Bucket, key string, now time.Time) bool {
	v := b.Get([]byte(key))
	if v == nil {
		return false
	}
	exp, err := time.Parse(time.RFC3339Nano, string(v))
	return err != nil || now.Before(exp)
}

// CreateRecord implements store.Store.
func (s *Store) CreateRecord(ctx context.Context, r *store.Record, once ...store.Once) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error { return s.createRecord(tx, r, data, once) })
}

// createRecord is CreateRecord inside tx.
func (s *Store) createRecord(tx *bolt.Tx, r *store.Record, data []byte, once []store.Once) error {
	ob := tx.Bucket(bucketOnce)
	now := s.clock()
	for _, o := range once {
		if onceSet(ob, o.Key, now) {
			return store.ErrUsed
		}
	}
	rb := tx.Bucket(bucketRecords)
	if rb.Get([]byte(r.ID)) != nil {
		return store.ErrExists
	}
	if err := rb.Put([]byte(r.ID), data); err != nil {
		return err
	}
	if err := tx.Bucket(bucketNodes).Put(nodeKey(r.NodeName, r.ID), nil); err != nil {
		return err
	}
	for _, o := range once {
		if err := ob.Put([]byte(o.Key), []byte(o.Expires.UTC().Format(time.RFC3339Nano))); err != nil {
			return err
		}
	}
	return nil
}

// Enrol implements store.Store: the binding, its identity index, the
// record and its markers in one transaction, which also reads what a
// refusal reports (*store.EnrolConflict).
func (s *Store) Enrol(ctx context.Context, r *store.Record, o store.EnrolOptions, once ...store.Once) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		bb, ib := tx.Bucket(bucketBinds), tx.Bucket(bucketIDs)
		conflict := func(reason store.Conflict, binding *store.Binding, detail string, args ...any) error {
			return s.conflict(tx, r, o, store.NewConflict(reason, binding, nil, detail, args...))
		}
		if tx.Bucket(bucketBans).Get([]byte(r.Identity)) != nil {
			return conflict(store.ConflictBanned, nil, "%s is banned", r.Identity)
		}
		b, err := getBinding(bb, r.NodeName)
		if err != nil {
			return err
		}
		// seen is the binding as this call found it, for a refusal.
		var seen *store.Binding
		if b != nil {
			c := *b
			seen = &c
		}
		switch {
		case b != nil && b.Identity != r.Identity:
			return conflict(store.ConflictNameBound, b, "node %s is bound to %s", r.NodeName, b.Identity)
		case b != nil && b.Revoked != nil:
			return conflict(store.ConflictRevoked, b, "the binding of %s is revoked", r.NodeName)
		case b != nil && b.RecordID == r.ID:
			// The same enrolment again: the record decides (ErrExists).
			return s.enrolRecord(tx, r, o, data, once, seen)
		case b == nil:
			if name := ib.Get([]byte(r.Identity)); name != nil {
				held, err := getBinding(bb, string(name))
				if err != nil {
					return err
				}
				return conflict(store.ConflictIdentityBound, held, "%s is enrolled as %s", r.Identity, name)
			}
			b = &store.Binding{NodeName: r.NodeName, Pool: r.Pool, Kind: r.Kind, Identity: r.Identity,
				KubeletKeySHA256: r.KubeletKeySHA256, CreatedAt: r.CreatedAt}
		case !o.Again:
			return conflict(store.ConflictIdentityBound, b, "%s is enrolled as %s", r.Identity, r.NodeName)
		case !o.ReplaceKey && !bytes.Equal(b.KubeletKeySHA256, r.KubeletKeySHA256):
			return conflict(store.ConflictIdentityBound, b, "%s is enrolled as %s with another kubelet key", r.Identity, r.NodeName)
		case b.Pool != r.Pool:
			return conflict(store.ConflictPoolFixed, b, "node %s is enrolled in pool %s", r.NodeName, b.Pool)
		default:
			if o.MaxLive > 0 {
				recs, err := recordsForNode(tx, r.NodeName)
				if err != nil {
					return err
				}
				if live := store.LiveOf(recs, r); len(live) >= o.MaxLive {
					c := store.NewConflict(store.ConflictLiveCap, seen, nil, "%s holds %d unexpired enrolments as %s", r.Identity, len(live), r.NodeName)
					c.Live = live
					return c
				}
			}
			b.KubeletKeySHA256 = r.KubeletKeySHA256
		}
		b.RecordID, b.EnrolledAt = r.ID, r.CreatedAt
		bd, err := json.Marshal(b)
		if err != nil {
			return err
		}
		if err := bb.Put([]byte(r.NodeName), bd); err != nil {
			return err
		}
		if err := ib.Put([]byte(r.Identity), []byte(r.NodeName)); err != nil {
			return err
		}
		return s.enrolRecord(tx, r, o, data, once, seen)
	})
}

// conflict completes c, Enrol's refusal of r, inside its transaction: the
// record already stored under r.ID, and for a refusal an earlier answer
// may explain, whether the marker o.Delivered names is set.
func (s *Store) conflict(tx *bolt.Tx, r *store.Record, o store.EnrolOptions, c *store.EnrolConflict) error {
	prev, err := getJSON[store.Record](tx.Bucket(bucketRecords), r.ID)
	if err != nil {
		return fmt.Errorf("record %s: %w", r.ID, err)
	}
	c.Record = prev
	if o.Delivered != "" && c.Answerable() {
		c.Delivered = onceSet(tx.Bucket(bucketOnce), o.Delivered, s.clock())
	}
	return c
}

// enrolRecord is createRecord for Enrol, whose refusals are conflicts
// reporting b (the binding as Enrol found it, nil when there was none).
func (s *Store) enrolRecord(tx *bolt.Tx, r *store.Record, o store.EnrolOptions, data []byte, once []store.Once, b *store.Binding) error {
	err := s.createRecord(tx, r, data, once)
	switch {
	case errors.Is(err, store.ErrUsed):
		return s.conflict(tx, r, o, store.NewConflict(store.ConflictMarkerSpent, b, nil, "record %s", r.ID))
	case errors.Is(err, store.ErrExists):
		return s.conflict(tx, r, o, store.NewConflict(store.ConflictRecordExists, b, nil, "record %s", r.ID))
	}
	return err
}

func getBinding(bb *bolt.Bucket, nodeName string) (*store.Binding, error) {
	v := bb.Get([]byte(nodeName))
	if v == nil {
		return nil, nil
	}
	b := new(store.Binding)
	if err := json.Unmarshal(v, b); err != nil {
		return nil, fmt.Errorf("binding of %s: %w", nodeName, err)
	}
	return b, nil
}

// Binding implements store.Store.
func (s *Store) Binding(ctx context.Context, nodeName string) (*store.Binding, error) {
	var b *store.Binding
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		b, err = getBinding(tx.Bucket(bucketBinds), nodeName)
		return err
	})
	if err == nil && b == nil {
		err = store.ErrNotFound
	}
	return b, err
}

// BindingOf implements store.Store.
func (s *Store) BindingOf(ctx context.Context, identity string) (*store.Binding, error) {
	var b *store.Binding
	err := s.db.View(func(tx *bolt.Tx) error {
		name := tx.Bucket(bucketIDs).Get([]byte(identity))
		if name == nil {
			return nil
		}
		var err error
		b, err = getBinding(tx.Bucket(bucketBinds), string(name))
		return err
	})
	if err == nil && (b == nil || b.Identity != identity) {
		return nil, store.ErrNotFound
	}
	return b, err
}

// Bindings implements store.Store.
func (s *Store) Bindings(ctx context.Context) ([]*store.Binding, error) {
	var out []*store.Binding
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketBinds).ForEach(func(k, v []byte) error {
			b := new(store.Binding)
			if err := json.Unmarshal(v, b); err != nil {
				return fmt.Errorf("binding of %s: %w", k, err)
			}
			out = append(out, b)
			return nil
		})
	})
	return out, err
}

// UpdateStatus implements store.Store: one transaction.
func (s *Store) UpdateStatus(ctx context.Context, nodeName, identity string, fn func(*store.Binding) error) (*store.Binding, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *store.Binding
	err := s.db.Update(func(tx *bolt.Tx) error {
		bb := tx.Bucket(bucketBinds)
		b, err := getBinding(bb, nodeName)
		switch {
		case err != nil:
			return err
		case b == nil:
			return store.ErrNotFound
		case b.Identity != identity:
			return store.ErrNameTaken
		}
		work := *b
		if err := fn(&work); err != nil {
			return err
		}
		b.Status = work.Status // only the status changes
		data, err := json.Marshal(b)
		if err != nil {
			return err
		}
		out = b
		return bb.Put([]byte(nodeName), data)
	})
	return out, err
}

// Revoke implements store.Store.
func (s *Store) Revoke(ctx context.Context, nodeName, reason string, at time.Time) (*store.Binding, error) {
	if _, err := s.Ban(ctx, store.Ban{NodeName: nodeName, Reason: reason, At: at}); err != nil {
		return nil, err
	}
	return s.Binding(ctx, nodeName)
}

// Ban implements store.Store: the ban and its binding's revocation in one
// transaction.
func (s *Store) Ban(ctx context.Context, ban store.Ban) (*store.Ban, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *store.Ban
	err := s.db.Update(func(tx *bolt.Tx) error {
		bb, ib, nb := tx.Bucket(bucketBinds), tx.Bucket(bucketIDs), tx.Bucket(bucketBans)
		var b *store.Binding
		var err error
		if ban.Identity == "" {
			if b, err = getBinding(bb, ban.NodeName); err != nil {
				return err
			} else if b == nil {
				return store.ErrNotFound
			}
			ban.Identity = b.Identity
		} else if name := ib.Get([]byte(ban.Identity)); name != nil {
			if b, err = getBinding(bb, string(name)); err != nil {
				return err
			}
		}
		if b != nil {
			ban.NodeName, ban.Kind = b.NodeName, b.Kind
		}
		if old, err := getJSON[store.Ban](nb, ban.Identity); err != nil {
			return err
		} else if old != nil {
			ban = *old // the first ban stands
		} else if err := putJSON(nb, ban.Identity, &ban); err != nil {
			return err
		}
		out = &ban
		if b == nil || b.Revoked != nil {
			return nil
		}
		b.Revoked = ban.Revocation()
		return putJSON(bb, b.NodeName, b)
	})
	return out, err
}

// Unban implements store.Store.
func (s *Store) Unban(ctx context.Context, identity string) (*store.Ban, error) {
	var out *store.Ban
	err := s.db.Update(func(tx *bolt.Tx) error {
		nb := tx.Bucket(bucketBans)
		var err error
		if out, err = getJSON[store.Ban](nb, identity); err != nil {
			return err
		} else if out == nil {
			return store.ErrNotFound
		}
		if err := nb.Delete([]byte(identity)); err != nil {
			return err
		}
		name := tx.Bucket(bucketIDs).Get([]byte(identity))
		if name == nil {
			return nil
		}
		bb := tx.Bucket(bucketBinds)
		b, err := getBinding(bb, string(name))
		if err != nil || b == nil || b.Revoked == nil {
			return err
		}
		b.Revoked = nil
		return putJSON(bb, b.NodeName, b)
	})
	return out, err
}

// BanOf implements store.Store.
func (s *Store) BanOf(ctx context.Context, identity string) (*store.Ban, error) {
	return viewJSON[store.Ban](s.db, bucketBans, identity)
}

// Bans implements store.Store.
func (s *Store) Bans(ctx context.Context) ([]*store.Ban, error) {
	return listJSON[store.Ban](s.db, bucketBans)
}

// Adopt implements store.Store.
func (s *Store) Adopt(ctx context.Context, nodeName string, how store.Act) (*store.NameHistory, error) {
	if how.At.IsZero() {
		how.At = s.clock()
	}
	var out *store.NameHistory
	err := s.db.Update(func(tx *bolt.Tx) error {
		hb := tx.Bucket(bucketHistory)
		h, err := getJSON[store.NameHistory](hb, nodeName)
		if err != nil {
			return err
		}
		if h == nil {
			h = &store.NameHistory{NodeName: nodeName}
		}
		out = h
		if h.Adopted != nil {
			return nil
		}
		h.Adopted = &how
		return putJSON(hb, nodeName, h)
	})
	return out, err
}

// History implements store.Store.
func (s *Store) History(ctx context.Context, nodeName string) (*store.NameHistory, error) {
	return viewJSON[store.NameHistory](s.db, bucketHistory, nodeName)
}

// Histories implements store.Store.
func (s *Store) Histories(ctx context.Context) ([]*store.NameHistory, error) {
	return listJSON[store.NameHistory](s.db, bucketHistory)
}

// Release implements store.Store: the binding's deletion, its identity
// index, the name's history and (for a revoked binding) the identity's
// ban in one transaction.
func (s *Store) Release(ctx context.Context, nodeName string, how ...store.Act) (*store.Binding, error) {
	var act store.Act
	if len(how) > 0 {
		act = how[0]
	}
	if act.At.IsZero() {
		act.At = s.clock()
	}
	var b *store.Binding
	err := s.db.Update(func(tx *bolt.Tx) error {
		bb := tx.Bucket(bucketBinds)
		var err error
		if b, err = getBinding(bb, nodeName); err != nil || b == nil {
			return err
		}
		if err := bb.Delete([]byte(nodeName)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketIDs).Delete([]byte(b.Identity)); err != nil {
			return err
		}
		if b.Revoked != nil {
			nb := tx.Bucket(bucketBans)
			if nb.Get([]byte(b.Identity)) == nil {
				ban := store.Ban{Identity: b.Identity, Kind: b.Kind, NodeName: b.NodeName, At: b.Revoked.At, By: b.Revoked.By, Reason: b.Revoked.Reason}
				if err := putJSON(nb, b.Identity, &ban); err != nil {
					return err
				}
			}
		}
		hb := tx.Bucket(bucketHistory)
		h, err := getJSON[store.NameHistory](hb, nodeName)
		if err != nil {
			return err
		}
		if h == nil {
			h = &store.NameHistory{NodeName: nodeName}
		}
		h.AddReleased(store.Released{Identity: b.Identity, Kind: b.Kind, Pool: b.Pool, CreatedAt: b.CreatedAt, Revoked: b.Revoked != nil, Act: act})
		return putJSON(hb, nodeName, h)
	})
	if err == nil && b == nil {
		err = store.ErrNotFound
	}
	return b, err
}

// getJSON reads key's value in b as a T (nil when absent).
func getJSON[T any](b *bolt.Bucket, key string) (*T, error) {
	v := b.Get([]byte(key))
	if v == nil {
		return nil, nil
	}
	out := new(T)
	if err := json.Unmarshal(v, out); err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return out, nil
}

// viewJSON reads key's value in bucket as a T (store.ErrNotFound when
// absent).
func viewJSON[T any](db *guardedDB, bucket []byte, key string) (*T, error) {
	var out *T
	err := db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = getJSON[T](tx.Bucket(bucket), key)
		return err
	})
	if err == nil && out == nil {
		err = store.ErrNotFound
	}
	return out, err
}

func putJSON(b *bolt.Bucket, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), data)
}

// listJSON reads every value of bucket as a T.
func listJSON[T any](db *guardedDB, bucket []byte) ([]*T, error) {
	var out []*T
	err := db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			x := new(T)
			if err := json.Unmarshal(v, x); err != nil {
				return fmt.Errorf("%s %s: %w", bucket, k, err)
			}
			out = append(out, x)
			return nil
		})
	})
	return out, err
}

// GetRecord implements store.Store.
func (s *Store) GetRecord(ctx context.Context, id string) (*store.Record, error) {
	var r *store.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRecords).Get([]byte(id))
		if v == nil {
			return store.ErrNotFound
		}
		r = new(store.Record)
		return json.Unmarshal(v, r)
	})
	return r, err
}

// RecordsForNode implements store.Store.
func (s *Store) RecordsForNode(ctx context.Context, nodeName string) ([]*store.Record, error) {
	var out []*store.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = recordsForNode(tx, nodeName)
		return err
	})
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, err
}

// recordsForNode is RecordsForNode inside tx, unsorted.
func recordsForNode(tx *bolt.Tx, nodeName string) ([]*store.Record, error) {
	var out []*store.Record
	rb := tx.Bucket(bucketRecords)
	c := tx.Bucket(bucketNodes).Cursor()
	prefix := []byte(nodeName + "\x00")
	for k, _ := c.Seek(prefix); k != nil && len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix); k, _ = c.Next() {
		v := rb.Get(k[len(prefix):])
		if v == nil {
			continue
		}
		r := new(store.Record)
		if err := json.Unmarshal(v, r); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// ConsumeRecord implements store.Store.
func (s *Store) ConsumeRecord(ctx context.Context, id, by string, at time.Time) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		rb := tx.Bucket(bucketRecords)
		v := rb.Get([]byte(id))
		if v == nil {
			return store.ErrNotFound
		}
		var r store.Record
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		if r.ConsumedAt != nil {
			return store.ErrConsumed
		}
		if r.Identity != "" && tx.Bucket(bucketBans).Get([]byte(r.Identity)) != nil {
			return store.ErrRevoked
		}
		r.ConsumedAt, r.ConsumedBy = &at, by
		data, err := json.Marshal(&r)
		if err != nil {
			return err
		}
		return rb.Put([]byte(id), data)
	})
}

// UseOnce implements store.Store.
func (s *Store) UseOnce(ctx context.Context, key string, expires time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		ob := tx.Bucket(bucketOnce)
		if onceSet(ob, key, s.clock()) {
			return store.ErrUsed
		}
		return ob.Put([]byte(key), []byte(expires.UTC().Format(time.RFC3339Nano)))
	})
}

// ReleaseOnce implements store.Store.
func (s *Store) ReleaseOnce(ctx context.Context, key string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketOnce).Delete([]byte(key)) })
}

// IsUsed implements store.Store.
func (s *Store) IsUsed(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var used bool
	err := s.db.View(func(tx *bolt.Tx) error {
		used = onceSet(tx.Bucket(bucketOnce), key, s.clock())
		return nil
	})
	return used, err
}

// GC implements store.Store.
func (s *Store) GC(ctx context.Context, now time.Time) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		ob := tx.Bucket(bucketOnce)
		var dead [][]byte
		if err := ob.ForEach(func(k, v []byte) error {
			if exp, err := time.Parse(time.RFC3339Nano, string(v)); err == nil && !now.Before(exp) {
				dead = append(dead, append([]byte(nil), k...))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, k := range dead {
			if err := ob.Delete(k); err != nil {
				return err
			}
		}
		n += len(dead)
		rb, nb := tx.Bucket(bucketRecords), tx.Bucket(bucketNodes)
		var deadRecs []store.Record
		if err := rb.ForEach(func(k, v []byte) error {
			var r store.Record
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			if !now.Before(r.Expires) {
				deadRecs = append(deadRecs, r)
			}
			return nil
		}); err != nil {
			return err
		}
		for _, r := range deadRecs {
			if err := rb.Delete([]byte(r.ID)); err != nil {
				return err
			}
			if err := nb.Delete(nodeKey(r.NodeName, r.ID)); err != nil {
				return err
			}
		}
		n += len(deadRecs)
		return nil
	})
	return n, err
}
