package render

import (
	"bytes"
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	ign35 "github.com/coreos/ignition/v2/config/v3_5"
	"sigs.k8s.io/yaml"
)

// The example MCO bootstrap directory (deploy/examples/bootstrap) is
// generated from the definitions below, so that its rendered
// MachineConfigs really are the MCO-style merge of their sources. Run
//
//	go test ./mcs/render -run TestExamplesUpToDate -update-examples
//
// after changing them; without the flag the test fails if the files on
// disk differ from what the definitions generate.
var updateExamples = flag.Bool("update-examples", false, "rewrite deploy/examples from examples_test.go")

const (
	examplesDir       = "../../deploy/examples"
	exampleBootstrap  = examplesDir + "/bootstrap"
	exampleKubeconfig = examplesDir + "/bootstrap-kubeconfig"
	exampleMCOVersion = "4.20.0-0.nodeproof-example"
	exampleOSImage    = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:7a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"
)

// exampleKubeletCA is ControllerConfig spec.kubeAPIServerServingCAData.
const exampleKubeletCA = `-----BEGIN CERTIFICATE-----
MIIB1DCCAXmgAwIBAgIUKcPc5YhYAE8CGsN+vdewKyE1S20wCgYIKoZIzj0EAwIw
PzESMBAGA1UECwwJb3BlbnNoaWZ0MSkwJwYDVQQDDCBrdWJlLWFwaXNlcnZlci10
by1rdWJlbGV0LXNpZ25lcjAeFw0yNjExMjIwMTIwMDVaFw0zNjExMTkwMTIwMDVa
MD8xEjAQBgNVBAsMCW9wZW5zaGlmdDEpMCcGA1UEAwwga3ViZS1hcGlzZXJ2ZXIt
dG8ta3ViZWxldC1zaWduZXIwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAASz1Gor
ycrPg5keMkxg/MAxKjhKLYXwxjotNxeCARqev+s1vQt17e3pq1/11kP6yBauOVS2
7zNeWB1x0C5XxdVZo1MwUTAdBgNVHQ4EFgQUe5idiHVLRq5ZlKW4WDbvA6qq27Uw
HwYDVR0jBBgwFoAUe5idiHVLRq5ZlKW4WDbvA6qq27UwDwYDVR0TAQH/BAUwAwEB
/zAKBggqhkjOPQQDAgNJADBGAiEA3AGNseRG+NxcnQMXW9M56HV+3/TiZvp/D/T4
JO6ER1YCIQDLwIR1VLzU245HkS319w8XOWNnTEGgXbnKCGTHXHyg7Q==
-----END CERTIFICATE-----
`

// exampleRootCA is ControllerConfig spec.rootCAData (and the CA of the
// bootstrap kubeconfig).
const exampleRootCA = `-----BEGIN CERTIFICATE-----
MIIBoTCCAUegAwIBAgIUCqk69ZVUcvjv+q7VZGYY+F8EFz0wCgYIKoZIzj0EAwIw
JjESMBAGA1UECwwJb3BlbnNoaWZ0MRAwDgYDVQQDDAdyb290LWNhMB4XDTI2MTEy
MjAxMjAwNVoXDTM2MTExOTAxMjAwNVowJjESMBAGA1UECwwJb3BlbnNoaWZ0MRAw
DgYDVQQDDAdyb290LWNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE+6o3Xvq9
pw+D6hILmuWD3u60Ly34s3tlg7BmOXwvWvQNco7ji+iRTi8O/Lo0NDtAjxr3iMVq
7XPkLXrVqlviKqNTMFEwHQYDVR0OBBYEFBo0fcVjGAwkqvl01KOAz7Zj8Sf3MB8G
A1UdIwQYMBaAFBo0fcVjGAwkqvl01KOAz7Zj8Sf3MA8GA1UdEwEB/wQFMAMBAf8w
CgYIKoZIzj0EAwIDSAAwRQIgTXdyGwdbzeJk7Hab1Nyhl+gRdRKAa8WLxFN/iT5B
lZ0CIQCog6k5qzh461MMNWygBd5AJ4nF2lTMY+6Jr3MuQisrjQ==
-----END CERTIFICATE-----
`

// examplePullSecret is fake: the auth decodes to "example:not-a-real-pull-secret".
const examplePullSecret = `{"auths":{"quay.io":{"auth":"ZXhhbXBsZTpub3QtYS1yZWFsLXB1bGwtc2VjcmV0","email":"admin@example.com"},"registry.redhat.io":{"auth":"ZXhhbXBsZTpub3QtYS1yZWFsLXB1bGwtc2VjcmV0","email":"admin@example.com"}}}`

// exampleBootstrapKubeconfig is fake: the token is not a real one.
const exampleBootstrapKubeconfig = `apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: ` + "%s" + `
    server: https://api-int.example.nodeproof.test:6443
  name: local
contexts:
- context:
    cluster: local
    user: kubelet
  name: kubelet
current-context: kubelet
kind: Config
preferences: {}
users:
- name: kubelet
  user:
    token: exampl.0123456789abcdef
`

func b64URL(s string) string {
	return "data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(s))
}

func kubeletUnit(role string) string {
	return `[Unit]
Description=Kubernetes Kubelet
Requires=crio.service kubelet-dependencies.target
After=kubelet-dependencies.target
After=ostree-finalize-staged.service

[Service]
Type=notify
ExecStartPre=/bin/mkdir --parents /etc/kubernetes/manifests
ExecStartPre=-/usr/sbin/restorecon -ri /var/lib/kubelet/pod-resources /usr/local/bin/kubenswrapper /usr/bin/kubensenter
Environment="KUBELET_LOG_LEVEL=2"
EnvironmentFile=/etc/os-release
EnvironmentFile=-/etc/kubernetes/kubelet-workaround
EnvironmentFile=-/etc/kubernetes/kubelet-env
EnvironmentFile=/etc/node-sizing.env
ExecStart=/usr/local/bin/kubenswrapper \
    /usr/bin/kubelet \
      --config=/etc/kubernetes/kubelet.conf \
      --bootstrap-kubeconfig=/etc/kubernetes/kubeconfig \
      --kubeconfig=/var/lib/kubelet/kubeconfig \
      --container-runtime-endpoint=/var/run/crio/crio.sock \
      --runtime-cgroups=/system.slice/crio.service \
      --node-labels=node-role.kubernetes.io/` + role + `,node.openshift.io/os_id=${ID} \
      --node-ip=${KUBELET_NODE_IP} \
      --minimum-container-ttl-duration=6m0s \
      --cloud-provider= \
      --volume-plugin-dir=/etc/kubernetes/kubelet-plugins/volume/exec \
      --hostname-override=${KUBELET_NODE_NAME} \
      --provider-id=${KUBELET_PROVIDERID} \
      --pod-infra-container-image=quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:0f5e` + `aa11 \
      --system-reserved=cpu=${SYSTEM_RESERVED_CPU},memory=${SYSTEM_RESERVED_MEMORY},ephemeral-storage=${SYSTEM_RESERVED_ES} \
      --v=${KUBELET_LOG_LEVEL}

Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
`
}

const kubeletConf = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
  x509:
    clientCAFile: /etc/kubernetes/kubelet-ca.crt
authorization:
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
  - 172.30.0.10
clusterDomain: cluster.local
containerLogMaxSize: 50Mi
maxPods: 250
kubeAPIQPS: 50
kubeAPIBurst: 100
podPidsLimit: 4096
protectKernelDefaults: true
rotateCertificates: true
serializeImagePulls: false
staticPodPath: /etc/kubernetes/manifests
systemCgroups: /system.slice
nodeStatusUpdateFrequency: 10s
nodeStatusReportFrequency: 5m0s
featureGates:
  RotateKubeletServerCertificate: true
serverTLSBootstrap: true
tlsMinVersion: VersionTLS12
`

const registriesConf = `unqualified-search-registries = ['registry.access.redhat.com', 'docker.io']
short-name-mode = ""
`

const firstbootUnit = `[Unit]
Description=Machine Config Daemon Firstboot
# Make sure it runs only on OSTree booted system
ConditionPathExists=/run/ostree-booted
# Removal of this file signals firstboot completion
ConditionPathExists=/etc/ignition-machine-config-encapsulated.json
After=machine-config-daemon-pull.service
Before=kubelet-dependencies.target

[Service]
EnvironmentFile=-/etc/kubernetes/kubelet-env
Type=oneshot
RemainAfterExit=yes
ExecStart=/run/bin/machine-config-daemon firstboot-complete-machineconfig --persist-nics
ExecStart=/run/bin/machine-config-daemon firstboot-complete-machineconfig

[Install]
RequiredBy=kubelet-dependencies.target
`

const chronyConf = `pool 2.rhel.pool.ntp.org iburst
driftfile /var/lib/chrony/drift
makestep 1.0 3
rtcsync
logdir /var/log/chrony
`

// exampleAgentEnv is /etc/nodeproof/agent.env of 50-worker-nodeproof-agent:
// what nodeproof-agent-firstboot.service passes the agent.
const exampleAgentEnv = `NODEPROOF_SERVER=https://api-int.example.nodeproof.test:22623
NODEPROOF_POOL=worker
NODEPROOF_EVIDENCE=auto
`

// exampleAgentUnits are deploy/node's units the public tier installs, as
// shipped: the first-boot unit, the kubelet bootstrap unit, and the
// re-attestation service and timer.
var exampleAgentUnits = []string{"nodeproof-agent-firstboot.service", "nodeproof-kubelet-bootstrap.service", "nodeproof-reattest.service", "nodeproof-reattest.timer"}

// exampleMC describes one source MachineConfig.
type exampleMC struct {
	name, role string
	marked     bool   // needed-before-node-approved
	ignition   string // Ignition JSON
	kargs      []string
	generated  bool // made by the MCO's template controller
}

func ignJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// exampleSources are the source MachineConfigs; agentUnits are the units
// of exampleAgentUnits, by name, with their contents.
func exampleSources(agentUnits []any) []exampleMC {
	var out []exampleMC
	for _, role := range []string{"master", "worker"} {
		out = append(out,
			exampleMC{name: "00-" + role, role: role, generated: true, ignition: ignJSON(map[string]any{
				"ignition": map[string]any{"version": "3.5.0"},
				"storage": map[string]any{"files": []any{
					map[string]any{"path": "/etc/containers/registries.conf", "mode": 420, "overwrite": true,
						"contents": map[string]any{"source": b64URL(registriesConf)}},
					map[string]any{"path": KubeletCAPath, "mode": 420, "overwrite": true,
						"contents": map[string]any{"source": b64URL(exampleKubeletCA)}},
					map[string]any{"path": PullSecretPath, "mode": 384, "overwrite": true,
						"contents": map[string]any{"source": b64URL(examplePullSecret)}},
				}},
				"systemd": map[string]any{"units": []any{
					map[string]any{"name": "machine-config-daemon-firstboot.service", "enabled": true, "contents": firstbootUnit},
					map[string]any{"name": "crio.service", "dropins": []any{map[string]any{"name": "10-mco-default-madv.conf",
						"contents": "[Service]\nEnvironment=\"GODEBUG=x509ignoreCN=0,madvdontneed=1\"\n"}}},
				}},
			})},
			exampleMC{name: "01-" + role + "-kubelet", role: role, generated: true, ignition: ignJSON(map[string]any{
				"ignition": map[string]any{"version": "3.5.0"},
				"storage": map[string]any{"files": []any{
					map[string]any{"path": "/etc/kubernetes/kubelet.conf", "mode": 420, "overwrite": true,
						"contents": map[string]any{"source": b64URL(kubeletConf)}},
				}},
				"systemd": map[string]any{"units": []any{
					map[string]any{"name": "kubelet.service", "enabled": true, "contents": kubeletUnit(role)},
				}},
			})},
			exampleMC{name: "99-" + role + "-ssh", role: role, marked: true, ignition: ignJSON(map[string]any{
				"ignition": map[string]any{"version": "3.2.0"},
				"passwd": map[string]any{"users": []any{map[string]any{"name": "core", "sshAuthorizedKeys": []string{
					"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHc2v3Z0mJ2mGx1x9Q7T8tT0sHcT6m0wJ2O1b1nQ6q3p admin@example.com",
				}}}},
			})},
		)
	}
	out = append(out,
		exampleMC{name: "05-worker-kernelarg-audit", role: "worker", kargs: []string{"audit=1"}, ignition: ignJSON(map[string]any{
			"ignition": map[string]any{"version": "3.5.0"},
		})},
		exampleMC{name: "50-worker-chrony", role: "worker", marked: true, ignition: ignJSON(map[string]any{
			"ignition": map[string]any{"version": "3.4.0"},
			"storage": map[string]any{"files": []any{
				map[string]any{"path": "/etc/chrony.conf", "mode": 420, "overwrite": true,
					"contents": map[string]any{"source": b64URL(chronyConf)}},
			}},
		})},
		// Two-stage delivery (deploy/node, fetch mode): the public tier
		// installs the first-boot unit and its settings; the agent is in
		// the OS image, the CA bundle comes with every public tier.
		exampleMC{name: "50-worker-nodeproof-agent", role: "worker", marked: true, ignition: ignJSON(map[string]any{
			"ignition": map[string]any{"version": "3.4.0"},
			"storage": map[string]any{"files": []any{
				map[string]any{"path": "/etc/nodeproof/agent.env", "mode": 420, "overwrite": true,
					"contents": map[string]any{"source": b64URL(exampleAgentEnv)}},
			}},
			"systemd": map[string]any{"units": agentUnits},
		})},
	)
	return out
}

// prune drops empty maps, empty lists and nulls, recursively, so the YAML
// reads like what the MCO writes.
func prune(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			e = prune(e)
			if isEmptyJSON(e) {
				delete(t, k)
				continue
			}
			t[k] = e
		}
		return t
	case []any:
		for i := range t {
			t[i] = prune(t[i])
		}
		return t
	}
	return v
}

func isEmptyJSON(v any) bool {
	switch t := v.(type) {
	case nil:
		return true
	case map[string]any:
		return len(t) == 0
	case []any:
		return len(t) == 0
	}
	return false
}

func toMap(j string) map[string]any {
	var m map[string]any
	if err := json.Unmarshal([]byte(j), &m); err != nil {
		panic(err)
	}
	return prune(m).(map[string]any)
}

func exampleSourceObject(s exampleMC) map[string]any {
	meta := map[string]any{
		"name":   s.name,
		"labels": map[string]any{"machineconfiguration.openshift.io/role": s.role},
	}
	annotations := map[string]any{}
	if s.generated {
		annotations["machineconfiguration.openshift.io/generated-by-controller-version"] = exampleMCOVersion
		meta["ownerReferences"] = []any{map[string]any{
			"apiVersion": apiVersion, "kind": "ControllerConfig", "name": "machine-config-controller",
			"uid": "00000000-0000-4000-8000-00000000c0c0", "controller": true, "blockOwnerDeletion": true,
		}}
	}
	if s.marked {
		annotations[NeededBeforeNodeApprovedAnnotation] = "true"
	}
	if len(annotations) > 0 {
		meta["annotations"] = annotations
	}
	spec := map[string]any{"config": toMap(s.ignition), "osImageURL": ""}
	if len(s.kargs) > 0 {
		spec["kernelArguments"] = s.kargs
	}
	return map[string]any{"apiVersion": apiVersion, "kind": "MachineConfig", "metadata": meta, "spec": spec}
}

// exampleRendered merges a pool's sources the way the MCO's render
// controller does (MergeMachineConfigs: name order, Ignition merge,
// overwrite defaulted to true, kernel arguments concatenated without
// duplicates) and names the result rendered-<pool>-<md5 of the spec>.
func exampleRendered(t *testing.T, role string, sources []exampleMC) (string, map[string]any) {
	sort.Slice(sources, func(i, j int) bool { return sources[i].name < sources[j].name })
	var merged Config
	var kargs []string
	seen := map[string]bool{}
	for i, s := range sources {
		cfg, err := ParseConfig([]byte(s.ignition))
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if i == 0 {
			merged = cfg
		} else {
			merged = ign35.Merge(merged, cfg)
		}
		for _, k := range s.kargs {
			if !seen[k] {
				seen[k] = true
				kargs = append(kargs, k)
			}
		}
	}
	yes := true
	for i := range merged.Storage.Files {
		if merged.Storage.Files[i].Overwrite == nil {
			merged.Storage.Files[i].Overwrite = &yes
		}
	}
	raw, err := json.Marshal(merged)
	if err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{
		"config":                         toMap(string(raw)),
		"osImageURL":                     exampleOSImage,
		"baseOSExtensionsContainerImage": exampleOSImage + "-extensions",
		"fips":                           false,
		"kernelType":                     "default",
		"extensions":                     []any{},
	}
	if len(kargs) > 0 {
		spec["kernelArguments"] = kargs
	}
	specJSON, _ := json.Marshal(spec)
	name := fmt.Sprintf("rendered-%s-%x", role, md5.Sum(specJSON))
	return name, map[string]any{
		"apiVersion": apiVersion, "kind": "MachineConfig",
		"metadata": map[string]any{
			"name": name,
			"annotations": map[string]any{
				"machineconfiguration.openshift.io/generated-by-controller-version": exampleMCOVersion,
				"machineconfiguration.openshift.io/release-image-version":           "4.20.0",
			},
			"ownerReferences": []any{map[string]any{
				"apiVersion": apiVersion, "kind": "MachineConfigPool", "name": role,
				"uid":        "00000000-0000-4000-8000-0000000000" + map[string]string{"master": "01", "worker": "02"}[role],
				"controller": true, "blockOwnerDeletion": true,
			}},
		},
		"spec": spec,
	}
}

func examplePool(role, rendered string, allSources []string) map[string]any {
	// The MCO bootstrap (RunBootstrap) lists every MachineConfig, not only
	// the pool's, as the source of both spec and status.
	var source []any
	for _, n := range allSources {
		source = append(source, map[string]any{"apiVersion": apiVersion, "kind": "MachineConfig", "name": n})
	}
	conf := map[string]any{"name": rendered, "source": source}
	nodeRole := map[string]string{"master": "node-role.kubernetes.io/master", "worker": "node-role.kubernetes.io/worker"}[role]
	return map[string]any{
		"apiVersion": apiVersion, "kind": "MachineConfigPool",
		"metadata": map[string]any{
			"name": role,
			"labels": map[string]any{
				"machineconfiguration.openshift.io/mco-built-in":           "",
				"pools.operator.machineconfiguration.openshift.io/" + role: "",
			},
		},
		"spec": map[string]any{
			"machineConfigSelector": map[string]any{"matchLabels": map[string]any{"machineconfiguration.openshift.io/role": role}},
			"nodeSelector":          map[string]any{"matchLabels": map[string]any{nodeRole: ""}},
			"paused":                false,
			"configuration":         conf,
		},
		"status": map[string]any{"configuration": conf},
	}
}

func exampleControllerConfig() map[string]any {
	return map[string]any{
		"apiVersion": apiVersion, "kind": "ControllerConfig",
		"metadata": map[string]any{"name": "machine-config-controller"},
		"spec": map[string]any{
			"clusterDNSIP":                   "172.30.0.10",
			"cloudProviderCAData":            nil, // required by the CRD (nullable): kubectl apply --validate=strict
			"cloudProviderConfig":            "",
			"platform":                       "none",
			"etcdDiscoveryDomain":            "",
			"kubeAPIServerServingCAData":     base64.StdEncoding.EncodeToString([]byte(exampleKubeletCA)),
			"rootCAData":                     base64.StdEncoding.EncodeToString([]byte(exampleRootCA)),
			"additionalTrustBundle":          nil,
			"pullSecret":                     map[string]any{"name": "pull-secret", "namespace": "openshift-config"},
			"images":                         map[string]any{"machineConfigOperator": "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:1111"},
			"osImageURL":                     "",
			"baseOSContainerImage":           exampleOSImage,
			"baseOSExtensionsContainerImage": exampleOSImage + "-extensions",
			"releaseImage":                   "quay.io/openshift-release-dev/ocp-release@sha256:2222",
			"proxy":                          nil,
			"infra": map[string]any{
				"apiVersion": "config.openshift.io/v1", "kind": "Infrastructure",
				"metadata": map[string]any{"name": "cluster"},
				"spec":     map[string]any{"platformSpec": map[string]any{"type": "None"}},
				"status": map[string]any{
					"apiServerURL": "https://api.example.nodeproof.test:6443", "apiServerInternalURI": "https://api-int.example.nodeproof.test:6443",
					"infrastructureName": "example-x7k2p", "platform": "None",
					"platformStatus": map[string]any{"type": "None"}, "controlPlaneTopology": "HighlyAvailable",
					"infrastructureTopology": "HighlyAvailable", "cpuPartitioning": "None",
				},
			},
			"dns": map[string]any{
				"apiVersion": "config.openshift.io/v1", "kind": "DNS",
				"metadata": map[string]any{"name": "cluster"},
				"spec":     map[string]any{"baseDomain": "example.nodeproof.test"},
			},
			"ipFamilies":                  "IPv4",
			"networkType":                 "OVNKubernetes",
			"network":                     map[string]any{"mtuMigration": nil},
			"imageRegistryBundleData":     []any{},
			"imageRegistryBundleUserData": []any{},
		},
	}
}

// generateExamples returns every example file, relative to examplesDir.
func generateExamples(t *testing.T) map[string][]byte {
	files := map[string][]byte{}
	put := func(rel string, obj any) {
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		files[rel] = b
	}
	var units []any
	for _, name := range exampleAgentUnits {
		b, err := os.ReadFile("../../deploy/node/" + name)
		if err != nil {
			t.Fatal(err)
		}
		// The re-attestation service runs from its timer: only the timer
		// the first-boot unit and the kubelet bootstrap unit are enabled.
		units = append(units, map[string]any{"name": name, "enabled": name != "nodeproof-reattest.service", "contents": string(b)})
	}
	sources := exampleSources(units)
	var names []string
	byRole := map[string][]exampleMC{}
	for _, s := range sources {
		names = append(names, s.name)
		byRole[s.role] = append(byRole[s.role], s)
		put("bootstrap/machine-configs/"+s.name+".yaml", exampleSourceObject(s))
	}
	sort.Strings(names)
	for _, role := range []string{"master", "worker"} {
		name, obj := exampleRendered(t, role, byRole[role])
		put("bootstrap/machine-configs/"+name+".yaml", obj)
		put("bootstrap/machine-pools/"+role+".yaml", examplePool(role, name, names))
	}
	put("bootstrap/controller-config/"+ControllerConfigFile, exampleControllerConfig())
	files["bootstrap-kubeconfig"] = []byte(fmt.Sprintf(exampleBootstrapKubeconfig, base64.StdEncoding.EncodeToString([]byte(exampleRootCA))))
	files["bootstrap/README.md"] = []byte(exampleREADME)
	return files
}

const exampleREADME = `# Example MCO bootstrap directory

What the MCO bootstrap writes and the bootstrap Machine Config Server serves
from (` + "`--server-basedir`" + `), for two pools, master and worker:

- ` + "`machine-pools/<pool>.yaml`" + ` — MachineConfigPools; spec and status name the
  rendered config and (as the MCO bootstrap does) list every MachineConfig as
  source.
- ` + "`machine-configs/<name>.yaml`" + ` — the source MachineConfigs (00-<role> with a
  fake pull secret and the kubelet CA, 01-<role>-kubelet with the kubelet
  unit, 99-<role>-ssh, worker's 05-worker-kernelarg-audit,
  50-worker-chrony and 50-worker-nodeproof-agent) and the
  rendered-<pool>-<hash> merge of each pool.
- ` + "`controller-config/machine-config-controller.yaml`" + ` — the ControllerConfig
  (kubelet CA, root CA).

99-<role>-ssh, 50-worker-chrony and 50-worker-nodeproof-agent carry
` + "`nodeproof.io/needed-before-node-approved: \"true\"`" + `: they alone make the
public tier. 50-worker-nodeproof-agent is the two-stage delivery of
` + "`deploy/node`" + ` (fetch mode): it installs
` + "`nodeproof-agent-firstboot.service`" + ` (enabled),
` + "`nodeproof-kubelet-bootstrap.service`" + ` (enabled: the kubelet's first
certificate with the bound key), the re-attestation
` + "`nodeproof-reattest.service`" + ` and its timer ` + "`nodeproof-reattest.timer`" + `
(enabled; all generated from those files) and
` + "`/etc/nodeproof/agent.env`" + ` (server, pool, evidence); the agent binary
is expected in the OS image, and the server adds its CA bundle to every
public tier. ` + "`../bootstrap-kubeconfig`" + ` is the (fake) bootstrap kubeconfig given
to the server by flag. Every secret here is fake.

Generated by ` + "`go test ./mcs/render -run TestExamplesUpToDate -update-examples`" + `
from mcs/render/examples_test.go; edit that, not these files.
`

func TestExamplesUpToDate(t *testing.T) {
	files := generateExamples(t)
	if *updateExamples {
		if err := os.RemoveAll(exampleBootstrap); err != nil {
			t.Fatal(err)
		}
		for rel, b := range files {
			p := filepath.Join(examplesDir, rel)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	var onDisk []string
	err := filepath.WalkDir(exampleBootstrap, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(examplesDir, p)
		onDisk = append(onDisk, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	onDisk = append(onDisk, "bootstrap-kubeconfig")
	for _, rel := range onDisk {
		if _, ok := files[rel]; !ok {
			t.Errorf("%s is on disk but not generated (run with -update-examples)", rel)
		}
	}
	for rel, want := range files {
		got, err := os.ReadFile(filepath.Join(examplesDir, rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s differs from its definition in examples_test.go (run with -update-examples): %v", rel, err)
		}
	}
}

// loadExamples loads the example bootstrap directory and kubeconfig.
func loadExamples(t testing.TB) (*Inputs, []byte) {
	t.Helper()
	in, err := LoadBootstrapDir(exampleBootstrap)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := os.ReadFile(exampleKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return in, kc
}

// exampleRenderedName is the rendered config of a pool in the examples.
func exampleRenderedName(t testing.TB, in *Inputs, pool string) string {
	t.Helper()
	p, ok := in.pools[pool]
	if !ok || !strings.HasPrefix(p.Spec.Configuration.Name, "rendered-"+pool+"-") {
		t.Fatalf("example pool %s has no rendered config", pool)
	}
	return p.Spec.Configuration.Name
}
