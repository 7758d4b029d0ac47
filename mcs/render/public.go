package render

import (
	"errors"
	"fmt"
	"path"
	"sort"

	ign35 "github.com/coreos/ignition/v2/config/v3_5"
	"github.com/coreos/ignition/v2/config/validate"
	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// NeededBeforeNodeApprovedAnnotation marks a MachineConfig as safe to
// serve without credentials, before the node is approved: the public tier
// of a pool is the merge of exactly those of its source MachineConfigs
// that carry this annotation with the value "true" (any other value, or
// none, keeps it out). It is the per-MachineConfig switch the "Securing
// the Machine Config Server" enhancement proposed as the field
// neededBeforeNodeApproved; as an annotation it needs no change to the
// MachineConfig CRD, and like that field it defaults to false, so nothing
// is public unless an administrator says so. Mark only what a new machine
// needs before it can attest (e.g. SSH keys for debugging, chrony, network
// setup) and nothing secret: the public tier refuses to build if a marked
// MachineConfig writes a path in ForbiddenPublicPaths.
const NeededBeforeNodeApprovedAnnotation = "nodeproof.io/needed-before-node-approved"

// ErrSecretInPublicTier: a MachineConfig marked needed-before-node-approved
// (or Options.PublicExtra) writes a file that holds a secret. The public
// tier of that pool is not served at all rather than served without it:
// the marking is wrong and someone must look.
var ErrSecretInPublicTier = errors.New("a secret would be served in the public tier")

// ForbiddenPublicPaths are the files the public tier refuses to contain:
// the bootstrap kubeconfig, the pull secret, and the files through which
// the MCS hands out the whole config.
func ForbiddenPublicPaths() []string {
	return []string{
		KubeconfigPath,
		PullSecretPath,
		MachineConfigContentPath,
		EncapsulatedPath,
		NodeAnnotationsPath,
	}
}

func forbiddenPublicPath(p string) bool {
	p = path.Clean(p)
	for _, f := range ForbiddenPublicPaths() {
		if p == f {
			return true
		}
	}
	return false
}

// publicSources are the MachineConfigs of a pool's public tier, sorted by
// name: those that (a) the pool's machineConfigSelector matches — a nil or
// empty selector matches nothing, as in the MCO's render controller; (b)
// are in the source list of the rendered config the pool is served, when
// that list is not empty (the MCO bootstrap lists every MachineConfig
// there, hence (a)); (c) are not themselves rendered (owned by a pool);
// (d) carry NeededBeforeNodeApprovedAnnotation: "true".
func publicSources(in *Inputs, p *mcfgv1.MachineConfigPool) ([]*mcfgv1.MachineConfig, error) {
	if p.Spec.MachineConfigSelector == nil {
		return nil, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.MachineConfigSelector)
	if err != nil {
		return nil, fmt.Errorf("pool %s: machineConfigSelector: %w", p.Name, err)
	}
	if sel.Empty() {
		return nil, nil
	}
	_, source := servedConfigName(p)
	inSource := make(map[string]bool, len(source))
	for _, n := range source {
		inSource[n] = true
	}
	var out []*mcfgv1.MachineConfig
	for _, mc := range in.configs {
		if mc.Annotations[NeededBeforeNodeApprovedAnnotation] != "true" {
			continue
		}
		if !sel.Matches(labels.Set(mc.Labels)) {
			continue
		}
		if len(inSource) > 0 && !inSource[mc.Name] {
			continue
		}
		if ownedByPool(mc) {
			continue
		}
		out = append(out, mc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func ownedByPool(mc *mcfgv1.MachineConfig) bool {
	for _, o := range mc.OwnerReferences {
		if o.Kind == "MachineConfigPool" {
			return true
		}
	}
	return false
}

// buildPublic merges the public sources in name order with Ignition's
// merge, defaults overwrite to true on files that do not set it (as the
// MCO's MergeMachineConfigs does, so a file behaves as in the full tier),
// then merges extra (Options.PublicExtra) on top. Every source and extra
// is checked against ForbiddenPublicPaths first.
func buildPublic(pool string, sources []*mcfgv1.MachineConfig, extra []byte) (Config, error) {
	out := Config{}
	out.Ignition.Version = Newest.String()
	for _, mc := range sources {
		if len(mc.Spec.Config.Raw) == 0 {
			continue
		}
		cfg, err := ParseConfig(mc.Spec.Config.Raw)
		if err != nil {
			return Config{}, fmt.Errorf("MachineConfig %s: %w", mc.Name, err)
		}
		if err := checkPublic(cfg); err != nil {
			return Config{}, fmt.Errorf("%w: pool %s: MachineConfig %s is marked %s but %v", ErrSecretInPublicTier, pool, mc.Name, NeededBeforeNodeApprovedAnnotation, err)
		}
		out = ign35.Merge(out, cfg)
	}
	overwrite := true
	for i := range out.Storage.Files {
		if out.Storage.Files[i].Overwrite == nil {
			out.Storage.Files[i].Overwrite = &overwrite
		}
	}
	if len(extra) > 0 {
		cfg, err := ParseConfig(extra)
		if err != nil {
			return Config{}, fmt.Errorf("public extra: %w", err)
		}
		if err := checkPublic(cfg); err != nil {
			return Config{}, fmt.Errorf("%w: public extra %v", ErrSecretInPublicTier, err)
		}
		out = ign35.Merge(out, cfg)
	}
	if rpt := validate.ValidateWithContext(out, nil); rpt.IsFatal() {
		return Config{}, fmt.Errorf("pool %s: merged public config is invalid: %s", pool, rpt.String())
	}
	return out, nil
}

// checkPublic refuses a config that writes a ForbiddenPublicPaths file.
func checkPublic(cfg Config) error {
	for _, f := range cfg.Storage.Files {
		if forbiddenPublicPath(f.Path) {
			return fmt.Errorf("writes %s", f.Path)
		}
	}
	return nil
}
