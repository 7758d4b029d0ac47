package render

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
)

// Tier is what a Renderer serves a pool: its content, not how the server
// authorised the request.
type Tier int

const (
	// TierPublic: the pool's MachineConfigs marked
	// NeededBeforeNodeApprovedAnnotation, merged, plus Options.PublicExtra.
	// No kubeconfig, no appended MCS file, no unmarked MachineConfig.
	TierPublic Tier = iota + 1
	// TierFull: exactly what the OpenShift MCS serves for the pool.
	TierFull
)

func (t Tier) String() string {
	switch t {
	case TierPublic:
		return "public"
	case TierFull:
		return "full"
	}
	return fmt.Sprintf("Tier(%d)", int(t))
}

// ErrUnknownPool: there is no MachineConfigPool of that name.
var ErrUnknownPool = errors.New("unknown pool")

// RegistryCA is an image registry CA the bootstrap MCS appends (its
// --cert host=file flags) at /etc/docker/certs.d/<Host>/ca.crt.
type RegistryCA struct {
	Host string
	PEM  []byte
}

// Options say what a Renderer adds to the inputs. Each field names the
// tier it reaches.
type Options struct {
	// BootstrapKubeconfig goes to /etc/kubernetes/kubeconfig in the full
	// tier served by Config (directory mode: read from a flag). It lets a
	// machine ask for a kubelet client certificate: full tier only, never
	// public. Empty: Config(…, TierFull, …) fails with ErrNoKubeconfig;
	// FullWithKubeconfig still works.
	BootstrapKubeconfig []byte
	// PublicExtra is an Ignition 3.x config (JSON) merged last into every
	// pool's public tier: the server's agent unit and CA bundle. It is
	// checked against ForbiddenPublicPaths like a marked MachineConfig.
	// Not added to the full tier, which stays exactly the MCS's.
	PublicExtra []byte
	// RegistryCAs are appended to the full tier before the encapsulated
	// MachineConfig, as the bootstrap MCS's --cert flags are. The in-cluster
	// MCS has none.
	RegistryCAs []RegistryCA
}

// Renderer turns Inputs into served Ignition bytes. It is immutable: build
// a new one when the inputs change. Every (pool, tier, version) is
// rendered at most once, on first use, and the bytes are kept; concurrent
// callers wait for that one render. Returned slices are shared: callers
// must not modify them.
type Renderer struct {
	in          *Inputs
	opts        Options
	placeholder string // kubeconfig stand-in for splicing, random per Renderer
	pools       map[string]*poolState
	renders     atomic.Int64 // entries rendered, for tests
}

type poolState struct {
	pool *mcfgv1.MachineConfigPool
	// missing: what the pool's configs need but the inputs lack (Missing).
	missing []string
	// rendered: the served MachineConfig and its parsed config.
	rendered func() (renderedMC, error)
	// full[v]: the full tier rendered with the placeholder kubeconfig, cut
	// around it; fullBytes[v]: spliced with Options.BootstrapKubeconfig.
	full      [V3_5 + 1]func() (splice, error)
	fullBytes [V3_5 + 1]func() ([]byte, error)
	// public: the merged public config; publicBytes[v]: serialised.
	public      func() (Config, error)
	publicBytes [V3_5 + 1]func() ([]byte, error)
}

type renderedMC struct {
	name string
	mc   *mcfgv1.MachineConfig
	cfg  Config
}

// splice is a full-tier config cut around the JSON string of the
// kubeconfig's data URL: prefix + "data:,<escaped kubeconfig>" + suffix.
type splice struct {
	prefix, suffix []byte
}

// NewRenderer prepares a Renderer; nothing is rendered until asked for
// (see Prerender). opts.PublicExtra is parsed and checked here, so a bad
// fragment (ErrParse) or one writing a secret (ErrSecretInPublicTier)
// fails early.
func NewRenderer(in *Inputs, opts Options) (*Renderer, error) {
	if in == nil {
		return nil, fmt.Errorf("%w: nil Inputs", ErrInputs)
	}
	if len(opts.PublicExtra) > 0 {
		extra, err := ParseConfig(opts.PublicExtra)
		if err != nil {
			return nil, fmt.Errorf("public extra: %w", err)
		}
		if err := checkPublic(extra); err != nil {
			return nil, fmt.Errorf("%w: public extra %v", ErrSecretInPublicTier, err)
		}
	}
	var nonce [16]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	r := &Renderer{
		in:          in,
		opts:        cloneOptions(opts),
		placeholder: "nodeproof-kubeconfig-placeholder-" + hex.EncodeToString(nonce[:]),
		pools:       make(map[string]*poolState, len(in.pools)),
	}
	for name, p := range in.pools {
		r.pools[name] = r.newPoolState(p)
	}
	return r, nil
}

func cloneOptions(o Options) Options {
	o.BootstrapKubeconfig = bytes.Clone(o.BootstrapKubeconfig)
	o.PublicExtra = bytes.Clone(o.PublicExtra)
	cas := make([]RegistryCA, len(o.RegistryCAs))
	for i, ca := range o.RegistryCAs {
		cas[i] = RegistryCA{Host: ca.Host, PEM: bytes.Clone(ca.PEM)}
	}
	o.RegistryCAs = cas
	return o
}

func (r *Renderer) newPoolState(p *mcfgv1.MachineConfigPool) *poolState {
	ps := &poolState{pool: p, missing: missing(r.in, p)}
	ps.rendered = sync.OnceValues(func() (renderedMC, error) {
		name, _ := servedConfigName(p)
		if name == "" {
			return renderedMC{}, fmt.Errorf("%w: pool %s names no rendered config", ErrNoRenderedConfig, p.Name)
		}
		mc, ok := r.in.configs[name]
		if !ok {
			return renderedMC{}, fmt.Errorf("%w: pool %s: MachineConfig %s", ErrNoRenderedConfig, p.Name, name)
		}
		cfg, err := ParseConfig(mc.Spec.Config.Raw)
		if err != nil {
			return renderedMC{}, fmt.Errorf("pool %s: MachineConfig %s: %w", p.Name, name, err)
		}
		return renderedMC{name: name, mc: mc, cfg: cfg}, nil
	})
	ps.public = sync.OnceValues(func() (Config, error) {
		sources, err := publicSources(r.in, p)
		if err != nil {
			return Config{}, err
		}
		return buildPublic(p.Name, sources, r.opts.PublicExtra)
	})
	for _, v := range SupportedVersions() {
		ps.full[v] = sync.OnceValues(func() (splice, error) {
			r.renders.Add(1)
			return r.renderFullSplice(ps, v)
		})
		ps.fullBytes[v] = sync.OnceValues(func() ([]byte, error) {
			if len(r.opts.BootstrapKubeconfig) == 0 {
				return nil, fmt.Errorf("%w: pool %s", ErrNoKubeconfig, p.Name)
			}
			return r.FullWithKubeconfig(p.Name, v, r.opts.BootstrapKubeconfig)
		})
		ps.publicBytes[v] = sync.OnceValues(func() ([]byte, error) {
			r.renders.Add(1)
			cfg, err := ps.public()
			if err != nil {
				return nil, err
			}
			return Translate(cfg, v)
		})
	}
	return ps
}

// Pools lists the pools, sorted.
func (r *Renderer) Pools() []string {
	names := make([]string, 0, len(r.pools))
	for n := range r.pools {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// RenderedConfigName is the rendered MachineConfig the full tier of pool
// is built from (see the package documentation for which one).
func (r *Renderer) RenderedConfigName(pool string) (string, error) {
	ps, ok := r.pools[pool]
	if !ok {
		return "", fmt.Errorf("%w: %q", ErrUnknownPool, pool)
	}
	name, _ := servedConfigName(ps.pool)
	return name, nil
}

// Config returns the bytes served for pool at tier in spec version v.
// Errors: ErrUnknownPool; ErrTranslate (the config cannot be expressed in
// v); ErrSecretInPublicTier; ErrNoRenderedConfig, ErrNoControllerConfig,
// ErrNoKubeconfig, ErrParse (the inputs cannot be served). The returned
// slice is shared and must not be modified.
func (r *Renderer) Config(pool string, tier Tier, v Version) ([]byte, error) {
	ps, ok := r.pools[pool]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPool, pool)
	}
	if !v.Valid() {
		return nil, fmt.Errorf("%w: %s", ErrUnsupportedVersion, v)
	}
	switch tier {
	case TierPublic:
		return ps.publicBytes[v]()
	case TierFull:
		return ps.fullBytes[v]()
	}
	return nil, fmt.Errorf("unknown tier %s", tier)
}

// FullWithKubeconfig returns the full tier of pool in spec v with
// kubeconfig at /etc/kubernetes/kubeconfig instead of
// Options.BootstrapKubeconfig — for cluster mode, where every node gets its
// own kubeconfig with a short-lived bootstrap token.
//
// It does not re-render: the full tier is rendered once per version with a
// random 128-bit placeholder as the kubeconfig, and the output cut around
// the placeholder's JSON-encoded data URL, which must occur exactly once
// (else this falls back to a full render). A call then encodes only the
// kubeconfig (the same data-URL escaping and JSON string encoding a render
// uses) and concatenates prefix, kubeconfig and suffix: one allocation and
// copy of the config's size, and the result is byte-for-byte what a full
// render with that kubeconfig produces (tested for every version). Nothing
// from the kubeconfig is kept. The returned slice is the caller's.
func (r *Renderer) FullWithKubeconfig(pool string, v Version, kubeconfig []byte) ([]byte, error) {
	parts, err := r.FullWithKubeconfigParts(pool, v, kubeconfig)
	if err != nil {
		return nil, err
	}
	return bytes.Join(parts, nil), nil
}

// FullWithKubeconfigParts is FullWithKubeconfig in pieces whose
// concatenation is the config: the cached prefix and suffix (shared by
// every request: the caller must not modify them) around the encoded
// kubeconfig, so a server writes a per-node config without copying the
// whole of it (a rendered config is a megabyte; a thousand machines fetch
// at once).
func (r *Renderer) FullWithKubeconfigParts(pool string, v Version, kubeconfig []byte) ([][]byte, error) {
	ps, ok := r.pools[pool]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPool, pool)
	}
	if !v.Valid() {
		return nil, fmt.Errorf("%w: %s", ErrUnsupportedVersion, v)
	}
	if len(kubeconfig) == 0 {
		return nil, fmt.Errorf("%w: pool %s", ErrNoKubeconfig, pool)
	}
	s, err := ps.full[v]()
	if err != nil {
		return nil, err
	}
	if s.prefix == nil {
		b, err := r.renderFull(ps, v, kubeconfig)
		return [][]byte{b}, err
	}
	enc, err := json.Marshal(dataURL(kubeconfig))
	if err != nil {
		return nil, err
	}
	return [][]byte{s.prefix, enc, s.suffix}, nil
}

// renderFull renders the full tier of a pool with a given kubeconfig.
func (r *Renderer) renderFull(ps *poolState, v Version, kubeconfig []byte) ([]byte, error) {
	rm, err := ps.rendered()
	if err != nil {
		return nil, err
	}
	if r.in.cc == nil {
		return nil, fmt.Errorf("%w: pool %s", ErrNoControllerConfig, ps.pool.Name)
	}
	cfg, err := buildFull(fullParams{
		configName:  rm.name,
		mc:          rm.mc,
		cfg:         rm.cfg,
		cc:          r.in.cc,
		kubeconfig:  kubeconfig,
		registryCAs: r.opts.RegistryCAs,
		version:     v,
	})
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", ps.pool.Name, err)
	}
	out, err := Translate(cfg, v)
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", ps.pool.Name, err)
	}
	return out, nil
}

// renderFullSplice renders with the placeholder kubeconfig and cuts the
// output around it. A zero splice (placeholder not found exactly once)
// makes FullWithKubeconfig render each time instead.
func (r *Renderer) renderFullSplice(ps *poolState, v Version) (splice, error) {
	out, err := r.renderFull(ps, v, []byte(r.placeholder))
	if err != nil {
		return splice{}, err
	}
	needle, err := json.Marshal(dataURL([]byte(r.placeholder)))
	if err != nil {
		return splice{}, err
	}
	if bytes.Count(out, needle) != 1 {
		return splice{}, nil
	}
	i := bytes.Index(out, needle)
	return splice{prefix: out[:i:i], suffix: out[i+len(needle):]}, nil
}

// Missing lists what pool's configs are built from but the inputs lack,
// sorted: the rendered MachineConfig the pool is served (or a note that
// the pool names none yet), every MachineConfig in that rendered config's
// source list, and the ControllerConfig. Empty: the inputs are complete
// for pool. In a cluster the objects arrive on separate watch streams, so
// a pool can be seen before the MachineConfigs it lists: a public tier
// built then would lack their files, and a machine that got a 200 would
// never ask again (mcs/cluster serves only complete pools).
// ErrUnknownPool for a pool not in the inputs.
func (r *Renderer) Missing(pool string) ([]string, error) {
	ps, ok := r.pools[pool]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPool, pool)
	}
	return ps.missing, nil
}

// missing computes poolState.missing.
func missing(in *Inputs, p *mcfgv1.MachineConfigPool) []string {
	var out []string
	name, source := servedConfigName(p)
	switch {
	case name == "":
		out = append(out, "MachineConfigPool "+p.Name+" names no rendered config yet")
	case in.configs[name] == nil:
		out = append(out, "MachineConfig "+name)
	}
	for _, s := range source {
		if in.configs[s] == nil {
			out = append(out, "MachineConfig "+s)
		}
	}
	if in.cc == nil {
		out = append(out, "ControllerConfig")
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// Prerender renders every tier × version of pools (no pools: all) now, so
// that the first requests do not wait and broken inputs show at once. It
// returns every failure, joined; a version a pool's config cannot be
// expressed in (ErrTranslate) is among them but does not stop the others.
func (r *Renderer) Prerender(pools ...string) error {
	if len(pools) == 0 {
		pools = r.Pools()
	}
	var errs []error
	for _, pool := range pools {
		if _, ok := r.pools[pool]; !ok {
			errs = append(errs, fmt.Errorf("%w: %q", ErrUnknownPool, pool))
			continue
		}
		for _, tier := range []Tier{TierPublic, TierFull} {
			for _, v := range SupportedVersions() {
				if tier == TierFull && len(r.opts.BootstrapKubeconfig) == 0 {
					if _, err := r.pools[pool].full[v](); err != nil {
						errs = append(errs, fmt.Errorf("%s/%s/%s: %w", pool, tier, v, err))
					}
					continue
				}
				if _, err := r.Config(pool, tier, v); err != nil {
					errs = append(errs, fmt.Errorf("%s/%s/%s: %w", pool, tier, v, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}
