package render

import (
	"bytes"
	"errors"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	ign22 "github.com/coreos/ignition/config/v2_2"
	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
)

// renderErrors are the errors Config documents; anything else is a bug.
var renderErrors = []error{ErrUnknownPool, ErrTranslate, ErrSecretInPublicTier, ErrNoRenderedConfig,
	ErrNoControllerConfig, ErrNoKubeconfig, ErrParse, ErrInputs}

func wantRenderError(t *testing.T, err error) {
	t.Helper()
	for _, e := range renderErrors {
		if errors.Is(err, e) {
			return
		}
	}
	t.Fatalf("undocumented render error: %v", err)
}

// exampleInputs loads deploy/examples/bootstrap and its kubeconfig.
func exampleInputs(tb testing.TB) (*Inputs, []byte) {
	tb.Helper()
	in, err := LoadBootstrapDir("../../deploy/examples/bootstrap")
	if err != nil {
		tb.Fatal(err)
	}
	kc, err := os.ReadFile("../../deploy/examples/bootstrap-kubeconfig")
	if err != nil {
		tb.Fatal(err)
	}
	return in, kc
}

// withConfig is in with the MachineConfig named name replaced by mc (nil:
// removed).
func withConfig(tb testing.TB, in *Inputs, name string, mc *mcfgv1.MachineConfig) *Inputs {
	tb.Helper()
	var pools []*mcfgv1.MachineConfigPool
	for _, p := range in.pools {
		pools = append(pools, p)
	}
	var configs []*mcfgv1.MachineConfig
	for n, c := range in.configs {
		if n != name {
			configs = append(configs, c)
		}
	}
	if mc != nil {
		configs = append(configs, mc)
	}
	out, err := NewInputs(pools, configs, in.cc)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// served is what a Renderer serves: pool -> tier -> bytes, or the error.
type served map[string]map[Tier]string

func serve(r *Renderer, v Version) (served, map[string]map[Tier]error) {
	out, errs := served{}, map[string]map[Tier]error{}
	for _, p := range r.Pools() {
		out[p], errs[p] = map[Tier]string{}, map[Tier]error{}
		for _, tier := range []Tier{TierPublic, TierFull} {
			b, err := r.Config(p, tier, v)
			out[p][tier], errs[p][tier] = string(b), err
		}
	}
	return out, errs
}

// FuzzMachineConfig feeds one MachineConfig file (YAML or JSON, as
// LoadBootstrapDir reads it, or as an administrator writes it into the
// cluster) into the inputs of deploy/examples/bootstrap in place of one of
// its MachineConfigs (slot), and renders every pool's public and full tier
// in one spec version. Seeds are the example's own files. Properties:
//   - decoding refuses only with ErrInputs; rendering only with the errors
//     Config documents;
//   - a MachineConfig not marked needed-before-node-approved: "true"
//     changes nothing in any public tier (it is as if it were not there);
//   - no public tier ever writes a ForbiddenPublicPaths file or carries
//     the bootstrap kubeconfig;
//   - a MachineConfig that is not the rendered one a pool serves changes
//     nothing in the full tiers;
//   - a full tier that renders parses in its spec version.
func FuzzMachineConfig(f *testing.F) {
	in, kc := exampleInputs(f)
	names := make([]string, 0, len(in.configs))
	for n := range in.configs {
		names = append(names, n)
	}
	sort.Strings(names)
	rendered := map[string]bool{}
	for _, p := range in.pools {
		n, _ := servedConfigName(p)
		rendered[n] = true
	}
	// What is served with each slot's MachineConfig removed, per version.
	without := make([]map[Version]served, len(names))
	for i, n := range names {
		without[i] = map[Version]served{}
		r, err := NewRenderer(withConfig(f, in, n, nil), Options{BootstrapKubeconfig: kc})
		if err != nil {
			f.Fatal(err)
		}
		for _, v := range SupportedVersions() {
			without[i][v], _ = serve(r, v)
		}
		b, err := os.ReadFile(filepath.Join("../../deploy/examples/bootstrap/machine-configs", n+".yaml"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), uint8(V3_5), b)
		f.Add(uint8(i), uint8(V2_2), b)
	}
	f.Fuzz(func(t *testing.T, slot, version uint8, data []byte) {
		i := int(slot) % len(names)
		name := names[i]
		v := SupportedVersions()[int(version)%len(SupportedVersions())]
		mc := new(mcfgv1.MachineConfig)
		if err := decodeObject(data, "MachineConfig", "", mc, &mc.ObjectMeta.Name); err != nil {
			if !errors.Is(err, ErrInputs) {
				t.Fatalf("decode error without ErrInputs: %v", err)
			}
			return
		}
		mc.Name = name
		r, err := NewRenderer(withConfig(t, in, name, mc), Options{BootstrapKubeconfig: kc})
		if err != nil {
			t.Fatal(err)
		}
		got, errs := serve(r, v)
		base := without[i][v]
		marked := mc.Annotations[NeededBeforeNodeApprovedAnnotation] == "true"
		for pool := range got {
			for _, tier := range []Tier{TierPublic, TierFull} {
				if err := errs[pool][tier]; err != nil {
					wantRenderError(t, err)
				}
			}
			pub := got[pool][TierPublic]
			if !marked && !rendered[name] && pub != base[pool][TierPublic] {
				t.Fatalf("an unmarked MachineConfig changed the public tier of %s", pool)
			}
			if errs[pool][TierPublic] == nil {
				checkPublicServed(t, []byte(pub), v, kc)
			}
			if !rendered[name] && got[pool][TierFull] != base[pool][TierFull] {
				t.Fatalf("a source MachineConfig changed the full tier of %s", pool)
			}
			if full := got[pool][TierFull]; errs[pool][TierFull] == nil {
				if _, err := parseServed([]byte(full), v); err != nil {
					t.Fatalf("full tier of %s in %s does not parse: %v", pool, v, err)
				}
			}
		}
	})
}

// servedPaths parses a served config and returns the files it writes.
func parseServed(b []byte, v Version) ([]string, error) {
	var paths []string
	if v == V2_2 {
		cfg, rpt, err := ign22.Parse(b)
		if err != nil || rpt.IsFatal() {
			return nil, errors.Join(err, errors.New(rpt.String()))
		}
		for _, f := range cfg.Storage.Files {
			paths = append(paths, f.Path)
		}
		return paths, nil
	}
	cfg, err := ParseConfig(b)
	if err != nil {
		return nil, err
	}
	for _, f := range cfg.Storage.Files {
		paths = append(paths, f.Path)
	}
	return paths, nil
}

func checkPublicServed(t *testing.T, pub []byte, v Version, kc []byte) {
	t.Helper()
	paths, err := parseServed(pub, v)
	if err != nil {
		t.Fatalf("public tier in %s does not parse: %v", v, err)
	}
	for _, p := range paths {
		if slices.Contains(ForbiddenPublicPaths(), path.Clean(p)) {
			t.Fatalf("public tier writes %s", p)
		}
	}
	if bytes.Contains(pub, kc) || strings.Contains(string(pub), "bootstrap-kubeconfig") {
		t.Fatal("public tier carries the bootstrap kubeconfig")
	}
}

// FuzzIgnitionConfig feeds Ignition configs (a MachineConfig's
// spec.config) through ParseConfig and Translate to every served spec
// version, seeded with the example MachineConfigs' configs. Properties:
// errors are ErrParse and ErrTranslate; what Translate emits parses back
// in its own version; spec 3.5 round-trips exactly.
func FuzzIgnitionConfig(f *testing.F) {
	in, _ := exampleInputs(f)
	for _, mc := range in.configs {
		f.Add(mc.Spec.Config.Raw)
	}
	f.Add([]byte(`{"ignition":{"version":"2.2.0"},"storage":{"files":[{"filesystem":"root","path":"/etc/x","contents":{"source":"data:,x"},"mode":420}]}}`))
	f.Add([]byte(`{"ignition":{"version":"3.5.0"},"storage":{"luks":[{"name":"l","device":"/dev/sda","cex":{"enabled":true}}]}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, err := ParseConfig(raw)
		if err != nil {
			if !errors.Is(err, ErrParse) {
				t.Fatalf("parse error without ErrParse: %v", err)
			}
			return
		}
		for _, v := range SupportedVersions() {
			out, err := Translate(cfg, v)
			if err != nil {
				if !errors.Is(err, ErrTranslate) {
					t.Fatalf("translate to %s: error without ErrTranslate: %v", v, err)
				}
				continue
			}
			if _, err := parseServed(out, v); err != nil {
				t.Fatalf("translated to %s, does not parse back: %v\n%s", v, err, out)
			}
			if v == V3_5 {
				again, err := ParseConfig(out)
				if err != nil {
					t.Fatal(err)
				}
				out2, err := Translate(again, V3_5)
				if err != nil || !bytes.Equal(out, out2) {
					t.Fatalf("3.5 does not round-trip: %v\n%s\n%s", err, out, out2)
				}
			}
		}
	})
}

// FuzzNegotiate feeds Accept headers (what any client sends) to Negotiate.
// Properties: the answer is a served version or ErrUnsupportedVersion;
// without the Ignition media type the answer is 2.2, as the MCS does.
func FuzzNegotiate(f *testing.F) {
	for _, s := range []string{"", "*/*", "application/vnd.coreos.ignition+json;version=3.4.0, */*;q=0.1",
		"application/vnd.coreos.ignition+json; version=3.5.0, application/vnd.coreos.ignition+json; version=2.2.0;q=0.5",
		"application/vnd.coreos.ignition+json;version=4.0.0", "application/vnd.coreos.ignition+json;version=3.99.0;q=NaN",
		"application/vnd.coreos.ignition+json;version=3.0.0-rc.1+x;q=1e309"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, accept string) {
		v, err := Negotiate(accept)
		switch {
		case err != nil && !errors.Is(err, ErrUnsupportedVersion):
			t.Fatalf("error %v", err)
		case err == nil && !v.Valid():
			t.Fatalf("version %d", v)
		case !strings.Contains(accept, ignitionSubtype) && (err != nil || v != V2_2):
			t.Fatalf("%q without the Ignition type gave %s, %v", accept, v, err)
		}
	})
}
