// Package seal encrypts and authenticates what the server hands out and
// must later trust again — attestation sessions and config tokens — so that
// any replica holding the keyring can open them and nobody else can read or
// forge them. AES-256-GCM; the purpose is authenticated data, so a sealed
// session can never be opened as a config token.
//
// Boxes are "np1." followed by base64url(keyID ‖ nonce ‖ ciphertext ‖ tag).
// The keyring keeps older keys for opening after a rotation; only the newest
// seals.
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

// Keyring seals with its newest key and opens with any of its keys. Safe for
// concurrent use.
type Keyring struct {
	mu    sync.RWMutex
	keys  []Key // newest first
	aeads map[string]cipher.AEAD
	path  string
	clock func() time.Time
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
	if err := r.set(keys); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Keyring) set(keys []Key) error {
	aeads := make(map[string]cipher.AEAD, len(keys))
	for _, k := range keys {
		if len(k.ID) != keyIDSize || len(k.Secret) != 32 {
			return errors.New("seal: malformed key")
		}
		block, err := aes.NewCipher(k.Secret)
		if err != nil {
			return err
		}
		a, err := cipher.NewGCM(block)
		if err != nil {
			return err
		}
		aeads[string(k.ID)] = a
	}
	r.keys, r.aeads = keys, aeads
	return nil
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

// Rotate adds a new newest key, sealing from activateAfter on (0: at
// once; give several replicas the time their copies of the file take to
// update), and drops keys created before now-retain (they can no longer
// open anything still valid: retain must exceed the longest lifetime of a
// sealed value). The keyring file, if any, is rewritten atomically.
func (r *Keyring) Rotate(retain, activateAfter time.Duration) error {
	now := r.clock()
	k, err := NewKey(now)
	if err != nil {
		return err
	}
	if activateAfter > 0 {
		k.Active = now.Add(activateAfter)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := []Key{k}
	for _, old := range r.keys {
		if now.Sub(old.Created) < retain {
			keys = append(keys, old)
		}
	}
	if err := r.set(keys); err != nil {
		return err
	}
	return r.saveLocked()
}

// Reload re-reads the keyring file, so a rotation made by another process
// (`nodeproof keys rotate`, or an updated Secret) takes effect, and
// reports whether the keys changed. A file that does not parse changes
// nothing and is an error.
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
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, err := json.Marshal(r.keys); err == nil && bytes.Equal(old, b) {
		return false, nil
	}
	if err := r.set(keys); err != nil {
		return false, fmt.Errorf("keyring %s: %w", r.path, err)
	}
	return true, nil
}

func (r *Keyring) save() error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.saveLocked()
}

func (r *Keyring) saveLocked() error {
	if r.path == "" {
		return nil
	}
	b, err := json.Marshal(r.keys)
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(r.path, b, 0o600)
}

// Seal encrypts plaintext for purpose with the newest active key (the
// oldest key if none is active yet).
func (r *Keyring) Seal(purpose string, plaintext []byte) (string, error) {
	now := r.clock()
	r.mu.RLock()
	k := r.keys[len(r.keys)-1]
	for _, c := range r.keys { // newest first: the newest active key seals
		if !c.Active.After(now) {
			k = c
			break
		}
	}
	a := r.aeads[string(k.ID)]
	r.mu.RUnlock()
	out := make([]byte, keyIDSize+a.NonceSize(), keyIDSize+a.NonceSize()+len(plaintext)+a.Overhead())
	copy(out, k.ID)
	if _, err := io.ReadFull(rand.Reader, out[keyIDSize:]); err != nil {
		return "", err
	}
	out = a.Seal(out, out[keyIDSize:], plaintext, aad(purpose, k.ID))
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
	r.mu.RLock()
	a, ok := r.aeads[string(id)]
	r.mu.RUnlock()
	if !ok || len(raw) < keyIDSize+a.NonceSize()+a.Overhead() {
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
