// Package tokens holds the two kinds of bearer token the Machine Config
// Server accepts:
//
//   - Provisioning tokens (the token tier, OpenShift enhancement
//     "mco-auth-token"): a shared random secret placed in pointer configs.
//     Rotation keeps the previous token valid for a grace period so that
//     machines being created with an older pointer config still boot.
//   - Config tokens (the attested tier): issued after a successful
//     attestation, sealed so any replica can check them, bound to one
//     NodeAttestation record, node and pool, short-lived and single-use.
package tokens

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/mcs/seal"
)

// ProvisioningTokenBytes is the default token size (the seed: 32 random
// bytes, base64).
const ProvisioningTokenBytes = 32

// Token is one provisioning token.
type Token struct {
	Value   string     `json:"value"`
	Created time.Time  `json:"created"`
	Retired *time.Time `json:"retired,omitempty"`
}

// Store keeps the list of provisioning tokens, newest first: a file
// ([FileStore]) or the cluster's Secret (mcs/cluster.TokenSecret).
type Store interface {
	// Load returns the list; an error wrapping fs.ErrNotExist when there
	// is none yet.
	Load(ctx context.Context) ([]Token, error)
	// Save replaces the list.
	Save(ctx context.Context, tokens []Token) error
	// String names where the tokens are kept.
	String() string
}

// FileStore keeps the tokens in a JSON file, mode 0600, rewritten
// atomically.
type FileStore string

// Load reads the file.
func (f FileStore) Load(context.Context) ([]Token, error) {
	b, err := os.ReadFile(string(f))
	if err != nil {
		return nil, fmt.Errorf("read provisioning tokens: %w", err)
	}
	var t []Token
	if err := json.Unmarshal(b, &t); err != nil || len(t) == 0 {
		return nil, fmt.Errorf("provisioning token file %s is malformed", string(f))
	}
	return t, nil
}

// Save writes the file.
func (f FileStore) Save(_ context.Context, t []Token) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(string(f), b, 0o600); err != nil {
		return fmt.Errorf("write provisioning tokens: %w", err)
	}
	return nil
}

func (f FileStore) String() string { return string(f) }

// storeTimeout bounds each Store call.
const storeTimeout = 15 * time.Second

// Provisioning is the set of valid provisioning tokens, kept in a Store.
// Safe for concurrent use.
type Provisioning struct {
	mu     sync.RWMutex
	store  Store
	tokens []Token // newest first
	grace  time.Duration
	clock  func() time.Time
	also   []alsoSet // other sets whose tokens are also accepted, for a while
}

// LoadProvisioning reads the token file at path, creating it with one new
// token when missing. grace is how long a rotated-out token stays valid.
func LoadProvisioning(path string, grace time.Duration, clock func() time.Time) (*Provisioning, error) {
	return Open(context.Background(), FileStore(path), grace, clock, true)
}

// Open reads the tokens from st. When there are none yet, create makes
// one (and saves it); otherwise that is an error.
func Open(ctx context.Context, st Store, grace time.Duration, clock func() time.Time, create bool) (*Provisioning, error) {
	p := &Provisioning{store: st, grace: grace, clock: clock}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	t, err := st.Load(ctx)
	switch {
	case errors.Is(err, fs.ErrNotExist) && create:
		if err := p.Rotate(); err != nil {
			return nil, err
		}
		return p, nil
	case err != nil:
		return nil, err
	}
	p.tokens = t
	return p, nil
}

type alsoSet struct {
	p     *Provisioning
	until time.Time
}

// Also makes p accept other's valid tokens as well, until the time until
// (read-only: other's current token is never given out by p). For a
// store being migrated from, e.g. the file beside the cluster's Secret:
// its tokens count as retired at the migration, so until is the
// migration plus the grace period, and a token that leaked from the old
// store stops working like any rotated-out one.
func (p *Provisioning) Also(other *Provisioning, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.also = append(p.also, alsoSet{other, until})
}

// List returns the tokens, newest first (to import them elsewhere).
func (p *Provisioning) List() []Token {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return append([]Token(nil), p.tokens...)
}

// Reload re-reads the tokens, so a rotation made by another process
// (`nodeproof token rotate`, the leader) takes effect, and reports whether
// they changed. Tokens that no longer load are an error and change
// nothing. Sets given to Also are reloaded too.
func (p *Provisioning) Reload() (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	next, err := p.store.Load(ctx)
	if err == nil && len(next) == 0 {
		err = fmt.Errorf("%s holds no provisioning token", p.store)
	}
	p.mu.Lock()
	also := p.also
	changed := false
	if err == nil {
		old, _ := json.Marshal(p.tokens)
		now, _ := json.Marshal(next)
		if !bytes.Equal(old, now) {
			p.tokens, changed = next, true
		}
	}
	p.mu.Unlock()
	errs := []error{err}
	for _, o := range also {
		c, err := o.p.Reload()
		changed = changed || c
		errs = append(errs, err)
	}
	return changed, errors.Join(errs...)
}

// Current returns the token new pointer configs should carry.
func (p *Provisioning) Current() string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.tokens[0].Value
}

// Published returns the token to publish in pointer configs now: the
// current one once it is older than settle, else the one before it (still
// valid: it was retired less than settle ago, and settle is shorter than
// the grace period). Replicas pick a rotation up at their next reload;
// publishing a token only after that lets every replica accept it before
// any machine presents it.
func (p *Provisioning) Published(settle time.Duration) string {
	now := p.clock()
	p.mu.RLock()
	defer p.mu.RUnlock()
	if len(p.tokens) > 1 && now.Sub(p.tokens[0].Created) < settle && p.valid(p.tokens[1], now) {
		return p.tokens[1].Value
	}
	return p.tokens[0].Value
}

// Age returns how long ago the current token was made.
func (p *Provisioning) Age() time.Duration {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.clock().Sub(p.tokens[0].Created)
}

func (p *Provisioning) valid(t Token, now time.Time) bool {
	return t.Retired == nil || now.Before(t.Retired.Add(p.grace))
}

// Valid returns every token still accepted: the current one and those
// retired less than the grace period ago (newest first), then those of the
// sets given to Also. Pointer configs in a cluster must keep working for
// all of them.
func (p *Provisioning) Valid() []string {
	now := p.clock()
	p.mu.RLock()
	var out []string
	for _, t := range p.tokens {
		if p.valid(t, now) {
			out = append(out, t.Value)
		}
	}
	also := p.also
	p.mu.RUnlock()
	for _, o := range also {
		if now.Before(o.until) {
			out = append(out, o.p.Valid()...)
		}
	}
	return out
}

// Check reports whether presented is a valid token. Every valid token is
// compared, in constant time, whatever matches first.
func (p *Provisioning) Check(presented string) bool {
	ok := 0
	for _, v := range p.Valid() {
		ok |= subtle.ConstantTimeCompare([]byte(presented), []byte(v))
	}
	return ok == 1
}

// Rotate makes a new current token and saves the list; the old one stays
// valid for the grace period. Tokens past their grace are dropped.
func (p *Provisioning) Rotate() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock()
	raw := make([]byte, ProvisioningTokenBytes)
	if _, err := io.ReadFull(rand.Reader, raw); err != nil {
		return err
	}
	next := []Token{{Value: base64.StdEncoding.EncodeToString(raw), Created: now}}
	for _, t := range p.tokens {
		if t.Retired == nil {
			t.Retired = &now
		}
		if p.valid(t, now) {
			next = append(next, t)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := p.store.Save(ctx, next); err != nil {
		return err
	}
	p.tokens = next
	return nil
}

// ConfigToken is what a config token says.
type ConfigToken struct {
	// ID is unique per token (its single-use key).
	ID       string    `json:"jti"`
	RecordID string    `json:"rid"`
	NodeName string    `json:"node"`
	Pool     string    `json:"pool"`
	Expires  time.Time `json:"exp"`
	// Bootstrap is the secret of the record's bootstrap token (cluster
	// mode): the node receives it in its kubeconfig with this token's
	// config, so sealing it here reveals nothing more, and the fetch needs
	// no read of the token's Secret.
	Bootstrap string `json:"bt,omitempty"`
	// Identity, BootstrapTokenID and RecordExpires are the record's, so the
	// fetch needs no read of it (the binding, read at fetch, says whether
	// the enrolment still stands). Empty in a token of an older server:
	// the fetch then reads the record.
	Identity         string    `json:"idn,omitempty"`
	BootstrapTokenID string    `json:"btid,omitempty"`
	RecordExpires    time.Time `json:"rexp,omitzero"`
}

const configTokenPurpose = "config-token"

// ErrTokenInvalid and ErrTokenExpired are the refusals of OpenConfigToken.
var (
	ErrTokenInvalid = errors.New("config token is invalid")
	ErrTokenExpired = errors.New("config token has expired")
)

// IsConfigToken tells a config token from a provisioning token by its form.
func IsConfigToken(s string) bool { return strings.HasPrefix(s, seal.Prefix) }

// IssueConfigToken seals t.
func IssueConfigToken(k *seal.Keyring, t ConfigToken) (string, error) {
	b, err := json.Marshal(t)
	if err != nil {
		return "", err
	}
	return k.Seal(configTokenPurpose, b)
}

// NewTokenID returns a random token ID.
func NewTokenID() (string, error) {
	b := make([]byte, 16)
	if _, err := io.ReadFull(rand.Reader, b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// OpenConfigToken opens and checks a config token's seal and expiry at now.
// Pool binding and single use are the caller's to check (it knows the
// request and the store).
func OpenConfigToken(k *seal.Keyring, s string, now time.Time) (*ConfigToken, error) {
	b, err := k.Open(configTokenPurpose, s)
	if err != nil {
		return nil, ErrTokenInvalid
	}
	var t ConfigToken
	if err := json.Unmarshal(b, &t); err != nil || t.ID == "" || t.RecordID == "" {
		return nil, ErrTokenInvalid
	}
	if !now.Before(t.Expires) {
		return nil, ErrTokenExpired
	}
	return &t, nil
}
