package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/nodeproof/nodeproof/fsutil"
)

// ErrDamaged is wrapped by every error about a damaged store file
// (*DamagedError): the server must not start on it, and an operator
// restores the last backup (docs/operations.md).
var ErrDamaged = errors.New("the store file is damaged")

// DamagedError says which store file is damaged and how.
type DamagedError struct {
	Path string
	// What is what was found, in words.
	What string
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("store file %s is damaged: %s", e.Path, e.What)
}

// Unwrap makes errors.Is(err, ErrDamaged) hold.
func (e *DamagedError) Unwrap() error { return ErrDamaged }

func damaged(path, format string, args ...any) *DamagedError {
	return &DamagedError{Path: path, What: fmt.Sprintf(format, args...)}
}

// MarkerSuffix names the commit marker kept beside a store file
// (state.db.commit): the transaction ID of the last commit the store made.
// It is how the store knows that state existed — a store file that is
// missing or empty where a marker is, or whose last commit is older than
// the marker's (a lost meta page rolls bbolt back to the commit before),
// is damage, not a fresh install.
const MarkerSuffix = ".commit"

// marker is the commit marker's content.
type marker struct {
	// Txid is the transaction ID of the last commit (bbolt's txid).
	Txid int
}

// markerFormat is the marker's one line, of fixed length so that each
// commit overwrites it in place with one small write.
const markerFormat = "nodeproof store commit txid %020d\n"

// readMarker returns the marker beside path: ok false when there is none,
// or when it does not parse (a marker is written without fsync, so a
// crash may leave it empty or torn: no evidence either way).
func readMarker(path string) (m marker, ok bool, err error) {
	b, err := os.ReadFile(path + MarkerSuffix)
	if errors.Is(err, os.ErrNotExist) {
		return m, false, nil
	} else if err != nil {
		return m, false, fmt.Errorf("read the store's commit marker: %w", err)
	}
	if len(b) != len(fmt.Sprintf(markerFormat, 0)) {
		return marker{}, false, nil
	}
	if n, err := fmt.Sscanf(string(b), markerFormat, &m.Txid); err != nil || n != 1 || m.Txid <= 0 {
		return marker{}, false, nil
	}
	return m, true, nil
}

// openMarker opens (creating) the marker beside path for writing in
// place.
func openMarker(path string) (*os.File, error) {
	f, err := os.OpenFile(path+MarkerSuffix, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the store's commit marker: %w", err)
	}
	return f, nil
}

// writeMarker writes txid into the marker file f, in place and without
// fsync: it runs after every commit and must cost little (a rename, or a
// sync, would cost as much as the commit). A marker that a crash leaves
// behind the store is harmless (it may only lag); one left torn is no
// evidence.
func writeMarker(f *os.File, txid int) error {
	_, err := f.WriteAt(fmt.Appendf(nil, markerFormat, txid), 0)
	return err
}

// syncMarker writes the marker beside path durably (Restore).
func syncMarker(path string, txid int) error {
	return fsutil.WriteFileAtomic(path+MarkerSuffix, fmt.Appendf(nil, markerFormat, txid), 0o600)
}

// guardedDB is the store's bbolt handle: no panic of bbolt's escapes a
// read or a write (a damaged page makes bbolt panic, or fault on its
// memory map), and every commit moves the commit marker forward.
type guardedDB struct {
	*bolt.DB
	path string
	// broken is set when a write panicked: bbolt may still hold its
	// writer lock (its rollback reads the damaged file too), so every
	// later call fails at once instead of waiting on it forever.
	broken atomic.Pointer[DamagedError]
	// file is bbolt's handle on path (its lock); marker the commit
	// marker's.
	file, marker *os.File

	mu       sync.Mutex
	lastMark int
}

// Close is bolt.DB.Close; once broken, bbolt's Close would wait forever
// on the writer lock, so only the file is closed (its lock released).
func (g *guardedDB) Close() error {
	if g.marker != nil {
		g.marker.Close()
	}
	if d := g.broken.Load(); d != nil {
		if g.file != nil {
			g.file.Close()
		}
		return d
	}
	return g.DB.Close()
}

// View is bolt.DB.View, turning a panic or memory fault into a
// *DamagedError.
func (g *guardedDB) View(fn func(*bolt.Tx) error) (err error) {
	if d := g.broken.Load(); d != nil {
		return d
	}
	defer guard(g.path, &err)()
	return g.DB.View(fn)
}

// Update is bolt.DB.Update, turning a panic or memory fault into a
// *DamagedError (after which the store refuses everything: see broken),
// and recording the commit in the marker.
func (g *guardedDB) Update(fn func(*bolt.Tx) error) (err error) {
	if d := g.broken.Load(); d != nil {
		return d
	}
	defer func() { g.fail(err) }()
	defer guard(g.path, &err)()
	txid := 0
	if err := g.DB.Update(func(tx *bolt.Tx) error { txid = tx.ID(); return fn(tx) }); err != nil {
		return err
	}
	g.mark(txid)
	return nil
}

// fail makes the store refuse everything from now on when err is damage
// found by a write or a check (either ran in a write transaction, whose
// rollback reads the damaged file too and may leave bbolt's writer lock
// held).
func (g *guardedDB) fail(err error) {
	var d *DamagedError
	if errors.As(err, &d) {
		g.broken.CompareAndSwap(nil, &DamagedError{Path: d.Path, What: d.What + "; the store refuses every request until the server is restarted on a good file"})
	}
}

// mark moves the marker to txid (never back).
func (g *guardedDB) mark(txid int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if txid <= g.lastMark || g.marker == nil {
		return
	}
	if writeMarker(g.marker, txid) == nil {
		g.lastMark = txid
	}
}

// guard makes faults on the memory map panics for the calling goroutine
// and turns any panic into a *DamagedError in *err. Use as
// defer guard(path, &err)().
func guard(path string, err *error) func() {
	old := debug.SetPanicOnFault(true)
	return func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			*err = damaged(path, "bbolt failed reading it: %v", r)
		}
	}
}

// openGuarded opens path with bbolt, turning a panic or memory fault in
// bbolt's open (a damaged freelist or meta page, pages past the end of a
// truncated file) into a *DamagedError; the file and its lock are
// released then. It returns bbolt's file handle too, for reading the meta
// pages under the lock.
func openGuarded(path string, opts bolt.Options) (db *bolt.DB, file *os.File, err error) {
	opts.OpenFile = func(name string, flag int, mode os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, mode)
		file = f
		return f, err
	}
	defer func() {
		if _, ok := err.(*DamagedError); ok && file != nil {
			file.Close()
		}
	}()
	defer guard(path, &err)()
	db, err = bolt.Open(path, 0o600, &opts)
	switch {
	case err == nil:
		return db, file, nil
	case errors.Is(err, berrors.ErrTimeout):
		if h := holder(path); h != "" {
			return nil, nil, fmt.Errorf("open store %s: another process holds it, %s: %w", path, h, err)
		}
		return nil, nil, fmt.Errorf("open store %s: another process holds it: %w", path, err)
	case errors.Is(err, os.ErrNotExist), errors.Is(err, os.ErrPermission):
		return nil, nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return nil, nil, damaged(path, "bbolt cannot open it: %v", err)
}

// MetaPage is what one of a bbolt file's two meta pages says. bbolt
// writes them in turn, the transaction ID's parity picking the page, and
// opens with the valid one of the higher transaction ID.
type MetaPage struct {
	Valid bool `json:"valid"`
	Txid  int  `json:"txid,omitempty"`
	// Needs is the file size the commit uses: its page high-water mark
	// times the page size.
	Needs int64 `json:"needs,omitempty"`
}

// bbolt's meta page layout (format version 2): a 16-byte page header,
// then magic, version, page size, flags (uint32 each), the root bucket
// (root page, sequence), the freelist page, the page high-water mark, the
// transaction ID and an FNV-1a 64 checksum of everything before it
// (uint64 each), little-endian.
const (
	pageHeaderSize = 16
	metaSize       = 64
	metaChecksumAt = 56
	metaMagic      = 0xED0CDAED
	metaVersion    = 2
)

// parseMeta reads the meta page at the start of p (at least a page
// header and a meta), returning its transaction ID and page size when it
// is valid.
func parseMeta(p []byte) (txid, pgid uint64, pageSize uint32, ok bool) {
	if len(p) < pageHeaderSize+metaSize {
		return 0, 0, 0, false
	}
	m := p[pageHeaderSize : pageHeaderSize+metaSize]
	le := binary.LittleEndian
	if le.Uint32(m[0:]) != metaMagic || le.Uint32(m[4:]) != metaVersion {
		return 0, 0, 0, false
	}
	h := fnv.New64a()
	h.Write(m[:metaChecksumAt])
	if h.Sum64() != le.Uint64(m[metaChecksumAt:]) {
		return 0, 0, 0, false
	}
	return le.Uint64(m[48:]), le.Uint64(m[40:]), le.Uint32(m[8:]), true
}

// ReadMetaPages reads both meta pages of the bbolt file r (size bytes).
// The second page is where the first one's page size puts it, or at
// 4 KiB when the first is invalid.
func ReadMetaPages(r io.ReaderAt, size int64) [2]MetaPage {
	var out [2]MetaPage
	buf := make([]byte, pageHeaderSize+metaSize)
	pageSize := uint32(4096)
	if n, _ := r.ReadAt(buf, 0); n == len(buf) {
		if txid, pgid, ps, ok := parseMeta(buf); ok && ps >= 512 && ps <= 1<<20 {
			out[0] = MetaPage{Valid: true, Txid: int(txid), Needs: needs(pgid, ps)}
			pageSize = ps
		}
	}
	if int64(pageSize)+int64(len(buf)) <= size {
		if n, _ := r.ReadAt(buf, int64(pageSize)); n == len(buf) {
			if txid, pgid, ps, ok := parseMeta(buf); ok && ps == pageSize {
				out[1] = MetaPage{Valid: true, Txid: int(txid), Needs: needs(pgid, ps)}
			}
		}
	}
	return out
}

// needs is pgid pages of size bytes, saturated (a meta page's fields are
// whatever the file says).
func needs(pgid uint64, size uint32) int64 {
	if pgid > uint64(1<<62)/uint64(size) {
		return 1 << 62
	}
	return int64(pgid) * int64(size)
}

// current is the meta page bbolt opens with: the valid one of the higher
// transaction ID (ok false when neither is valid).
func current(meta [2]MetaPage) (MetaPage, bool) {
	switch {
	case meta[0].Valid && (!meta[1].Valid || meta[0].Txid > meta[1].Txid):
		return meta[0], true
	case meta[1].Valid:
		return meta[1], true
	}
	return MetaPage{}, false
}

// preOpen checks what can be checked of the file at path before bbolt
// maps it: that it holds every page its last commit uses (bbolt reads
// past the end of a truncated file, and faults).
func preOpen(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	meta := ReadMetaPages(f, fi.Size())
	if m, ok := current(meta); ok && fi.Size() < m.Needs {
		return damaged(path, "it is %d bytes but its last commit (transaction %d) uses %d: it was truncated", fi.Size(), m.Txid, m.Needs)
	}
	return nil
}

// Report is what a check of a store file found.
type Report struct {
	Path string `json:"path"`
	// Size is the file's size; Txid its last commit.
	Size int64 `json:"size"`
	Txid int   `json:"txid"`
	// Marker is the commit marker's transaction ID (0: none).
	Marker int `json:"marker,omitempty"`
	// Meta are the two meta pages.
	Meta [2]MetaPage `json:"meta"`
	// Buckets counts the keys of each top-level bucket.
	Buckets map[string]int `json:"buckets"`
	// Warnings are findings that do not stop the store (an invalid
	// older meta page, which bbolt rewrites at the next commit).
	Warnings []string `json:"warnings,omitempty"`
}

// maxCheckErrors bounds the errors a check collects from bbolt.
const maxCheckErrors = 10

// checkTx runs every check of the store file at path in tx: when a
// commit marker is given (markerTxid > 0), the file's last commit is not
// older than it (a lost meta page rolls bbolt back one commit: the
// writes since are gone); both meta pages are valid, or the invalid one
// is the older (which only the marker can tell: without one, an invalid
// meta page is damage); the file holds every page its last commit uses
// (a truncated file does not); every bucket, key and value reads back (a
// damaged page makes bbolt panic, or fault on its memory map: caught
// here); and bbolt's own consistency check (tx.Check: every page
// reachable or free, once, keys in order), which needs both meta pages
// (with one invalid it is skipped, and said so). meta are the file's
// meta pages, read under its lock.
func checkTx(tx *bolt.Tx, path string, size int64, meta [2]MetaPage, markerTxid int) (rep Report, err error) {
	rep = Report{Path: path, Size: size, Marker: markerTxid, Meta: meta, Buckets: map[string]int{}, Txid: tx.ID()}
	if tx.Writable() {
		rep.Txid-- // a write transaction has the next commit's ID
	}
	defer guard(path, &err)()
	if markerTxid > rep.Txid {
		return rep, damaged(path, "its last commit is transaction %d but the store committed transaction %d (%s): a meta page was lost and bbolt rolled back, dropping what was written since",
			rep.Txid, markerTxid, filepath.Base(path)+MarkerSuffix)
	}
	bothMeta := true
	for i, m := range meta {
		if m.Valid {
			continue
		}
		bothMeta = false
		if markerTxid == 0 {
			return rep, damaged(path, "meta page %d is invalid and no commit marker says which commit was the last: bbolt may have rolled back to transaction %d, losing the commit after it", i, rep.Txid)
		}
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("meta page %d is invalid; the other holds transaction %d, not older than the last one the marker records (nothing is lost), and the server rewrites it when it starts", i, rep.Txid))
	}
	if need := tx.Size(); size < need {
		return rep, damaged(path, "it is %d bytes but its last commit (transaction %d) uses %d: it was truncated", size, rep.Txid, need)
	}
	if err := walk(tx, rep.Buckets); err != nil {
		return rep, damaged(path, "%v", err)
	}
	if !bothMeta {
		rep.Warnings = append(rep.Warnings, "bbolt's consistency check was skipped: it needs both meta pages")
		return rep, nil
	}
	var errs []error
	for e := range tx.Check() {
		if len(errs) < maxCheckErrors {
			errs = append(errs, e)
		}
	}
	if len(errs) > 0 {
		return rep, damaged(path, "bbolt's consistency check: %v", errors.Join(errs...))
	}
	return rep, nil
}

// walk reads every key and value of every bucket in tx, counting the keys
// of each top-level bucket into counts.
func walk(tx *bolt.Tx, counts map[string]int) error {
	var sum byte
	err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		n, err := walkBucket(b, &sum)
		counts[string(name)] = n
		if err != nil {
			return fmt.Errorf("bucket %q: %w", name, err)
		}
		return nil
	})
	return err
}

func walkBucket(b *bolt.Bucket, sum *byte) (int, error) {
	n := 0
	err := b.ForEach(func(k, v []byte) error {
		n++
		for _, c := range k {
			*sum ^= c
		}
		if v == nil {
			if sub := b.Bucket(k); sub != nil {
				_, err := walkBucket(sub, sum)
				return err
			}
			return nil
		}
		for _, c := range v { // read every byte: a fault shows here
			*sum ^= c
		}
		return nil
	})
	return n, err
}

// openChecked opens the store file at path for the store (waiting up
// to lock for another process's lock) and checks it (checkTx). A missing
// file is created — empty, through a rename, so that a crash cannot leave
// an empty file behind — unless the commit marker beside it says the
// store committed before: then, as for an empty file, it is damage.
func openChecked(path string, lock time.Duration) (*guardedDB, Report, error) {
	m, hasMarker, err := readMarker(path)
	if err != nil {
		return nil, Report{Path: path}, err
	}
	existed := ""
	if hasMarker {
		existed = fmt.Sprintf(", but the store committed transaction %d (%s)", m.Txid, filepath.Base(path)+MarkerSuffix)
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist) && hasMarker:
		return nil, Report{Path: path}, damaged(path, "it is missing%s", existed)
	case errors.Is(err, os.ErrNotExist):
		if err := create(path); err != nil {
			return nil, Report{Path: path}, err
		}
	case err != nil:
		return nil, Report{Path: path}, err
	case fi.Size() == 0:
		// A store file is never empty: bbolt writes its meta pages when
		// it creates one, and create renames it into place only then.
		return nil, Report{Path: path}, damaged(path, "it is empty%s", existed)
	}
	if err := preOpen(path); err != nil {
		return nil, Report{Path: path}, err
	}
	db, file, err := openGuarded(path, bolt.Options{Timeout: lock})
	if err != nil {
		return nil, Report{Path: path}, err
	}
	g := &guardedDB{DB: db, path: path, file: file}
	if g.marker, err = openMarker(path); err != nil {
		g.Close()
		return nil, Report{Path: path}, err
	}
	if !hasMarker {
		// The marker file is new: make its name durable once.
		if err := fsutil.SyncDir(filepath.Dir(path)); err != nil {
			g.Close()
			return nil, Report{Path: path}, err
		}
	}
	rep, err := repairMeta(g, file, m.Txid)
	if err == nil {
		var again Report
		again, err = checkOpen(db, file, path, m.Txid)
		again.Warnings = append(rep.Warnings, again.Warnings...)
		rep = again
	}
	if err != nil {
		g.fail(err)
		g.Close()
		return nil, rep, err
	}
	g.mark(rep.Txid) // a store from before markers, or a marker that lagged
	return g, rep, nil
}

// repairMeta rewrites an invalid meta page when the other holds the last
// commit the marker records (nothing is lost): bbolt writes the next
// commit's meta to the page the invalid one is, so one empty commit
// repairs it. Without a marker, or with the valid page older than the
// marker, nothing is written (checkTx refuses the file).
func repairMeta(g *guardedDB, file *os.File, markerTxid int) (Report, error) {
	rep := Report{Path: g.path}
	fi, err := file.Stat()
	if err != nil {
		return rep, err
	}
	meta := ReadMetaPages(file, fi.Size())
	if meta[0].Valid == meta[1].Valid || markerTxid == 0 {
		return rep, nil
	}
	for i, m := range meta {
		if m.Valid && m.Txid >= markerTxid {
			if err := g.Update(func(*bolt.Tx) error { return nil }); err != nil {
				return rep, err
			}
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("meta page %d was invalid; the other held transaction %d, the last one committed, and the invalid page was rewritten", 1-i, m.Txid))
		}
	}
	return rep, nil
}

// checkOpen reads the meta pages of the open db through file and checks
// it, in a writable transaction so that no commit of this process writes
// a meta page meanwhile (read-only: in a read transaction; the file's
// shared lock keeps writers of other processes out).
func checkOpen(db *bolt.DB, file *os.File, path string, markerTxid int) (rep Report, err error) {
	defer guard(path, &err)()
	tx, err := db.Begin(!db.IsReadOnly())
	if err != nil {
		return Report{Path: path}, err
	}
	defer tx.Rollback()
	fi, err := file.Stat()
	if err != nil {
		return Report{Path: path}, err
	}
	return checkTx(tx, path, fi.Size(), ReadMetaPages(file, fi.Size()), markerTxid)
}

// create makes an empty bbolt file at path: in a temporary file first,
// renamed into place once bbolt has written and synced it.
func create(path string) error {
	tmp := path + ".new"
	os.Remove(tmp)
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("create store %s: %w", path, err)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("create store %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("create store %s: %w", path, err)
	}
	return fsutil.SyncDir(filepath.Dir(path))
}

// Check checks the store file at path as Open does (checkTx lists every
// check), read-only, waiting up to lock for the lock of a server that
// holds it (a running server checks itself: Store.Check). A file that is
// not a store's (a backup) is checked the same way; without a commit
// marker beside it, its meta pages must both be valid.
func Check(path string, lock time.Duration) (Report, error) {
	return checkFile(path, lock, true, nil)
}

// CopyFile checks the store file at path as Check does and, if it passes,
// writes a consistent copy of it to w (a backup of a store no server
// holds; a running server's is Store.Backup).
func CopyFile(path string, lock time.Duration, w io.Writer) (Report, error) {
	return checkFile(path, lock, true, w)
}

// checkFile checks the file at path read-only (with its commit marker
// when withMarker) and, if it passes and copy is set, writes a consistent
// copy of it to copy in the same transaction.
func checkFile(path string, lock time.Duration, withMarker bool, copy io.Writer) (rep Report, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Report{Path: path}, err
	}
	if fi.Size() == 0 {
		return Report{Path: path}, damaged(path, "it is empty")
	}
	m := marker{}
	if withMarker {
		if m, _, err = readMarker(path); err != nil {
			return Report{Path: path}, err
		}
	}
	if err := preOpen(path); err != nil {
		return Report{Path: path, Size: fi.Size()}, err
	}
	db, file, err := openGuarded(path, bolt.Options{Timeout: lock, ReadOnly: true})
	if err != nil {
		return Report{Path: path, Size: fi.Size()}, err
	}
	defer db.Close()
	defer guard(path, &err)()
	tx, err := db.Begin(false)
	if err != nil {
		return Report{Path: path}, err
	}
	defer tx.Rollback()
	if fi, err = file.Stat(); err != nil {
		return Report{Path: path}, err
	}
	if rep, err = checkTx(tx, path, fi.Size(), ReadMetaPages(file, fi.Size()), m.Txid); err != nil || copy == nil {
		return rep, err
	}
	_, err = tx.WriteTo(copy)
	return rep, err
}

// Restored is what Restore did.
type Restored struct {
	// Backup is the check of the backup restored.
	Backup Report
	// Replaced is where the store file it replaced was kept ("" if there
	// was none, or the file was accepted as it is).
	Replaced string
	// Carried is what the replaced store held that the backup did not and
	// the restore kept (bans, releases, spent markers), re-banned or lost.
	Carried Carried
	// NotCarried, with RestoreOptions.Force, says why the replaced store
	// could not be read, so nothing was carried from it.
	NotCarried error
}

// RestoreOptions say how Restore works.
type RestoreOptions struct {
	// Lock is how long to wait for the store's lock (a running server
	// holds it: the restore is refused).
	Lock time.Duration
	// Now decides which single-use markers are still set.
	Now time.Time
	// Force restores even when the store being replaced cannot be read
	// (damaged): nothing is carried from it then (Restored.NotCarried).
	Force bool
}

// ErrCannotCarry: the store a restore would replace cannot be read, so
// what was done after the backup (bans, releases, spent markers) cannot
// be carried into the restored one; RestoreOptions.Force restores anyway.
var ErrCannotCarry = errors.New("the store being replaced cannot be read")

// Restore replaces the store file at path with the backup at from, which
// must pass every check (checkTx); the server must be stopped (Restore
// takes the store's lock, waiting up to lock). The file it replaces is
// kept beside it as <path>.replaced-<now>, for the record. The commit
// marker is set to the backup's last commit: everything committed after
// the backup is gone, and the store says so no more. from may be path
// itself: the file, checked without its marker, is then accepted as it
// is (after a finding an operator judged) and only the marker is
// rewritten.
func Restore(path, from string, o RestoreOptions) (Restored, error) {
	lock, now := o.Lock, o.Now
	var res Restored
	same := false
	if a, err := os.Stat(path); err == nil {
		if b, err := os.Stat(from); err == nil {
			same = os.SameFile(a, b)
		}
	}
	tmp := path + ".restore"
	var out *os.File
	if !same {
		var err error
		if out, err = os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600); err != nil {
			return res, err
		}
		defer func() {
			out.Close()
			os.Remove(tmp)
		}()
	}
	var w io.Writer
	if out != nil {
		w = out
	}
	rep, err := checkFile(from, lock, false, w)
	res.Backup = rep
	if err != nil {
		return res, fmt.Errorf("the backup %s: %w", from, err)
	}
	unlock, err := lockFile(path, lock)
	if err != nil {
		return res, err
	}
	defer unlock()
	txid := rep.Txid
	if !same {
		if err := out.Sync(); err != nil {
			return res, err
		}
		if fi, err := os.Stat(path); err == nil && fi.Size() == 0 {
			// Truncated to nothing: no ban or spent marker is left in it
			// to carry (and none could be named), whatever it held.
			res.NotCarried = fmt.Errorf("%s is empty", path)
		} else if err == nil {
			// What the replaced store holds that the backup does not and a
			// restore must not undo goes into the restored file first.
			c, t, err := carryInto(path, tmp, now)
			switch {
			case err == nil:
				res.Carried, txid = c, t
			case !o.Force:
				return res, fmt.Errorf("%w (%v): the bans, releases and spent markers it holds from after the backup cannot be carried over, nor named; restore with force to undo them", ErrCannotCarry, err)
			default:
				res.NotCarried = err
			}
		}
		if _, err := os.Stat(path); err == nil {
			res.Replaced = fmt.Sprintf("%s.replaced-%s", path, now.UTC().Format("20060102T150405Z"))
			if err := os.Rename(path, res.Replaced); err != nil {
				return res, err
			}
		}
		if err := os.Rename(tmp, path); err != nil {
			return res, err
		}
		if err := fsutil.SyncDir(filepath.Dir(path)); err != nil {
			return res, err
		}
	}
	return res, syncMarker(path, txid)
}

// carryInto carries into the store file at restored what the one at path
// (locked by the caller) holds that a restore must not undo (carryOver),
// in one transaction, and returns it with the restored file's last
// transaction.
func carryInto(path, restored string, now time.Time) (c Carried, txid int, err error) {
	defer guard(path, &err)()
	cur, done, err := snapshot(path)
	if err != nil {
		return Carried{}, 0, err
	}
	defer done()
	db, err := bolt.Open(restored, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return Carried{}, 0, err
	}
	defer db.Close()
	err = cur.View(func(ctx *bolt.Tx) error {
		return db.Update(func(dtx *bolt.Tx) error {
			var err error
			c, err = carryOver(ctx, dtx, now)
			return err
		})
	})
	if err != nil {
		return c, 0, err
	}
	err = db.View(func(tx *bolt.Tx) error {
		txid = int(tx.ID())
		return nil
	})
	return c, txid, err
}

// lockFile takes the exclusive lock bbolt takes on path (flock), waiting
// up to timeout: held, a server is running on the store. A missing file
// needs no lock.
func lockFile(path string, timeout time.Duration) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return func() {}, nil
	} else if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("store %s is in use (a server holds it: stop it first): %w", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Check checks the open store (checkTx lists every check), holding off
// writes while it runs. Damage found makes the store refuse everything
// from then on, as a write that found it does.
func (s *Store) Check() (Report, error) {
	if d := s.db.broken.Load(); d != nil {
		return Report{Path: s.db.path}, d
	}
	m, _, err := readMarker(s.db.path)
	if err != nil {
		return Report{Path: s.db.path}, err
	}
	f, err := os.Open(s.db.path)
	if err != nil {
		return Report{Path: s.db.path}, err
	}
	defer f.Close()
	rep, err := checkOpen(s.db.DB, f, s.db.path, m.Txid)
	s.db.fail(err)
	return rep, err
}

// Backup writes a consistent copy of the open store to w (bbolt's
// tx.WriteTo in a read transaction: writes go on meanwhile, and the copy
// is the store as of one commit), returning the size written and that
// commit's transaction ID.
func (s *Store) Backup(w io.Writer) (n int64, txid int, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		txid = tx.ID()
		n, err = tx.WriteTo(w)
		return err
	})
	return n, txid, err
}
