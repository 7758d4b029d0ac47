package cluster

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/store"
)

// Errors Configs returns. None is mcs.ErrUnknownPool: each wraps
// mcs.ErrNotReady, which mcs answers with 503 and Retry-After (Ignition
// retries) without logging each request.
var (
	// ErrNotSynced: the informer caches have not synced yet (the server just
	// started, or cannot reach the API server).
	ErrNotSynced = fmt.Errorf("%w: cluster inputs have not arrived yet", mcs.ErrNotReady)
	// ErrNoSuchPool: the cluster has no MachineConfigPool of that name now.
	ErrNoSuchPool = fmt.Errorf("%w: no such MachineConfigPool in the cluster (yet)", mcs.ErrNotReady)
	// ErrIncomplete: the pool is there but not everything its config is
	// built from (render.Renderer.Missing): its rendered MachineConfig, a
	// MachineConfig in that config's source list, or the ControllerConfig.
	// The watch streams deliver objects in no particular order; serving
	// then would hand a machine a partial config it never asks for again.
	ErrIncomplete = fmt.Errorf("%w: the pool's inputs have not all arrived", mcs.ErrNotReady)
)

// Configs is mcs.Configs for cluster mode: R serves, but a pool the
// cluster does not have is "not yet" (ErrNoSuchPool, a 503) rather than
// mcs.ErrUnknownPool (a final 404). That is what the in-cluster MCS does
// (a pool its lister does not find is a 500, which Ignition retries), and
// it is right for a cluster: a pool can be created while its machines
// boot, and the MCO creates the built-in pools after the API server is up.
// The price: a pointer config naming a pool that will never exist retries
// forever, as with the MCS. A pool whose inputs are incomplete is
// ErrIncomplete, for both tiers. The zero Configs (no R yet) answers
// ErrNotSynced.
type Configs struct {
	R *mcs.Rendered
}

var _ mcs.PartsConfigs = Configs{}

// Pools implements mcs.Configs.
func (c Configs) Pools() []string {
	if c.R == nil {
		return nil
	}
	return c.R.Pools()
}

// Public implements mcs.Configs.
func (c Configs) Public(pool, accept string) ([]byte, error) {
	if err := c.ready(pool); err != nil {
		return nil, err
	}
	b, err := c.R.Public(pool, accept)
	return b, notYet(pool, err)
}

// Full implements mcs.Configs.
func (c Configs) Full(pool, accept string, node *store.Record) ([]byte, error) {
	if err := c.ready(pool); err != nil {
		return nil, err
	}
	b, err := c.R.Full(pool, accept, node)
	return b, notYet(pool, err)
}

// FullParts implements mcs.PartsConfigs.
func (c Configs) FullParts(pool, accept string, node *store.Record) ([][]byte, error) {
	if err := c.ready(pool); err != nil {
		return nil, err
	}
	parts, err := c.R.FullParts(pool, accept, node)
	return parts, notYet(pool, err)
}

// ready is nil when pool can be served: synced, present, complete.
func (c Configs) ready(pool string) error {
	if c.R == nil || c.R.R == nil {
		return ErrNotSynced
	}
	missing, err := c.R.R.Missing(pool)
	if errors.Is(err, render.ErrUnknownPool) {
		return fmt.Errorf("%w: %q", ErrNoSuchPool, pool)
	}
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: pool %q lacks %s", ErrIncomplete, pool, strings.Join(missing, ", "))
	}
	return nil
}

func notYet(pool string, err error) error {
	if errors.Is(err, mcs.ErrUnknownPool) {
		return fmt.Errorf("%w: %q", ErrNoSuchPool, pool)
	}
	return err
}
