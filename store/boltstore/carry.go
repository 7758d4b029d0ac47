package boltstore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/nodeproof/nodeproof/store"
)

// Carried is what Restore carried from the store it replaced into the
// restored one: what operators did and what was spent after the backup,
// which a restore must never undo. A ban is lifted only by Unban, a
// single-use secret is never re-armed, and a released name never goes
// back to the identity it was released from.
type Carried struct {
	// Bans made after the backup: in force in the restored store (and
	// the banned identity's binding there revoked).
	Bans []store.Ban `json:"bans,omitempty"`
	// Releases made after the backup: the binding the backup holds for
	// the name, if it is the released identity's, released again.
	Releases []CarriedRelease `json:"releases,omitempty"`
	// Adoptions of names made after the backup.
	Adoptions []string `json:"adoptions,omitempty"`
	// Consumed are the records whose CSR was approved after the backup:
	// consumed in the restored store too.
	Consumed []string `json:"consumed,omitempty"`
	// Markers counts the single-use markers (config tokens spent) set
	// after the backup and not yet expired: set in the restored store.
	Markers int `json:"markers,omitempty"`
	// Rebanned are bans the backup holds that were lifted after it: in
	// force again (never lifted by a restore; `nodeproof unban` again).
	Rebanned []store.Ban `json:"rebanned,omitempty"`
	// Lost are the names bound in the replaced store and not in the
	// restored one (enrolled after the backup): those machines enrol
	// again.
	Lost []string `json:"lost,omitempty"`
}

// CarriedRelease is a release made after the backup.
type CarriedRelease struct {
	NodeName string         `json:"nodeName"`
	Released store.Released `json:"released"`
	// Unbound says the restored store's binding of the name (the released
	// identity's, from the backup) was released again.
	Unbound bool `json:"unbound"`
}

// Empty says nothing was carried, re-banned or lost.
func (c Carried) Empty() bool {
	return len(c.Bans) == 0 && len(c.Releases) == 0 && len(c.Adoptions) == 0 && len(c.Consumed) == 0 &&
		c.Markers == 0 && len(c.Rebanned) == 0 && len(c.Lost) == 0
}

// snapshot copies the store file at path, which the caller holds locked
// (no writer can run), to a temporary file beside it (in the state
// directory, its owner's alone: the copy holds what the store holds) and
// opens it read-only: the state the restore replaces.
func snapshot(path string) (db *bolt.DB, done func(), err error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer src.Close()
	dst, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".snapshot-*")
	if err != nil {
		return nil, nil, err
	}
	remove := func() { os.Remove(dst.Name()) }
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		remove()
		return nil, nil, err
	}
	if err := dst.Close(); err != nil {
		remove()
		return nil, nil, err
	}
	db, err = bolt.Open(dst.Name(), 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		remove()
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return db, func() { db.Close(); remove() }, nil
}

// carryOver writes into dst (the restored store, in a writable
// transaction) what cur (the replaced store's) holds that the backup does
// not and a restore must not undo (Carried), at now.
func carryOver(cur, dst *bolt.Tx, now time.Time) (Carried, error) {
	var c Carried
	// A store made by an older version may lack a bucket: the replaced
	// one's reads as empty, the restored one's is made.
	each := func(b *bolt.Bucket, fn func(k, v []byte) error) error {
		if b == nil {
			return nil
		}
		return b.ForEach(fn)
	}
	d, err := makeBuckets(dst, bucketBans, bucketBinds, bucketIDs, bucketOnce, bucketRecords, bucketHistory)
	if err != nil {
		return c, err
	}
	dbans, dbinds, dids, donce, drecs, dhist := d[0], d[1], d[2], d[3], d[4], d[5]
	// Bans: never lifted by a restore.
	err = each(cur.Bucket(bucketBans), func(k, v []byte) error {
		if dbans.Get(k) != nil {
			return nil
		}
		var ban store.Ban
		if err := json.Unmarshal(v, &ban); err != nil {
			return fmt.Errorf("ban %s: %w", k, err)
		}
		if err := dbans.Put(k, v); err != nil {
			return err
		}
		if name := dids.Get(k); name != nil {
			b, err := getBinding(dbinds, string(name))
			if err != nil {
				return err
			}
			if b != nil && b.Revoked == nil {
				b.Revoked = ban.Revocation()
				if err := putJSON(dbinds, b.NodeName, b); err != nil {
					return err
				}
			}
		}
		c.Bans = append(c.Bans, ban)
		return nil
	})
	if err != nil {
		return c, err
	}
	cbans := cur.Bucket(bucketBans)
	err = each(dbans, func(k, v []byte) error {
		if cbans != nil && cbans.Get(k) != nil {
			return nil
		}
		var ban store.Ban
		if err := json.Unmarshal(v, &ban); err != nil {
			return fmt.Errorf("ban %s: %w", k, err)
		}
		c.Rebanned = append(c.Rebanned, ban)
		return nil
	})
	if err != nil {
		return c, err
	}
	// Single-use markers: never re-armed.
	err = each(cur.Bucket(bucketOnce), func(k, v []byte) error {
		if !onceSet(cur.Bucket(bucketOnce), string(k), now) || onceSet(donce, string(k), now) {
			return nil
		}
		c.Markers++
		return donce.Put(k, v)
	})
	if err != nil {
		return c, err
	}
	// Records consumed since: never approved again.
	err = each(cur.Bucket(bucketRecords), func(k, v []byte) error {
		var r store.Record
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("record %s: %w", k, err)
		}
		if r.ConsumedAt == nil {
			return nil
		}
		old, err := getJSON[store.Record](drecs, string(k))
		if err != nil || old == nil || old.ConsumedAt != nil {
			return err
		}
		old.ConsumedAt, old.ConsumedBy = r.ConsumedAt, r.ConsumedBy
		c.Consumed = append(c.Consumed, string(k))
		return putJSON(drecs, string(k), old)
	})
	if err != nil {
		return c, err
	}
	// Releases and adoptions since: a released name never goes back.
	err = each(cur.Bucket(bucketHistory), func(k, v []byte) error {
		var h store.NameHistory
		if err := json.Unmarshal(v, &h); err != nil {
			return fmt.Errorf("history of %s: %w", k, err)
		}
		old, err := getJSON[store.NameHistory](dhist, string(k))
		if err != nil {
			return err
		}
		if old == nil {
			old = &store.NameHistory{NodeName: h.NodeName}
		}
		changed := false
		// Oldest first, so the restored history keeps the order.
		for i := len(h.Released) - 1; i >= 0; i-- {
			r := h.Released[i]
			if hasRelease(old, r) {
				continue
			}
			cr := CarriedRelease{NodeName: string(k), Released: r}
			if b, err := getBinding(dbinds, string(k)); err != nil {
				return err
			} else if b != nil && b.Identity == r.Identity {
				if err := dbinds.Delete(k); err != nil {
					return err
				}
				if err := dids.Delete([]byte(b.Identity)); err != nil {
					return err
				}
				cr.Unbound = true
			}
			old.AddReleased(r)
			c.Releases = append(c.Releases, cr)
			changed = true
		}
		if h.Adopted != nil && old.Adopted == nil {
			old.Adopted = h.Adopted
			c.Adoptions = append(c.Adoptions, string(k))
			changed = true
		}
		if !changed {
			return nil
		}
		return putJSON(dhist, string(k), old)
	})
	if err != nil {
		return c, err
	}
	// What is lost: names enrolled since.
	err = each(cur.Bucket(bucketBinds), func(k, v []byte) error {
		var b store.Binding
		if err := json.Unmarshal(v, &b); err != nil {
			return fmt.Errorf("binding of %s: %w", k, err)
		}
		if d, err := getBinding(dbinds, string(k)); err != nil {
			return err
		} else if d == nil || d.Identity != b.Identity || !bytes.Equal(d.KubeletKeySHA256, b.KubeletKeySHA256) {
			c.Lost = append(c.Lost, string(k))
		}
		return nil
	})
	sort.Strings(c.Lost)
	return c, err
}

// hasRelease says whether h already holds release r.
func hasRelease(h *store.NameHistory, r store.Released) bool {
	for _, o := range h.Released {
		if o.Identity == r.Identity && o.Act.At.Equal(r.Act.At) {
			return true
		}
	}
	return false
}
