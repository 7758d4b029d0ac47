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
	"crypto/rand"
	"crypto/subtle"
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
	"github.com/nodeproof/nodeproof/mcs/seal"
)

// ProvisioningTokenBytes is the default token size (the seed: 32 random
// bytes, base64).
const ProvisioningTokenBytes = 32

type provToken struct {
	Value   string     `json:"value"`
	Created time.Time  `json:"created"`
	Retired *time.Time `json:"retired,omitempty"`
}

// Provisioning is the set of valid provisioning tokens, kept in a file
// (mode 0600, rewritten atomically). Safe for concurrent use.
type Provisioning struct {
	mu     sync.RWMutex
	path   string
	tokens []provToken // newest first
	grace  time.Duration
	clock  func() time.Time
}

// LoadProvisioning reads the token file at path, creating it with one new
// token when missing. grace is how long a rotated-out token stays valid.
func LoadProvisioning(path string, grace time.Duration, clock func() time.Time) (*Provisioning, error) {
	p := &Provisioning{path: path, grace: grace, clock: clock}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := p.rotate(); err != nil {
			return nil, err
		}
		return p, nil
	case err != nil:
		return nil, fmt.Errorf("read provisioning tokens: %w", err)
	}
	if err := json.Unmarshal(b, &p.tokens); err != nil || len(p.tokens) == 0 {
		return nil, fmt.Errorf("provisioning token file %s is malformed", path)
	}
	return p, nil
}

// Reload re-reads the token file, so a rotation made by another process
// (`nodeproof token rotate`) takes effect, and reports whether the tokens
// changed. A file that no longer parses is an error and changes nothing.
func (p *Provisioning) Reload() (bool, error) {
	b, err := os.ReadFile(p.path)
	if err != nil {
		return false, fmt.Errorf("read provisioning tokens: %w", err)
	}
	var next []provToken
	if err := json.Unmarshal(b, &next); err != nil || len(next) == 0 {
		return false, fmt.Errorf("provisioning token file %s is malformed", p.path)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old, err := json.Marshal(p.tokens)
	if err != nil {
		return false, err
	}
	now, err := json.Marshal(next)
	if err != nil {
		return false, err
	}
	if bytes.Equal(old, now) {
		return false, nil
	}
	p.tokens = next
	return true, nil
}

// Current returns the token new pointer configs should carry.
func (p *Provisioning) Current() string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.tokens[0].Value
}

// Valid returns every token still accepted: the current one and those
// retired less than the grace period ago (newest first). Pointer configs in
// a cluster must keep working for all of them.
func (p *Provisioning) Valid() []string {
	now := p.clock()
	p.mu.RLock()
	defer p.mu.RUnlock()
	var out []string
	for _, t := range p.tokens {
		if t.Retired == nil || now.Before(t.Retired.Add(p.grace)) {
			out = append(out, t.Value)
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

// Rotate makes a new current token; the old one stays valid for the grace
// period. Tokens past their grace are dropped from the file.
func (p *Provisioning) Rotate() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rotateLocked()
}

func (p *Provisioning) rotate() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rotateLocked()
}

func (p *Provisioning) rotateLocked() error {
	now := p.clock()
	raw := make([]byte, ProvisioningTokenBytes)
	if _, err := io.ReadFull(rand.Reader, raw); err != nil {
		return err
	}
	next := []provToken{{Value: base64.StdEncoding.EncodeToString(raw), Created: now}}
	for _, t := range p.tokens {
		if t.Retired == nil {
			t.Retired = &now
		}
		if now.Before(t.Retired.Add(p.grace)) {
			next = append(next, t)
		}
	}
	b, err := json.Marshal(next)
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(p.path, b, 0o600); err != nil {
		return fmt.Errorf("write provisioning tokens: %w", err)
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
