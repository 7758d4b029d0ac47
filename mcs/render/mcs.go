package render

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	t35 "github.com/coreos/ignition/v2/config/v3_5/types"
	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
)

// Paths of the files the MCS appends to the rendered config (MCO
// pkg/server/server.go, cluster-server.go / cluster_server.go,
// pkg/daemon/constants/constants.go). Every appended file has mode 0644
// (420) and overwrite: true, its contents a "data:," URL.
const (
	// KubeconfigPath: the bootstrap kubeconfig the kubelet uses to request
	// its client certificate. Secret: full tier only.
	KubeconfigPath = "/etc/kubernetes/kubeconfig"
	// KubeletCAPath: ControllerConfig spec.kubeAPIServerServingCAData;
	// replaces the contents of the rendered config's file at this path if it
	// has one (the MCO templates do), else appended, and not at all if the
	// data is empty (MCS addDataAndMaybeAppendToIgnition).
	KubeletCAPath = "/etc/kubernetes/kubelet-ca.crt"
	// CloudProviderCAPath: ControllerConfig spec.cloudProviderCAData, same
	// rule as KubeletCAPath.
	CloudProviderCAPath = "/etc/kubernetes/static-pod-resources/configmaps/cloud-config/ca-bundle.pem"
	// NodeAnnotationsPath: the initial node annotations the MCD sets on first
	// boot (daemon constants InitialNodeAnnotationsFilePath).
	NodeAnnotationsPath = "/etc/machine-config-daemon/node-annotations.json"
	// MachineConfigContentPath: the whole served MachineConfig, indented
	// JSON, a debugging aid for bootstrap drift (server.go
	// machineConfigContentPath).
	MachineConfigContentPath = "/etc/mcs-machine-config-content.json"
	// EncapsulatedPath: the served MachineConfig with an empty Ignition
	// config, read by machine-config-daemon-firstboot.service for the
	// non-Ignition fields (osImageURL, kernelArguments, extensions …)
	// (daemon constants MachineConfigEncapsulatedPath). Appended last.
	EncapsulatedPath = "/etc/ignition-machine-config-encapsulated.json"
	// PullSecretPath: the cluster pull secret the MCO templates write
	// (daemon constants KubeletAuthFile). Secret: never in the public tier.
	PullSecretPath = "/var/lib/kubelet/config.json"
	// registryCADir: the bootstrap MCS's --cert host=file flags become
	// /etc/docker/certs.d/<host>/ca.crt (server.go appendCerts).
	registryCADir = "/etc/docker/certs.d"
)

// Node annotation keys and the state value the MCS writes into
// NodeAnnotationsPath (MCO pkg/daemon/constants).
const (
	currentConfigAnnotation = "machineconfiguration.openshift.io/currentConfig"
	desiredConfigAnnotation = "machineconfiguration.openshift.io/desiredConfig"
	// firstPivotAnnotation is what the machine-config-daemon reads on
	// its first boot (the config it pivots to).
	firstPivotAnnotation = "machineconfiguration.openshift.io/firstPivotConfig"
	stateAnnotation      = "machineconfiguration.openshift.io/state"
	stateDone            = "Done"
)

// emptyIgnition is the Ignition config the MCS puts into the encapsulated
// MachineConfig: an empty config of the served major spec (3.x clients get
// 3.5.0, the MCO's internal version; 2.2 clients get 2.2.0, so that old
// RHCOS MCDs can parse it). These are the exact bytes the MCS produces
// (clarketm/json omits the empty sections).
var emptyIgnition = map[int][]byte{
	2: []byte(`{"ignition":{"version":"2.2.0"}}`),
	3: []byte(`{"ignition":{"version":"` + t35.MaxVersion.String() + `"}}`),
}

// Errors of the full tier.
var (
	// ErrNoRenderedConfig: the pool names no rendered MachineConfig, or the
	// one it names is not among the inputs. The bootstrap MCS answers 404,
	// the in-cluster one 500.
	ErrNoRenderedConfig = errors.New("pool's rendered MachineConfig is missing")
	// ErrNoControllerConfig: the full tier needs the ControllerConfig (the
	// MCS refuses to serve without it).
	ErrNoControllerConfig = errors.New("no ControllerConfig")
	// ErrNoKubeconfig: the full tier was asked for without a bootstrap
	// kubeconfig to put in it.
	ErrNoKubeconfig = errors.New("no bootstrap kubeconfig for the full tier")
)

// servedConfigName is the rendered MachineConfig the MCS serves a pool:
// spec.configuration.name once at least one machine of the pool runs it
// (status.updatedMachineCount > 0), else status.configuration.name — new
// nodes get the newest config that is known to work (cluster-server.go).
// The bootstrap MCS reads status.configuration.name; the MCO's bootstrap
// writes spec and status alike, so both rules agree there. An empty
// choice falls back to the other field, for hand-written inputs that set
// only one.
func servedConfigName(p *mcfgv1.MachineConfigPool) (name string, source []string) {
	spec, status := p.Spec.Configuration, p.Status.Configuration
	pick := status
	if p.Status.UpdatedMachineCount > 0 || pick.Name == "" {
		pick = spec
	}
	if pick.Name == "" {
		pick = status
	}
	for _, ref := range pick.Source {
		source = append(source, ref.Name)
	}
	return pick.Name, source
}

// fullParams are what the full tier is built from, besides the pool.
type fullParams struct {
	configName  string
	mc          *mcfgv1.MachineConfig // the rendered MachineConfig, not modified
	cfg         Config                // its parsed spec.config, not modified
	cc          *mcfgv1.ControllerConfig
	kubeconfig  []byte
	registryCAs []RegistryCA
	version     Version
}

// buildFull assembles what the MCS serves for a pool, in its order (MCO
// pkg/server cluster-server.go GetConfig and server.go getAppenders):
//
//  1. the rendered config, parsed and translated to spec 3.5;
//  2. for a client older than spec 3.3, Ignition kernelArguments move into
//     the MachineConfig's spec.kernelArguments (shouldNotExist cannot move:
//     error) — MigrateKernelArgsIfNecessary;
//  3. KubeletCAPath and CloudProviderCAPath from the ControllerConfig;
//  4. NodeAnnotationsPath: {"…/currentConfig":name,"…/desiredConfig":name,
//     "…/firstPivotConfig":name,"…/state":"Done"} (the MCS's getNodeAnnotation);
//  5. KubeconfigPath: the bootstrap kubeconfig;
//  6. MachineConfigContentPath: the MachineConfig as indented JSON;
//  7. registry CAs (bootstrap MCS --cert flags), if any;
//  8. EncapsulatedPath: the MachineConfig with spec.config replaced by an
//     empty config of the served major version.
func buildFull(p fullParams) (Config, error) {
	cfg := p.cfg
	// Appending must not touch the shared parsed config's backing array.
	cfg.Storage.Files = slices.Clone(cfg.Storage.Files)
	mc := p.mc.DeepCopy()

	if p.version < V3_3 {
		if len(cfg.KernelArguments.ShouldNotExist) > 0 {
			return Config{}, fmt.Errorf("%w (%s): kernelArguments.shouldNotExist cannot be served below spec 3.3", ErrTranslate, p.version)
		}
		for _, ka := range cfg.KernelArguments.ShouldExist {
			mc.Spec.KernelArguments = append(mc.Spec.KernelArguments, string(ka))
		}
		cfg.KernelArguments = t35.KernelArguments{}
	}

	replaceOrAppend(&cfg, KubeletCAPath, p.cc.Spec.KubeAPIServerServingCAData)
	replaceOrAppend(&cfg, CloudProviderCAPath, p.cc.Spec.CloudProviderCAData)

	anno, err := json.Marshal(map[string]string{
		currentConfigAnnotation: p.configName,
		desiredConfigAnnotation: p.configName,
		firstPivotAnnotation:    p.configName,
		stateAnnotation:         stateDone,
	})
	if err != nil {
		return Config{}, err
	}
	appendFile(&cfg, NodeAnnotationsPath, anno)
	appendFile(&cfg, KubeconfigPath, p.kubeconfig)

	content, err := json.MarshalIndent(mc, "", "    ")
	if err != nil {
		return Config{}, fmt.Errorf("marshal MachineConfig %s: %w", mc.Name, err)
	}
	appendFile(&cfg, MachineConfigContentPath, content)

	for _, ca := range p.registryCAs {
		appendFile(&cfg, path.Join(registryCADir, ca.Host, "ca.crt"), ca.PEM)
	}

	enc := mc.DeepCopy()
	enc.Spec.Config.Raw = emptyIgnition[p.version.major()]
	encapsulated, err := json.Marshal(enc)
	if err != nil {
		return Config{}, fmt.Errorf("marshal encapsulated MachineConfig %s: %w", mc.Name, err)
	}
	appendFile(&cfg, EncapsulatedPath, encapsulated)
	return cfg, nil
}

// replaceOrAppend is the MCS's addDataAndMaybeAppendToIgnition: if the
// config has a file at p, its contents source is replaced (when data is
// not empty; nothing else of the entry changes); if it has none, a file is
// appended (when data is not empty).
func replaceOrAppend(cfg *Config, p string, data []byte) {
	for i := range cfg.Storage.Files {
		if cfg.Storage.Files[i].Path == p {
			if len(data) > 0 {
				src := dataURL(data)
				cfg.Storage.Files[i].Contents.Source = &src
			}
			return
		}
	}
	if len(data) > 0 {
		appendFile(cfg, p, data)
	}
}

// appendFile is the MCS's appendFileToIgnition: mode 0644, overwrite true,
// contents as a data URL.
func appendFile(cfg *Config, p string, contents []byte) {
	mode := 0o644
	overwrite := true
	src := dataURL(contents)
	cfg.Storage.Files = append(cfg.Storage.Files, t35.File{
		Node:          t35.Node{Path: p, Overwrite: &overwrite},
		FileEmbedded1: t35.FileEmbedded1{Contents: t35.Resource{Source: &src}, Mode: &mode},
	})
}

// dataURL encodes contents as the MCS does: "data:," followed by the bytes
// with everything but RFC 2396 unreserved characters percent-encoded
// (upper-case hex) — github.com/vincent-petithory/dataurl.Escape, without
// its per-byte fmt.Fprintf (the content file of a large pool is megabytes).
func dataURL(contents []byte) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len("data:,") + len(contents) + len(contents)/2)
	b.WriteString("data:,")
	for _, c := range contents {
		if unreserved(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xf])
	}
	return b.String()
}

func unreserved(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-_.!~*'()", c) >= 0
}
