// Package seal encrypts and authenticates what the server hands out and
// must later trust again — attestation sessions and config tokens — so that
// any replica holding the keyring can open them and nobody else can read or
// forge them. AES-256-GCM; the purpose is authenticated data, so a sealed
// session can never be opened as a config token.
//
// Boxes are "np1." followed by base64url(keyID ‖ nonce ‖ ciphertext ‖ tag).
// The keyring keeps older keys for opening after a rotation; only the newest
// active key seals. A key is retired from the moment a newer key took over
// sealing, and kept at least as long as anything it sealed can live.
package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodeproof/nodeproof/fsutil"
)

// Prefix starts every box.
const Prefix = "np1."

// MaxBox bounds the size of a box accepted by Open.
const MaxBox = 16 << 10

const keyIDSize = 8

// ErrInvalid is returned for any box that does not open: malformed, sealed
// by an unknown key, for another purpose, or tampered with. Callers cannot
// and need not tell these apart.
var ErrInvalid = errors.New("sealed value is invalid")

// Key is one AES-256 key.
type Key struct {
	ID      []byte    `json:"id"`
	Secret  []byte    `json:"secret"`
	Created time.Time `json:"created"`
	// Active is when the key starts sealing (zero: at once). Until then it
	// only opens. Several replicas sharing a keyring file that is updated
	// unevenly (a mounted Secret) rotate safely when every replica has the
	// new key before any seals with it.
	Active time.Time `json:"active,omitzero"`
}

// sealsFrom is when k starts sealing: its activation, else its creation.
func (k Key) sealsFrom() time.Time {
	if k.Active.IsZero() {
		return k.Created
	}
	return k.Active
}

// activeAt reports whether k may seal at now (a zero Active seals at once,
// whatever the clocks of the replica that made it said).
func (k Key) activeAt(now time.Time) bool { return k.Active.IsZero() || !k.Active.After(now) }

// Defaults of a rotation (`nodeproof keys rotate`).
const (
	// DefaultRetain keeps a key that stopped sealing for a day: far longer
	// than anything sealed lives (sessions 5 minutes, config tokens 10 by
	// default), so a config token handed out just before a rotation is
	// still good at its last second.
	DefaultRetain = 24 * time.Hour
	// DefaultActivateAfter is the time every replica has to reload a
	// rotated keyring file before the new key seals (a mounted Secret
	// updates within about a minute).
	DefaultActivateAfter = 2 * time.Minute
)

// ErrNoActiveKey is Seal's error when no key of the keyring may seal yet:
// every key it holds is staged for later. Seal never uses a key before
// its activation, because replicas that have not yet reloaded the keyring
// could not open what it seals.
var ErrNoActiveKey = errors.New("seal: no key of the keyring may seal yet (every key is staged for later)")

// entry is one key of a Keyring with its cipher. until is zero for a key
// of the keyring file; for a key the file dropped while something it
// sealed could still be live (Reload), the time it is kept until.
type entry struct {
	key   Key
	aead  cipher.AEAD
	until time.Time
}

// Keyring seals with its newest active key and opens with any of its
// keys. Safe for concurrent use.
type Keyring struct {
	mu sync.RWMutex
	// entries are the file's keys, newest first, then the keys Reload
	// holds after the file dropped them.
	entries []entry
	byID    map[string]int
	path    string
	clock   func() time.Time
	// maxLife is how long anything sealed with this keyring stays valid
	// (SetMaxLife); 0 holds nothing a reload drops.
	maxLife time.Duration
}

// NewKey makes a random key.
func NewKey(now time.Time) (Key, error) {
	k := Key{ID: make([]byte, keyIDSize), Secret: make([]byte, 32), Created: now}
	if _, err := io.ReadFull(rand.Reader, k.ID); err != nil {
		return k, err
	}
	_, err := io.ReadFull(rand.Reader, k.Secret)
	return k, err
}

// New makes a keyring from keys (newest first).
func New(keys []Key, clock func() time.Time) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("seal: no keys")
	}
	r := &Keyring{clock: clock}
	entries, err := newEntries(keys)
	if err != nil {
		return nil, err
	}
	r.setLocked(entries)
	return r, nil
}

// newEntries checks keys and makes their ciphers.
func newEntries(keys []Key) ([]entry, error) {
	out := make([]entry, 0, len(keys))
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if len(k.ID) != keyIDSize || len(k.Secret) != 32 {
			return nil, errors.New("seal: malformed key")
		}
		if seen[string(k.ID)] {
			return nil, fmt.Errorf("seal: key %x appears twice", k.ID)
		}
		seen[string(k.ID)] = true
		block, err := aes.NewCipher(k.Secret)
		if err != nil {
			return nil, err
		}
		a, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		out = append(out, entry{key: k, aead: a})
	}
	return out, nil
}

func (r *Keyring) setLocked(entries []entry) {
	r.entries = entries
	r.byID = make(map[string]int, len(entries))
	for i, e := range entries {
		r.byID[string(e.key.ID)] = i
	}
}

// fileKeys are the keys of the keyring file (not those Reload holds).
func (r *Keyring) fileKeys() []Key {
	var keys []Key
	for _, e := range r.entries {
		if e.until.IsZero() {
			keys = append(keys, e.key)
		}
	}
	return keys
}

// SetMaxLife tells the keyring how long anything it seals stays valid:
// the longest session or config token lifetime, plus the time replicas
// take to pick up a rotated file. From then on, when Reload finds that the
// file dropped a key that stopped sealing here less than d ago (a keyring
// rotated with too short a --retain, replaced by hand, or written by an
// older release), the key is kept for opening — never for sealing once a
// key of the file is active — until d after it stopped sealing, so no
// session or config token this replica handed out is refused before its
// time. 0 (the default) holds nothing.
func (r *Keyring) SetMaxLife(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maxLife = d
}

// LoadOrCreate reads the keyring at path (JSON, mode 0600), creating it
// with one new key when it does not exist.
func LoadOrCreate(path string, clock func() time.Time) (*Keyring, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		k, err := NewKey(clock())
		if err != nil {
			return nil, err
		}
		r, err := New([]Key{k}, clock)
		if err != nil {
			return nil, err
		}
		r.path = path
		return r, r.save()
	}
	if err != nil {
		return nil, fmt.Errorf("read keyring: %w", err)
	}
	var keys []Key
	if err := json.Unmarshal(b, &keys); err != nil {
		return nil, fmt.Errorf("keyring %s: %w", path, err)
	}
	r, err := New(keys, clock)
	if err != nil {
		return nil, fmt.Errorf("keyring %s: %w", path, err)
	}
	r.path = path
	return r, nil
}

// KeyState is where one key stands in its keyring's life, as a rotation
// reports it.
type KeyState struct {
	// ID is the key's ID, hex (the first bytes of every box it sealed).
	ID      string
	Created time.Time
	// SealsFrom is when the key starts (or started) sealing.
	SealsFrom time.Time
	// SealsUntil is when a newer key took over sealing (zero: the key
	// still seals, or will).
	SealsUntil time.Time
	// KeptUntil is when the keyring may drop it (zero: while it seals).
	KeptUntil time.Time
}

// Rotation is what Rotate did: the new key, the older keys it kept (and
// until when) and those it dropped.
type Rotation struct {
	New           KeyState
	Kept, Dropped []KeyState
}

// retirements returns, for keys (newest first), when each stopped sealing:
// when the first newer key started sealing (zero for the newest, which
// still seals). A key retires from that moment, not from its creation: a
// key made long ago sealed until the rotation that replaced it, and what
// it sealed then lives on after it.
func retirements(keys []Key) []time.Time {
	out := make([]time.Time, len(keys))
	var first time.Time
	for i, k := range keys {
		out[i] = first
		if from := k.sealsFrom(); first.IsZero() || from.Before(first) {
			first = from
		}
	}
	return out
}

// Rotate adds a new newest key, sealing from activateAfter on (0: at
// once; give several replicas the time their copies of the file take to
// update), and drops the older keys that stopped sealing at least retain
// ago. A key stops sealing when a newer key starts to, so the key sealing
// now is kept until retain after the new key takes over, whatever its
// age: retain must exceed the longest life of anything sealed (config
// tokens, sessions). A key is never dropped while it seals, so the staged
// activation holds even when the old keys were all due to go. The keyring
// file, if any, is rewritten atomically.
func (r *Keyring) Rotate(retain, activateAfter time.Duration) (Rotation, error) {
	now := r.clock()
	k, err := NewKey(now)
	if err != nil {
		return Rotation{}, err
	}
	if activateAfter > 0 {
		k.Active = now.Add(activateAfter)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	all := append([]Key{k}, r.fileKeys()...)
	retired := retirements(all)
	rot := Rotation{New: KeyState{ID: fmt.Sprintf("%x", k.ID), Created: now, SealsFrom: k.sealsFrom()}}
	keys := []Key{k}
	for i, old := range all[1:] {
		st := KeyState{ID: fmt.Sprintf("%x", old.ID), Created: old.Created, SealsFrom: old.sealsFrom(),
			SealsUntil: retired[i+1], KeptUntil: retired[i+1].Add(retain)}
		if now.Before(st.KeptUntil) {
			keys = append(keys, old)
			rot.Kept = append(rot.Kept, st)
		} else {
			rot.Dropped = append(rot.Dropped, st)
		}
	}
	entries, err := newEntries(keys)
	if err != nil {
		return Rotation{}, err
	}
	// Keys Reload holds stay held: the file never had them back.
	for _, e := range r.entries {
		if !e.until.IsZero() && !slices.ContainsFunc(keys, func(k Key) bool { return bytes.Equal(k.ID, e.key.ID) }) {
			entries = append(entries, e)
		}
	}
	if err := r.saveKeys(keys); err != nil {
		return Rotation{}, err
	}
	r.setLocked(entries)
	return rot, nil
}

// Reload re-reads the keyring file, so a rotation made by another process
// (`nodeproof keys rotate`, or an updated Secret) takes effect, and
// reports whether the keys changed. A file that does not parse changes
// nothing and is an error. With SetMaxLife, a key the file dropped that
// stopped sealing here less than the max life ago is held for opening
// (and for sealing until a key of the file is active) until it can open
// nothing live; Held lists such keys.
func (r *Keyring) Reload() (bool, error) {
	if r.path == "" {
		return false, nil
	}
	b, err := os.ReadFile(r.path)
	if err != nil {
		return false, fmt.Errorf("read keyring: %w", err)
	}
	var keys []Key
	if err := json.Unmarshal(b, &keys); err != nil || len(keys) == 0 {
		return false, fmt.Errorf("keyring %s is malformed", r.path)
	}
	entries, err := newEntries(keys)
	if err != nil {
		return false, fmt.Errorf("keyring %s: %w", r.path, err)
	}
	now := r.clock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if sameKeys(r.fileKeys(), keys) {
		r.pruneLocked(now)
		return false, nil
	}
	inFile := make(map[string]bool, len(keys))
	var next time.Time // when a key of the new file may first seal here
	for _, k := range keys {
		inFile[string(k.ID)] = true
		from := now
		if !k.activeAt(now) {
			from = k.Active
		}
		if next.IsZero() || from.Before(next) {
			next = from
		}
	}
	if r.maxLife > 0 {
		prev := r.fileKeys()
		retired := retirements(prev)
		for i, k := range prev {
			// This replica sealed with the key until a newer one took
			// over; if none had, it still seals with it until a key of
			// the new file may.
			stopped := retired[i]
			if stopped.IsZero() || stopped.After(now) {
				stopped = next
			}
			if until := stopped.Add(r.maxLife); !inFile[string(k.ID)] && now.Before(until) {
				e := r.entries[r.byID[string(k.ID)]]
				e.until = until
				entries = append(entries, e)
				inFile[string(k.ID)] = true
			}
		}
	}
	for _, e := range r.entries {
		if !e.until.IsZero() && !inFile[string(e.key.ID)] && now.Before(e.until) {
			entries = append(entries, e)
		}
	}
	r.setLocked(entries)
	return true, nil
}

// sameKeys reports whether a and b are the same keys, in the same order.
func sameKeys(a, b []Key) bool {
	return slices.EqualFunc(a, b, func(x, y Key) bool {
		return bytes.Equal(x.ID, y.ID) && bytes.Equal(x.Secret, y.Secret) && x.Created.Equal(y.Created) && x.Active.Equal(y.Active)
	})
}

// pruneLocked forgets held keys whose time is over.
func (r *Keyring) pruneLocked(now time.Time) {
	kept := r.entries[:0:0]
	for _, e := range r.entries {
		if e.until.IsZero() || now.Before(e.until) {
			kept = append(kept, e)
		}
	}
	if len(kept) != len(r.entries) {
		r.setLocked(kept)
	}
}

// Held lists the keys Reload holds after the file dropped them, with the
// time each is kept until (KeptUntil).
func (r *Keyring) Held() []KeyState {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []KeyState
	for _, e := range r.entries {
		if !e.until.IsZero() {
			out = append(out, KeyState{ID: fmt.Sprintf("%x", e.key.ID), Created: e.key.Created, SealsFrom: e.key.sealsFrom(), KeptUntil: e.until})
		}
	}
	return out
}

func (r *Keyring) save() error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.saveKeys(r.fileKeys())
}

func (r *Keyring) saveKeys(keys []Key) error {
	if r.path == "" {
		return nil
	}
	b, err := json.Marshal(keys)
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(r.path, b, 0o600)
}

// Seal encrypts plaintext for purpose with the newest key that is active
// now; a key staged for later never seals (ErrNoActiveKey when no key is
// active yet).
func (r *Keyring) Seal(purpose string, plaintext []byte) (string, error) {
	now := r.clock()
	r.mu.RLock()
	var k *entry
	for i := range r.entries { // the file's keys newest first, then held ones
		if e := &r.entries[i]; e.key.activeAt(now) && (e.until.IsZero() || now.Before(e.until)) {
			k = e
			break
		}
	}
	r.mu.RUnlock()
	if k == nil {
		return "", ErrNoActiveKey
	}
	a, id := k.aead, k.key.ID
	out := make([]byte, keyIDSize+a.NonceSize(), keyIDSize+a.NonceSize()+len(plaintext)+a.Overhead())
	copy(out, id)
	if _, err := io.ReadFull(rand.Reader, out[keyIDSize:]); err != nil {
		return "", err
	}
	out = a.Seal(out, out[keyIDSize:], plaintext, aad(purpose, id))
	return Prefix + base64.RawURLEncoding.EncodeToString(out), nil
}

// Open decrypts a box sealed for purpose; any failure is ErrInvalid.
func (r *Keyring) Open(purpose, box string) ([]byte, error) {
	if len(box) > MaxBox || !strings.HasPrefix(box, Prefix) {
		return nil, ErrInvalid
	}
	raw, err := base64.RawURLEncoding.DecodeString(box[len(Prefix):])
	if err != nil || len(raw) < keyIDSize {
		return nil, ErrInvalid
	}
	id := raw[:keyIDSize]
	now := r.clock()
	r.mu.RLock()
	var a cipher.AEAD
	if i, ok := r.byID[string(id)]; ok {
		if e := r.entries[i]; e.until.IsZero() || now.Before(e.until) {
			a = e.aead
		}
	}
	r.mu.RUnlock()
	if a == nil || len(raw) < keyIDSize+a.NonceSize()+a.Overhead() {
		return nil, ErrInvalid
	}
	nonce := raw[keyIDSize : keyIDSize+a.NonceSize()]
	pt, err := a.Open(nil, nonce, raw[keyIDSize+a.NonceSize():], aad(purpose, id))
	if err != nil {
		return nil, ErrInvalid
	}
	return pt, nil
}

func aad(purpose string, id []byte) []byte {
	var b bytes.Buffer
	b.WriteString("nodeproof seal v1\x00")
	b.WriteString(purpose)
	b.WriteByte(0)
	b.Write(id)
	return b.Bytes()
}
