package render

import (
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Where a MachineConfig of a pool goes (TierEntry.Place).
const (
	// PlacePublic: served to anyone before the node is approved.
	PlacePublic = "public"
	// PlaceHeld: served only with credentials (an attestation's config
	// token, or the provisioning token), in the full tier.
	PlaceHeld = "held"
	// PlaceRefused: marked public but writes a file the public tier
	// refuses, so the pool's public tier is not served at all.
	PlaceRefused = "refused"
)

// TierEntry says where one MachineConfig of a pool goes, and why.
type TierEntry struct {
	Name  string `json:"name"`
	Place string `json:"place"`
	Why   string `json:"why"`
}

// PoolTiers lists the MachineConfigs of pool — those its
// machineConfigSelector matches, and the rendered config it is served —
// with the tier each lands in and why, by the same rules as the
// public tier is built (publicSources, checkPublic). The rendered config
// itself is the full tier's base: held.
func (in *Inputs) PoolTiers(pool string) ([]TierEntry, error) {
	p, ok := in.pools[pool]
	if !ok {
		return nil, fmt.Errorf("%w: no MachineConfigPool %q", ErrInputs, pool)
	}
	var sel labels.Selector = labels.Nothing()
	if p.Spec.MachineConfigSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(p.Spec.MachineConfigSelector)
		if err != nil {
			return nil, fmt.Errorf("pool %s: machineConfigSelector: %w", p.Name, err)
		}
		if !s.Empty() {
			sel = s
		}
	}
	rendered, source := servedConfigName(p)
	inSource := map[string]bool{}
	for _, n := range source {
		inSource[n] = true
	}
	public, err := publicSources(in, p)
	if err != nil {
		return nil, err
	}
	isPublic := map[string]bool{}
	for _, mc := range public {
		isPublic[mc.Name] = true
	}
	var out []TierEntry
	for _, mc := range in.configs {
		selected := sel.Matches(labels.Set(mc.Labels))
		if !selected && mc.Name != rendered {
			continue // another pool's (the bootstrap lists every MachineConfig as a source)
		}
		marked := mc.Annotations[NeededBeforeNodeApprovedAnnotation] == "true"
		e := TierEntry{Name: mc.Name, Place: PlaceHeld}
		switch {
		case mc.Name == rendered:
			e.Why = "the rendered config the pool is served: the full tier's base"
		case isPublic[mc.Name]:
			e.Place, e.Why = PlacePublic, NeededBeforeNodeApprovedAnnotation+": \"true\""
			if cfg, err := ParseConfig(mc.Spec.Config.Raw); len(mc.Spec.Config.Raw) > 0 && err != nil {
				e.Place, e.Why = PlaceRefused, fmt.Sprintf("marked, but its config does not parse: %v", err)
			} else if err == nil {
				if perr := checkPublic(cfg); perr != nil {
					e.Place, e.Why = PlaceRefused, fmt.Sprintf("marked, but %v, which the public tier never serves: the pool's public tier is refused until it is unmarked", perr)
				}
			}
		case ownedByPool(mc):
			e.Why = "a rendered config (owned by a pool)"
		case marked && len(inSource) > 0 && !inSource[mc.Name]:
			e.Why = "marked, but not in the served rendered config's sources (not rendered yet)"
		default:
			e.Why = "not marked " + NeededBeforeNodeApprovedAnnotation + ": held until the node is approved (the default)"
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
