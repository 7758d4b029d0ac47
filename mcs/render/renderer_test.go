package render

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"

	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
	"github.com/vincent-petithory/dataurl"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func newExampleRenderer(t testing.TB, opts Options) (*Renderer, *Inputs, []byte) {
	t.Helper()
	in, kc := loadExamples(t)
	if opts.BootstrapKubeconfig == nil {
		opts.BootstrapKubeconfig = kc
	}
	r, err := NewRenderer(in, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r, in, kc
}

func decodeSource(t testing.TB, src *string) []byte {
	t.Helper()
	if src == nil {
		t.Fatal("file without contents source")
	}
	d, err := dataurl.DecodeString(*src)
	if err != nil {
		t.Fatalf("bad data URL %.60q: %v", *src, err)
	}
	return d.Data
}

type servedFile struct {
	path      string
	mode      int
	overwrite bool
	contents  []byte
}

// servedFiles parses served bytes of any version back and lists its files.
func servedFiles(t testing.TB, b []byte) []servedFile {
	t.Helper()
	cfg, err := ParseConfig(b)
	if err != nil {
		t.Fatalf("served config does not parse: %v", err)
	}
	var out []servedFile
	for _, f := range cfg.Storage.Files {
		sf := servedFile{path: f.Path, contents: decodeSource(t, f.Contents.Source)}
		if f.Mode != nil {
			sf.mode = *f.Mode
		}
		sf.overwrite = f.Overwrite != nil && *f.Overwrite
		out = append(out, sf)
	}
	return out
}

// TestFullTierIsRenderedPlusAppended: in every version, the full tier is
// the rendered MachineConfig's files (the kubelet CA refreshed from the
// ControllerConfig) followed by the MCS's appended files, with the MCS's
// paths, modes and contents.
func TestFullTierIsRenderedPlusAppended(t *testing.T) {
	r, in, kc := newExampleRenderer(t, Options{})
	for _, pool := range []string{"master", "worker"} {
		name := exampleRenderedName(t, in, pool)
		mc := in.configs[name]
		rendered, err := ParseConfig(mc.Spec.Config.Raw)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range SupportedVersions() {
			t.Run(pool+"/"+v.String(), func(t *testing.T) {
				b, err := r.Config(pool, TierFull, v)
				if err != nil {
					t.Fatal(err)
				}
				files := servedFiles(t, b)
				n := len(rendered.Storage.Files)
				if len(files) != n+4 {
					t.Fatalf("%d files, want %d rendered + 4 appended", len(files), n)
				}
				for i, f := range rendered.Storage.Files {
					want := decodeSource(t, f.Contents.Source)
					if f.Path == KubeletCAPath {
						want = in.cc.Spec.KubeAPIServerServingCAData
					}
					if files[i].path != f.Path || !bytes.Equal(files[i].contents, want) || files[i].mode != *f.Mode {
						t.Errorf("file %d: %s (%o), want %s (%o)", i, files[i].path, files[i].mode, f.Path, *f.Mode)
					}
				}
				appended := files[n:]
				wantPaths := []string{NodeAnnotationsPath, KubeconfigPath, MachineConfigContentPath, EncapsulatedPath}
				for i, f := range appended {
					if f.path != wantPaths[i] || f.mode != 0o644 || !f.overwrite {
						t.Errorf("appended %d: %s mode %o overwrite %v; want %s 0644 true", i, f.path, f.mode, f.overwrite, wantPaths[i])
					}
				}
				wantAnno := `{"machineconfiguration.openshift.io/currentConfig":"` + name +
					`","machineconfiguration.openshift.io/desiredConfig":"` + name +
					`","machineconfiguration.openshift.io/firstPivotConfig":"` + name +
					`","machineconfiguration.openshift.io/state":"Done"}`
				if string(appended[0].contents) != wantAnno {
					t.Errorf("node annotations %s, want %s", appended[0].contents, wantAnno)
				}
				if !bytes.Equal(appended[1].contents, kc) {
					t.Errorf("kubeconfig differs")
				}
				if got, want := jsonValue(t, appended[2].contents), jsonValue(t, mustJSON(t, mc)); !reflect.DeepEqual(got, want) {
					t.Errorf("machine config content differs:\n%v\n%v", got, want)
				}
				var enc mcfgv1.MachineConfig
				if err := json.Unmarshal(appended[3].contents, &enc); err != nil {
					t.Fatal(err)
				}
				wantRaw := `{"ignition":{"version":"3.5.0"}}`
				if v == V2_2 {
					wantRaw = `{"ignition":{"version":"2.2.0"}}`
				}
				if string(enc.Spec.Config.Raw) != wantRaw {
					t.Errorf("encapsulated config %s, want %s", enc.Spec.Config.Raw, wantRaw)
				}
				enc.Spec.Config = mc.Spec.Config
				if !reflect.DeepEqual(jsonValue(t, mustJSON(t, &enc)), jsonValue(t, mustJSON(t, mc))) {
					t.Errorf("encapsulated MachineConfig differs from the rendered one beyond spec.config")
				}
			})
		}
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jsonValue(t testing.TB, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	return v
}

// TestPublicTier: only the marked MachineConfigs of the pool (and the
// extra), nothing secret, nothing appended, nothing of another pool.
func TestPublicTier(t *testing.T) {
	extra := []byte(`{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/pki/ca-trust/source/anchors/nodeproof.crt","mode":420,"contents":{"source":"data:,CA"}}]},
		"systemd":{"units":[{"name":"nodeproof-agent.service","enabled":true,"contents":"[Service]\nExecStart=/usr/local/bin/nodeproof-agent\n[Install]\nWantedBy=multi-user.target\n"}]}}`)
	r, _, _ := newExampleRenderer(t, Options{PublicExtra: extra})
	cases := []struct {
		pool      string
		wantFiles []string
		wantUnits []string
	}{
		{pool: "worker", wantFiles: []string{"/etc/chrony.conf", "/etc/nodeproof/agent.env", "/etc/pki/ca-trust/source/anchors/nodeproof.crt"},
			wantUnits: []string{"nodeproof-agent-firstboot.service", "nodeproof-kubelet-bootstrap.service", "nodeproof-reattest.service", "nodeproof-reattest.timer", "nodeproof-agent.service"}},
		{pool: "master", wantFiles: []string{"/etc/pki/ca-trust/source/anchors/nodeproof.crt"}, wantUnits: []string{"nodeproof-agent.service"}},
	}
	for _, c := range cases {
		for _, v := range SupportedVersions() {
			t.Run(c.pool+"/"+v.String(), func(t *testing.T) {
				b, err := r.Config(c.pool, TierPublic, v)
				if err != nil {
					t.Fatal(err)
				}
				cfg, err := ParseConfig(b)
				if err != nil {
					t.Fatal(err)
				}
				var files, units []string
				for _, f := range cfg.Storage.Files {
					files = append(files, f.Path)
				}
				for _, u := range cfg.Systemd.Units {
					units = append(units, u.Name)
				}
				if !reflect.DeepEqual(files, c.wantFiles) || !reflect.DeepEqual(units, c.wantUnits) {
					t.Errorf("files %v units %v; want %v %v", files, units, c.wantFiles, c.wantUnits)
				}
				if len(cfg.Passwd.Users) != 1 || cfg.Passwd.Users[0].Name != "core" || len(cfg.Passwd.Users[0].SSHAuthorizedKeys) != 1 {
					t.Errorf("want the core user's SSH key from 99-%s-ssh, got %+v", c.pool, cfg.Passwd.Users)
				}
				// No secret file and no kubelet unit, by path and name (the
				// first-boot agent's unit names both in its text: it runs
				// before the kubelet and is skipped once the kubeconfig is
				// there), and none of their contents.
				for _, p := range ForbiddenPublicPaths() {
					if slices.Contains(files, p) {
						t.Errorf("public tier writes %s", p)
					}
				}
				if slices.Contains(units, "kubelet.service") {
					t.Error("public tier holds the kubelet unit")
				}
				for _, secret := range [][]byte{[]byte(`"path":"/etc/kubernetes/kubeconfig"`), []byte(`"name":"kubelet.service"`), []byte("kubenswrapper"),
					[]byte("ZXhhbXBsZTpub3QtYS1yZWFsLXB1bGwtc2VjcmV0"), []byte("exampl.0123456789abcdef"), []byte("rendered-")} {
					if bytes.Contains(b, secret) {
						t.Errorf("public tier contains %q", secret)
					}
				}
			})
		}
	}
}

func mkMC(name, role, ignition string, annotations map[string]string) *mcfgv1.MachineConfig {
	return &mcfgv1.MachineConfig{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"machineconfiguration.openshift.io/role": role}, Annotations: annotations},
		Spec:       mcfgv1.MachineConfigSpec{Config: runtime.RawExtension{Raw: []byte(ignition)}},
	}
}

func mkPool(name, rendered string) *mcfgv1.MachineConfigPool {
	p := &mcfgv1.MachineConfigPool{ObjectMeta: metav1.ObjectMeta{Name: name}}
	p.Spec.MachineConfigSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"machineconfiguration.openshift.io/role": name}}
	p.Spec.Configuration.Name = rendered
	p.Status.Configuration.Name = rendered
	return p
}

var marked = map[string]string{NeededBeforeNodeApprovedAnnotation: "true"}

// TestPublicTierRefusesSecrets: a marked MachineConfig (or the extra) that
// writes a secret makes the public tier fail, in every version.
func TestPublicTierRefusesSecrets(t *testing.T) {
	file := func(p string) string {
		return `{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"` + p + `","contents":{"source":"data:,secret"}}]}}`
	}
	cases := []struct {
		name  string
		mc    *mcfgv1.MachineConfig
		extra string
		want  error
	}{
		{name: "marked pull secret", mc: mkMC("10-worker-pull", "worker", file(PullSecretPath), marked), want: ErrSecretInPublicTier},
		{name: "marked kubeconfig", mc: mkMC("10-worker-kc", "worker", file(KubeconfigPath), marked), want: ErrSecretInPublicTier},
		// Ignition itself refuses paths that are not simplified.
		{name: "marked kubeconfig via unclean path", mc: mkMC("10-worker-kc2", "worker", file("/etc/kubernetes/./kubeconfig"), marked), want: ErrParse},
		{name: "marked encapsulated config", mc: mkMC("10-worker-enc", "worker", file(EncapsulatedPath), marked), want: ErrSecretInPublicTier},
		{name: "extra writes kubeconfig", extra: file(KubeconfigPath), want: ErrSecretInPublicTier},
		{name: "extra is not Ignition", extra: `{"ignition":{"version":"9.0.0"}}`, want: ErrParse},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			configs := []*mcfgv1.MachineConfig{mkMC("rendered-worker-1", "", `{"ignition":{"version":"3.5.0"}}`, nil)}
			if c.mc != nil {
				configs = append(configs, c.mc)
			}
			in, err := NewInputs([]*mcfgv1.MachineConfigPool{mkPool("worker", "rendered-worker-1")}, configs, nil)
			if err != nil {
				t.Fatal(err)
			}
			r, err := NewRenderer(in, Options{PublicExtra: []byte(c.extra)})
			if c.extra != "" {
				if !errors.Is(err, c.want) {
					t.Fatalf("NewRenderer: %v, want %v", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range SupportedVersions() {
				if b, err := r.Config("worker", TierPublic, v); !errors.Is(err, c.want) || b != nil {
					t.Fatalf("%s: got %q, %v; want %v", v, b, err, c.want)
				}
			}
		})
	}
	t.Run("unmarked pull secret is fine", func(t *testing.T) {
		in, err := NewInputs([]*mcfgv1.MachineConfigPool{mkPool("worker", "rendered-worker-1")}, []*mcfgv1.MachineConfig{
			mkMC("rendered-worker-1", "", `{"ignition":{"version":"3.5.0"}}`, nil),
			mkMC("00-worker", "worker", file(PullSecretPath), nil),
			mkMC("99-worker-ssh", "worker", `{"ignition":{"version":"3.2.0"},"passwd":{"users":[{"name":"core","sshAuthorizedKeys":["k"]}]}}`, marked),
			mkMC("99-worker-false", "worker", file("/etc/false"), map[string]string{NeededBeforeNodeApprovedAnnotation: "True"}),
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, _ := NewRenderer(in, Options{})
		b, err := r.Config("worker", TierPublic, V3_5)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("secret")) || bytes.Contains(b, []byte("/etc/false")) || !bytes.Contains(b, []byte(`"k"`)) {
			t.Fatalf("public tier: %s", b)
		}
	})
}

// TestUnknownPool: every entry point answers ErrUnknownPool.
func TestUnknownPool(t *testing.T) {
	r, _, _ := newExampleRenderer(t, Options{})
	for _, tier := range []Tier{TierPublic, TierFull} {
		if _, err := r.Config("infra", tier, V3_5); !errors.Is(err, ErrUnknownPool) {
			t.Errorf("Config %s: %v", tier, err)
		}
	}
	if _, err := r.FullWithKubeconfig("infra", V3_5, []byte("kc")); !errors.Is(err, ErrUnknownPool) {
		t.Errorf("FullWithKubeconfig: %v", err)
	}
	if _, err := r.RenderedConfigName("infra"); !errors.Is(err, ErrUnknownPool) {
		t.Errorf("RenderedConfigName: %v", err)
	}
	if got := r.Pools(); !reflect.DeepEqual(got, []string{"master", "worker"}) {
		t.Errorf("Pools() = %v", got)
	}
}

// TestCacheRendersOnce: concurrent and repeated calls render each entry
// once and get the very same bytes.
func TestCacheRendersOnce(t *testing.T) {
	r, _, _ := newExampleRenderer(t, Options{})
	var wg sync.WaitGroup
	results := make([][]byte, 16)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := r.Config("worker", TierFull, V3_5)
			if err != nil {
				t.Error(err)
			}
			results[i] = b
		}()
	}
	wg.Wait()
	if n := r.renders.Load(); n != 1 {
		t.Fatalf("%d renders after 16 concurrent calls, want 1", n)
	}
	for _, b := range results[1:] {
		if &b[0] != &results[0][0] {
			t.Fatal("calls got different slices")
		}
	}
	for range 3 {
		if b, _ := r.Config("worker", TierFull, V3_5); !bytes.Equal(b, results[0]) {
			t.Fatal("bytes changed")
		}
		if _, err := r.Config("worker", TierPublic, V3_2); err != nil {
			t.Fatal(err)
		}
		if _, err := r.FullWithKubeconfig("worker", V3_5, []byte("per-node")); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.renders.Load(); n != 2 {
		t.Fatalf("%d renders, want 2 (full 3.5 once, public 3.2 once; per-node kubeconfigs splice)", n)
	}
	if err := r.Prerender(); err != nil {
		t.Fatal(err)
	}
	want := int64(2 * 2 * len(SupportedVersions()))
	if n := r.renders.Load(); n != want {
		t.Fatalf("%d renders after Prerender, want %d", n, want)
	}
	if err := r.Prerender(); err != nil || r.renders.Load() != want {
		t.Fatal("second Prerender rendered again")
	}
}

// TestFullWithKubeconfigIsARender: splicing a kubeconfig in gives exactly
// the bytes of a render with that kubeconfig, in every version, and
// Config's full tier is the splice of Options.BootstrapKubeconfig.
func TestFullWithKubeconfigIsARender(t *testing.T) {
	r, _, kc := newExampleRenderer(t, Options{})
	perNode := []byte("apiVersion: v1\nkind: Config\nusers:\n- name: kubelet\n  user:\n    token: abcdef.0123456789abcdef # <\"&'>\\ \u2028\n")
	for _, pool := range r.Pools() {
		for _, v := range SupportedVersions() {
			t.Run(pool+"/"+v.String(), func(t *testing.T) {
				got, err := r.FullWithKubeconfig(pool, v, perNode)
				if err != nil {
					t.Fatal(err)
				}
				want, err := r.renderFull(r.pools[pool], v, perNode)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatal("spliced config differs from a render")
				}
				full, _ := r.Config(pool, TierFull, v)
				direct, _ := r.renderFull(r.pools[pool], v, kc)
				if !bytes.Equal(full, direct) {
					t.Fatal("Config full tier differs from a render with the bootstrap kubeconfig")
				}
				if bytes.Contains(got, []byte(r.placeholder)) {
					t.Fatal("placeholder leaked")
				}
				files := servedFiles(t, got)
				for _, f := range files {
					if f.path == KubeconfigPath && !bytes.Equal(f.contents, perNode) {
						t.Fatalf("kubeconfig %q", f.contents)
					}
				}
			})
		}
	}
	if _, err := r.FullWithKubeconfig("worker", V3_5, nil); !errors.Is(err, ErrNoKubeconfig) {
		t.Errorf("empty kubeconfig: %v", err)
	}
	// The splice does not alias the cache.
	a, _ := r.FullWithKubeconfig("worker", V3_5, []byte("a"))
	a[0] = 'X'
	if b, _ := r.FullWithKubeconfig("worker", V3_5, []byte("a")); b[0] == 'X' {
		t.Fatal("FullWithKubeconfig returned shared memory")
	}
}

// TestKernelArgumentsMigration: below spec 3.3 Ignition kernelArguments
// move into the encapsulated MachineConfig (shouldNotExist cannot).
func TestKernelArgumentsMigration(t *testing.T) {
	cc := &mcfgv1.ControllerConfig{ObjectMeta: metav1.ObjectMeta{Name: "machine-config-controller"}}
	build := func(ign string) *Renderer {
		mc := mkMC("rendered-worker-1", "", ign, nil)
		mc.Spec.KernelArguments = []string{"audit=1"}
		in, err := NewInputs([]*mcfgv1.MachineConfigPool{mkPool("worker", "rendered-worker-1")}, []*mcfgv1.MachineConfig{mc}, cc)
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewRenderer(in, Options{BootstrapKubeconfig: []byte("kc")})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	encapsulated := func(t *testing.T, b []byte) *mcfgv1.MachineConfig {
		for _, f := range servedFiles(t, b) {
			if f.path == EncapsulatedPath {
				var mc mcfgv1.MachineConfig
				if err := json.Unmarshal(f.contents, &mc); err != nil {
					t.Fatal(err)
				}
				return &mc
			}
		}
		t.Fatal("no encapsulated MachineConfig")
		return nil
	}
	r := build(`{"ignition":{"version":"3.5.0"},"kernelArguments":{"shouldExist":["nosmt","mitigations=auto"]}}`)
	for _, c := range []struct {
		v     Version
		kargs []string
		inIgn bool
	}{
		{V3_5, []string{"audit=1"}, true},
		{V3_3, []string{"audit=1"}, true},
		{V3_2, []string{"audit=1", "nosmt", "mitigations=auto"}, false},
		{V2_2, []string{"audit=1", "nosmt", "mitigations=auto"}, false},
	} {
		t.Run(c.v.String(), func(t *testing.T) {
			b, err := r.Config("worker", TierFull, c.v)
			if err != nil {
				t.Fatal(err)
			}
			if got := encapsulated(t, b).Spec.KernelArguments; !reflect.DeepEqual(got, c.kargs) {
				t.Errorf("encapsulated kernelArguments %v, want %v", got, c.kargs)
			}
			cfg, _ := ParseConfig(b)
			if got := len(cfg.KernelArguments.ShouldExist) > 0; got != c.inIgn {
				t.Errorf("ignition kernelArguments present = %v, want %v", got, c.inIgn)
			}
		})
	}
	r = build(`{"ignition":{"version":"3.5.0"},"kernelArguments":{"shouldNotExist":["quiet"]}}`)
	if _, err := r.Config("worker", TierFull, V3_3); err != nil {
		t.Errorf("3.3: %v", err)
	}
	if _, err := r.Config("worker", TierFull, V3_2); !errors.Is(err, ErrTranslate) {
		t.Errorf("3.2: %v, want ErrTranslate", err)
	}
}

// TestServedConfigName: which rendered MachineConfig a pool is served.
func TestServedConfigName(t *testing.T) {
	cases := []struct {
		name               string
		spec, status, want string
		updated            int32
	}{
		{name: "no machine updated yet: status", spec: "rendered-new", status: "rendered-old", updated: 0, want: "rendered-old"},
		{name: "a machine runs spec: spec", spec: "rendered-new", status: "rendered-old", updated: 1, want: "rendered-new"},
		{name: "bootstrap: both equal", spec: "rendered-a", status: "rendered-a", want: "rendered-a"},
		{name: "only spec set", spec: "rendered-a", want: "rendered-a"},
		{name: "only status set, updated", status: "rendered-a", updated: 3, want: "rendered-a"},
		{name: "nothing set", want: ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &mcfgv1.MachineConfigPool{}
			p.Spec.Configuration.Name = c.spec
			p.Status.Configuration.Name = c.status
			p.Status.UpdatedMachineCount = c.updated
			if got, _ := servedConfigName(p); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// TestFullTierErrors: what the full tier needs and refuses without.
func TestFullTierErrors(t *testing.T) {
	cc := &mcfgv1.ControllerConfig{ObjectMeta: metav1.ObjectMeta{Name: "machine-config-controller"}}
	ok := mkMC("rendered-worker-1", "", `{"ignition":{"version":"3.5.0"}}`, nil)
	cases := []struct {
		name    string
		pool    *mcfgv1.MachineConfigPool
		configs []*mcfgv1.MachineConfig
		cc      *mcfgv1.ControllerConfig
		kc      []byte
		want    error
		// Prerender cannot see a missing bootstrap kubeconfig: per-node
		// kubeconfigs (FullWithKubeconfig) still work.
		prerenderOK bool
	}{
		{name: "rendered config missing", pool: mkPool("worker", "rendered-worker-2"), configs: []*mcfgv1.MachineConfig{ok}, cc: cc, kc: []byte("kc"), want: ErrNoRenderedConfig},
		{name: "pool names no config", pool: mkPool("worker", ""), configs: []*mcfgv1.MachineConfig{ok}, cc: cc, kc: []byte("kc"), want: ErrNoRenderedConfig},
		{name: "no controller config", pool: mkPool("worker", "rendered-worker-1"), configs: []*mcfgv1.MachineConfig{ok}, kc: []byte("kc"), want: ErrNoControllerConfig},
		{name: "no kubeconfig", pool: mkPool("worker", "rendered-worker-1"), configs: []*mcfgv1.MachineConfig{ok}, cc: cc, want: ErrNoKubeconfig, prerenderOK: true},
		{name: "rendered config not Ignition", pool: mkPool("worker", "rendered-worker-1"), configs: []*mcfgv1.MachineConfig{mkMC("rendered-worker-1", "", `{"ignition":{"version":"9.9.9"}}`, nil)}, cc: cc, kc: []byte("kc"), want: ErrParse},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in, err := NewInputs([]*mcfgv1.MachineConfigPool{c.pool}, c.configs, c.cc)
			if err != nil {
				t.Fatal(err)
			}
			r, err := NewRenderer(in, Options{BootstrapKubeconfig: c.kc})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Config("worker", TierFull, V3_5); !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if err := r.Prerender(); (err == nil) != c.prerenderOK {
				t.Fatalf("Prerender: %v", err)
			}
		})
	}
}

// TestNewInputsErrors: malformed object sets are refused.
func TestNewInputsErrors(t *testing.T) {
	p := mkPool("worker", "r")
	mc := mkMC("a", "worker", "{}", nil)
	for name, fn := range map[string]func() error{
		"nil pool":       func() error { _, err := NewInputs([]*mcfgv1.MachineConfigPool{nil}, nil, nil); return err },
		"duplicate pool": func() error { _, err := NewInputs([]*mcfgv1.MachineConfigPool{p, p}, nil, nil); return err },
		"nameless MC":    func() error { _, err := NewInputs(nil, []*mcfgv1.MachineConfig{{}}, nil); return err },
		"duplicate MC":   func() error { _, err := NewInputs(nil, []*mcfgv1.MachineConfig{mc, mc}, nil); return err },
	} {
		if err := fn(); !errors.Is(err, ErrInputs) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Inputs are copies: changing the original changes nothing.
	in, _ := NewInputs([]*mcfgv1.MachineConfigPool{p}, []*mcfgv1.MachineConfig{mc}, nil)
	mc.Name = "changed"
	p.Spec.Configuration.Name = "changed"
	if in.configs["a"] == nil || in.pools["worker"].Spec.Configuration.Name != "r" {
		t.Fatal("Inputs alias their arguments")
	}
}

// TestLoadBootstrapDir: the example directory loads; broken ones do not.
func TestLoadBootstrapDir(t *testing.T) {
	in, _ := loadExamples(t)
	if got := in.PoolNames(); !reflect.DeepEqual(got, []string{"master", "worker"}) {
		t.Fatalf("pools %v", got)
	}
	if len(in.configs) != 11 || in.cc == nil || len(in.cc.Spec.KubeAPIServerServingCAData) == 0 {
		t.Fatalf("%d configs, controller config %v", len(in.configs), in.cc != nil)
	}
	good := func(t *testing.T) string {
		dir := t.TempDir()
		for _, sub := range []string{"machine-pools", "machine-configs", "controller-config"} {
			if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		write(t, filepath.Join(dir, "machine-pools", "worker.yaml"), "apiVersion: machineconfiguration.openshift.io/v1\nkind: MachineConfigPool\nmetadata:\n  name: worker\n")
		write(t, filepath.Join(dir, "machine-configs", "rendered-worker-1.yaml"), "kind: MachineConfig\nmetadata:\n  name: rendered-worker-1\nspec:\n  config:\n    ignition:\n      version: 3.5.0\n")
		write(t, filepath.Join(dir, "controller-config", "cc.yaml"), "kind: ControllerConfig\nmetadata:\n  name: machine-config-controller\n")
		write(t, filepath.Join(dir, "machine-configs", "notes.txt"), "ignored")
		return dir
	}
	t.Run("minimal", func(t *testing.T) {
		in, err := LoadBootstrapDir(good(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(in.configs) != 1 || string(in.configs["rendered-worker-1"].Spec.Config.Raw) != `{"ignition":{"version":"3.5.0"}}` {
			t.Fatalf("%+v", in.configs)
		}
	})
	cases := []struct {
		name, file, body string
	}{
		{name: "name differs from file", file: "machine-pools/worker.yaml", body: "kind: MachineConfigPool\nmetadata:\n  name: infra\n"},
		{name: "wrong kind", file: "machine-pools/worker.yaml", body: "kind: MachineConfig\nmetadata:\n  name: worker\n"},
		{name: "wrong apiVersion", file: "machine-pools/worker.yaml", body: "apiVersion: v1\nkind: MachineConfigPool\nmetadata:\n  name: worker\n"},
		{name: "duplicate key", file: "machine-configs/rendered-worker-1.yaml", body: "metadata:\n  name: rendered-worker-1\n  name: rendered-worker-1\n"},
		{name: "two documents", file: "machine-configs/rendered-worker-1.yaml", body: "metadata:\n  name: rendered-worker-1\n---\nmetadata:\n  name: other\n"},
		{name: "no name", file: "machine-configs/rendered-worker-1.yaml", body: "spec: {}\n"},
		{name: "not YAML", file: "machine-configs/rendered-worker-1.yaml", body: "metadata: [\n"},
		{name: "second controller config", file: "controller-config/other.yaml", body: "kind: ControllerConfig\nmetadata:\n  name: x\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := good(t)
			write(t, filepath.Join(dir, c.file), c.body)
			if _, err := LoadBootstrapDir(dir); !errors.Is(err, ErrInputs) {
				t.Fatalf("got %v, want ErrInputs", err)
			}
		})
	}
	t.Run("missing directory", func(t *testing.T) {
		dir := good(t)
		os.RemoveAll(filepath.Join(dir, "controller-config"))
		if _, err := LoadBootstrapDir(dir); !errors.Is(err, ErrInputs) {
			t.Fatalf("got %v", err)
		}
	})
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRegistryCAs: the bootstrap MCS's --cert files land before the
// encapsulated MachineConfig.
func TestRegistryCAs(t *testing.T) {
	r, _, _ := newExampleRenderer(t, Options{RegistryCAs: []RegistryCA{{Host: "registry.example:5000", PEM: []byte("PEM")}}})
	b, err := r.Config("master", TierFull, V3_5)
	if err != nil {
		t.Fatal(err)
	}
	files := servedFiles(t, b)
	ca, enc := files[len(files)-2], files[len(files)-1]
	if ca.path != "/etc/docker/certs.d/registry.example:5000/ca.crt" || string(ca.contents) != "PEM" || ca.mode != 0o644 || enc.path != EncapsulatedPath {
		t.Fatalf("%s %q %o / %s", ca.path, ca.contents, ca.mode, enc.path)
	}
}

// TestTierString keeps log fields stable.
func TestTierString(t *testing.T) {
	if TierPublic.String() != "public" || TierFull.String() != "full" {
		t.Fatal(TierPublic.String(), TierFull.String())
	}
}
