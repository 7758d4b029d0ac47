package mcs

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/nodeproof/nodeproof/mcs/render"
	"github.com/nodeproof/nodeproof/store"
)

// Rendered serves a render.Renderer's configs.
type Rendered struct {
	R *render.Renderer
	// Kubeconfig, when set, supplies the kubeconfig every full config
	// carries instead of the renderer's bootstrap kubeconfig (cluster mode):
	// rec is the attested node's record (its own bootstrap token), or nil
	// for a full config served to no particular node (the token tier,
	// serve.fullWithoutCredentials). Called per request, so what it reads
	// (a rotated token or CA) is current.
	Kubeconfig func(rec *store.Record) ([]byte, error)
}

var _ PartsConfigs = Rendered{}

// Pools implements Configs.
func (c Rendered) Pools() []string { return c.R.Pools() }

// Public implements Configs.
func (c Rendered) Public(pool, accept string) ([]byte, error) {
	v, err := render.Negotiate(accept)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSpecVersion, err)
	}
	b, err := c.R.Config(pool, render.TierPublic, v)
	return b, mapRenderErr(err)
}

// Full implements Configs.
func (c Rendered) Full(pool, accept string, node *store.Record) ([]byte, error) {
	parts, err := c.FullParts(pool, accept, node)
	if err != nil {
		return nil, err
	}
	return bytes.Join(parts, nil), nil
}

// FullParts implements PartsConfigs: with a per-node kubeconfig, the
// cached bytes around it are shared, not copied.
func (c Rendered) FullParts(pool, accept string, node *store.Record) ([][]byte, error) {
	v, err := render.Negotiate(accept)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSpecVersion, err)
	}
	if c.Kubeconfig != nil {
		kc, err := c.Kubeconfig(node)
		if err != nil {
			return nil, err
		}
		parts, err := c.R.FullWithKubeconfigParts(pool, v, kc)
		return parts, mapRenderErr(err)
	}
	b, err := c.R.Config(pool, render.TierFull, v)
	return [][]byte{b}, mapRenderErr(err)
}

func mapRenderErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, render.ErrUnknownPool):
		return fmt.Errorf("%w: %v", ErrUnknownPool, err)
	case errors.Is(err, render.ErrTranslate):
		// The config cannot be expressed in the spec the client asked for.
		return fmt.Errorf("%w: %v", ErrSpecVersion, err)
	}
	return err
}
