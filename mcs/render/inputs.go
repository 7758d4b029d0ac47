package render

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	"sigs.k8s.io/yaml"
)

// ErrInputs: the MachineConfigPools, MachineConfigs or ControllerConfig
// handed to NewInputs or found by LoadBootstrapDir are malformed
// (duplicate or missing names, wrong kind, undecodable file).
var ErrInputs = errors.New("invalid render inputs")

// apiVersion is the API group/version of every input object.
const apiVersion = "machineconfiguration.openshift.io/v1"

// Inputs are the objects a Renderer is built from: MachineConfigPools,
// MachineConfigs (the pools' sources and the rendered ones) and the
// ControllerConfig. Immutable once built: NewInputs deep-copies what it is
// given, so informer caches can be passed in directly.
type Inputs struct {
	pools   map[string]*mcfgv1.MachineConfigPool
	configs map[string]*mcfgv1.MachineConfig
	cc      *mcfgv1.ControllerConfig
}

// NewInputs builds Inputs from objects, e.g. the contents of informer
// caches in cluster mode. Every object must have a name, names must be
// unique per kind; nil entries are an error. controllerConfig may be nil:
// then only the public tier can be served (the full tier needs the kubelet
// CA from it, as the MCS does).
func NewInputs(pools []*mcfgv1.MachineConfigPool, configs []*mcfgv1.MachineConfig, controllerConfig *mcfgv1.ControllerConfig) (*Inputs, error) {
	in := &Inputs{
		pools:   make(map[string]*mcfgv1.MachineConfigPool, len(pools)),
		configs: make(map[string]*mcfgv1.MachineConfig, len(configs)),
	}
	for i, p := range pools {
		if p == nil || p.Name == "" {
			return nil, fmt.Errorf("%w: MachineConfigPool #%d has no name", ErrInputs, i)
		}
		if _, dup := in.pools[p.Name]; dup {
			return nil, fmt.Errorf("%w: duplicate MachineConfigPool %q", ErrInputs, p.Name)
		}
		in.pools[p.Name] = p.DeepCopy()
	}
	for i, c := range configs {
		if c == nil || c.Name == "" {
			return nil, fmt.Errorf("%w: MachineConfig #%d has no name", ErrInputs, i)
		}
		if _, dup := in.configs[c.Name]; dup {
			return nil, fmt.Errorf("%w: duplicate MachineConfig %q", ErrInputs, c.Name)
		}
		in.configs[c.Name] = c.DeepCopy()
	}
	if controllerConfig != nil {
		in.cc = controllerConfig.DeepCopy()
	}
	return in, nil
}

// PoolNames lists the pools, sorted.
func (in *Inputs) PoolNames() []string {
	names := make([]string, 0, len(in.pools))
	for n := range in.pools {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ControllerConfigFile is the file LoadBootstrapDir reads the
// ControllerConfig from, as the bootstrap MCS does.
const ControllerConfigFile = "machine-config-controller.yaml"

// LoadBootstrapDir reads the directory layout the MCO bootstrap writes and
// the bootstrap MCS serves from:
//
//	<dir>/machine-pools/<pool>.yaml       MachineConfigPool named <pool>
//	<dir>/machine-configs/<name>.yaml     MachineConfig named <name>: the
//	                                      sources and the rendered-<pool>-<hash>
//	                                      ones the pools name
//	<dir>/controller-config/machine-config-controller.yaml
//	                                      the ControllerConfig (if that file
//	                                      is absent, the directory's only
//	                                      .yaml file)
//
// Files not ending in .yaml are ignored. Decoding is strict about syntax
// (duplicate keys are an error: they could hide a value) and about
// identity (apiVersion and kind, when present, must be
// machineconfiguration.openshift.io/v1 and the expected kind; metadata.name
// must equal the file name, which is how the MCS looks objects up), and
// lenient about unknown fields, which newer MCOs add.
func LoadBootstrapDir(dir string) (*Inputs, error) {
	var pools []*mcfgv1.MachineConfigPool
	err := eachYAML(filepath.Join(dir, "machine-pools"), func(path, base string, data []byte) error {
		p := new(mcfgv1.MachineConfigPool)
		if err := decodeObject(data, "MachineConfigPool", base, p, &p.ObjectMeta.Name); err != nil {
			return err
		}
		pools = append(pools, p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	var configs []*mcfgv1.MachineConfig
	err = eachYAML(filepath.Join(dir, "machine-configs"), func(path, base string, data []byte) error {
		c := new(mcfgv1.MachineConfig)
		if err := decodeObject(data, "MachineConfig", base, c, &c.ObjectMeta.Name); err != nil {
			return err
		}
		configs = append(configs, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	cc, err := loadControllerConfig(filepath.Join(dir, "controller-config"))
	if err != nil {
		return nil, err
	}
	return NewInputs(pools, configs, cc)
}

func loadControllerConfig(dir string) (*mcfgv1.ControllerConfig, error) {
	file := filepath.Join(dir, ControllerConfigFile)
	if _, err := os.Stat(file); err != nil {
		var found []string
		_ = eachYAML(dir, func(path, _ string, _ []byte) error {
			found = append(found, path)
			return nil
		})
		if len(found) != 1 {
			return nil, fmt.Errorf("%w: %s: want %s or exactly one .yaml file, found %d", ErrInputs, dir, ControllerConfigFile, len(found))
		}
		file = found[0]
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInputs, err)
	}
	cc := new(mcfgv1.ControllerConfig)
	// The ControllerConfig's name is not tied to its file name.
	if err := decodeObject(data, "ControllerConfig", "", cc, &cc.ObjectMeta.Name); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return cc, nil
}

// eachYAML calls fn for every regular *.yaml file in dir, in name order.
func eachYAML(dir string, fn func(path, base string, data []byte) error) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInputs, err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrInputs, err)
		}
		if err := fn(path, strings.TrimSuffix(e.Name(), ".yaml"), data); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	return nil
}

// typeMeta is what decodeObject checks before decoding into the real type.
type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// decodeObject decodes one YAML object into obj: duplicate keys rejected,
// apiVersion/kind checked when present, metadata.name required and, when
// wantName is set, equal to it. Unknown fields are tolerated.
func decodeObject(data []byte, kind, wantName string, obj any, name *string) error {
	if multiDocument(data) {
		return fmt.Errorf("%w: more than one YAML document", ErrInputs)
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInputs, err)
	}
	var meta typeMeta
	if err := json.Unmarshal(j, &meta); err != nil {
		return fmt.Errorf("%w: %v", ErrInputs, err)
	}
	if meta.APIVersion != "" && meta.APIVersion != apiVersion {
		return fmt.Errorf("%w: apiVersion %q, want %q", ErrInputs, meta.APIVersion, apiVersion)
	}
	if meta.Kind != "" && meta.Kind != kind {
		return fmt.Errorf("%w: kind %q, want %q", ErrInputs, meta.Kind, kind)
	}
	if err := json.Unmarshal(j, obj); err != nil {
		return fmt.Errorf("%w: %v", ErrInputs, err)
	}
	if *name == "" {
		return fmt.Errorf("%w: %s has no metadata.name", ErrInputs, kind)
	}
	if wantName != "" && *name != wantName {
		return fmt.Errorf("%w: %s is named %q but its file says %q", ErrInputs, kind, *name, wantName)
	}
	return nil
}

// multiDocument reports whether data has a YAML document separator after
// some content: only the first document would be decoded, so a second one
// could hide objects.
func multiDocument(data []byte) bool {
	seen := false
	for _, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimRight(line, "\r")
		if bytes.Equal(line, []byte("---")) || bytes.HasPrefix(line, []byte("--- ")) {
			if seen {
				return true
			}
			continue
		}
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			seen = true
		}
	}
	return false
}
