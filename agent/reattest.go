package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/fsutil"
)

// ModeReattest (every boot after the first, and on a timer): prove this
// enrolled node again. Nothing is released; the server records the
// outcome, and the node's Attested condition and taint follow it.
const ModeReattest Mode = "reattest"

// Defaults of a re-attestation run.
const (
	DefaultReattestState = "/var/lib/nodeproof/reattest.json"
	// BootIDPath is the kernel's random ID of the current boot.
	BootIDPath = "/proc/sys/kernel/random/boot_id"
	// reattestJitter spreads re-attestations of nodes that booted
	// together: each interval is shortened by up to this fraction.
	reattestJitter = 0.1
)

// ReattestState is what the agent remembers between runs (StatePath).
type ReattestState struct {
	// BootID is the boot the last success was in: a new boot attests at
	// once, whatever NextAt says.
	BootID string `json:"bootID"`
	// LastSuccess is the server's last acceptance; NextAt when to attest
	// again (the server's interval, less jitter).
	LastSuccess time.Time `json:"lastSuccess"`
	NextAt      time.Time `json:"nextAt"`
	// Boots is the server's count of this node's boots.
	Boots int64 `json:"boots"`
}

// ReattestConfig is one run of ModeReattest.
type ReattestConfig struct {
	Server   string
	CABundle []byte
	Pool     string
	// NodeName is this node's name (required: a re-attestation names the
	// node it is, and the server checks the identity owns it).
	NodeName string
	Evidence Evidence
	// KubeletKeyPath is the kubelet's bootstrap key; the challenge binds
	// its public key (a re-attestation approves nothing with it).
	KubeletKeyPath string
	// BoundKeyPath is the agent's own copy of the key it bound
	// (DefaultBoundKeyPath; BoundKey): used in preference to
	// KubeletKeyPath, which the kubelet removes once its certificate is
	// issued. "" uses KubeletKeyPath alone.
	BoundKeyPath string
	// StatePath is where the state is kept (DefaultReattestState).
	StatePath string
	// BootID reads the current boot's ID (default: BootIDPath).
	BootID func() (string, error)
	// Force attests even when not due.
	Force bool
	// Clock tells the time (default time.Now).
	Clock func() time.Time
	// Console gets one line per run, and the reason of a refusal.
	Console io.Writer
	// Timing, when set, counts the network's and the server's time.
	Timing *Timing
}

// Reattest attests this node again when it is due: at the first run of
// each boot, then when the interval the server gave has passed (the timer
// runs it more often). On success it records when the next one is due. A
// refusal is a *Refused whose reason the console shows; the state is left
// as it was, so the next run tries again.
func Reattest(ctx context.Context, cfg ReattestConfig) error {
	out := cfg.Console
	if out == nil {
		out = io.Discard
	}
	say := console(out)
	if cfg.Server == "" || cfg.Pool == "" || cfg.Evidence == nil || cfg.NodeName == "" {
		return errors.New("agent: Server, Pool, Evidence and NodeName are required to re-attest")
	}
	if cfg.StatePath == "" {
		cfg.StatePath = DefaultReattestState
	}
	if cfg.KubeletKeyPath == "" {
		cfg.KubeletKeyPath = DefaultKubeletKeyPath
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.BootID == nil {
		cfg.BootID = func() (string, error) {
			b, err := os.ReadFile(BootIDPath)
			return strings.TrimSpace(string(b)), err
		}
	}
	boot, err := cfg.BootID()
	if err != nil {
		return fmt.Errorf("agent: boot ID: %w", err)
	}
	st, err := LoadReattestState(cfg.StatePath)
	if err != nil {
		return err
	}
	now := cfg.Clock()
	if !cfg.Force && st.BootID == boot && now.Before(st.NextAt) {
		say("node %s: attested at %s, next due at %s", cfg.NodeName, st.LastSuccess.UTC().Format(time.RFC3339), st.NextAt.UTC().Format(time.RFC3339))
		return nil
	}
	c, err := NewClient(cfg.Server, cfg.CABundle)
	if err != nil {
		return err
	}
	c.Purpose = attest.PurposeReattest
	c.Progress = func(format string, args ...any) { say(format, args...) }
	if cfg.Timing != nil {
		c.HTTP.Transport = cfg.Timing.Transport(c.HTTP.Transport)
	}
	key, pub, err := BoundKey(cfg.BoundKeyPath, cfg.KubeletKeyPath)
	if err != nil {
		return err
	}
	c.KubeletKey = key
	vr, err := cfg.Evidence.Attest(ctx, c, cfg.Pool, cfg.NodeName, pub)
	if err != nil {
		err = refusal(say, "re-attestation", err)
		report(ctx, c, say, cfg.Pool, cfg.NodeName, "re-attestation", err)
		return err
	}
	if vr.Reattest == nil {
		return errors.New("agent: the server's answer is not a re-attestation's")
	}
	interval := time.Duration(vr.Reattest.IntervalSeconds) * time.Second
	if interval <= 0 {
		interval = time.Hour
	}
	next := now.Add(interval - jitter(interval))
	st = ReattestState{BootID: boot, LastSuccess: now, NextAt: next, Boots: vr.Reattest.Boots}
	if err := SaveReattestState(cfg.StatePath, st); err != nil {
		return err
	}
	say("node %s re-attested (%s evidence, boot %d seen by the server); next at %s", vr.NodeName, cfg.Evidence.Kind(), st.Boots, next.UTC().Format(time.RFC3339))
	return nil
}

// jitter is a random duration up to reattestJitter of d.
func jitter(d time.Duration) time.Duration {
	n := int64(float64(d) * reattestJitter)
	if n <= 0 {
		return 0
	}
	v, err := rand.Int(rand.Reader, big.NewInt(n))
	if err != nil {
		return 0
	}
	return time.Duration(v.Int64())
}

// LoadReattestState reads the state; a missing file is the zero state.
func LoadReattestState(path string) (ReattestState, error) {
	var st ReattestState
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	} else if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		// A torn or foreign file: attest now, and write a good one.
		return ReattestState{}, nil
	}
	return st, nil
}

// SaveReattestState writes the state atomically.
func SaveReattestState(path string, st ReattestState) error { return saveState(path, st) }

// saveState writes v as JSON to path atomically, mode 0600, its directory
// made 0700 when missing: the agent's state files between runs.
func saveState(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(path, b, 0o600)
}
