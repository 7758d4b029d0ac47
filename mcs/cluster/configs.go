package cluster

import (
	"errors"
	"fmt"

	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/store"
)

// Errors Configs returns. Neither is mcs.ErrUnknownPool: mcs answers both
// with 503 and Retry-After, which Ignition retries.
var (
	// ErrNotSynced: the informer caches have not synced yet (the server just
	// started, or cannot reach the API server).
	ErrNotSynced = errors.New("cluster inputs have not arrived yet")
	// ErrNoSuchPool: the cluster has no MachineConfigPool of that name now.
	ErrNoSuchPool = errors.New("no such MachineConfigPool in the cluster (yet)")
)

// Configs is mcs.Configs for cluster mode: R serves, but a pool the
// cluster does not have is "not yet" (ErrNoSuchPool, a 503) rather than
// mcs.ErrUnknownPool (a final 404). That is what the in-cluster MCS does
// (a pool its lister does not find is a 500, which Ignition retries), and
// it is right for a cluster: a pool can be created while its machines
// boot, and the MCO creates the built-in pools after the API server is up.
// The price: a pointer config naming a pool that will never exist retries
// forever, as with the MCS. The zero Configs (no R yet) answers
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
	if c.R == nil {
		return nil, ErrNotSynced
	}
	b, err := c.R.Public(pool, accept)
	return b, notYet(pool, err)
}

// Full implements mcs.Configs.
func (c Configs) Full(pool, accept string, node *store.Record) ([]byte, error) {
	if c.R == nil {
		return nil, ErrNotSynced
	}
	b, err := c.R.Full(pool, accept, node)
	return b, notYet(pool, err)
}

// FullParts implements mcs.PartsConfigs.
func (c Configs) FullParts(pool, accept string, node *store.Record) ([][]byte, error) {
	if c.R == nil {
		return nil, ErrNotSynced
	}
	parts, err := c.R.FullParts(pool, accept, node)
	return parts, notYet(pool, err)
}

func notYet(pool string, err error) error {
	if errors.Is(err, mcs.ErrUnknownPool) {
		return fmt.Errorf("%w: %q", ErrNoSuchPool, pool)
	}
	return err
}
