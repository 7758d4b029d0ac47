package mcs_test

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	ign35 "github.com/coreos/ignition/v2/config/v3_5"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs"
	"github.com/nodeproof/nodeproof/mcs/render"
)

func exampleRenderer(t *testing.T) *render.Renderer {
	t.Helper()
	in, err := render.LoadBootstrapDir("../deploy/examples/bootstrap")
	if err != nil {
		t.Fatal(err)
	}
	kc, err := os.ReadFile("../deploy/examples/bootstrap-kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	r, err := render.NewRenderer(in, render.Options{BootstrapKubeconfig: kc})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func filePaths(t *testing.T, body []byte) []string {
	t.Helper()
	cfg, rpt, err := ign35.Parse(body)
	if err != nil || rpt.IsFatal() {
		t.Fatalf("served config does not parse as 3.5: %v %v", err, rpt)
	}
	var out []string
	for _, f := range cfg.Storage.Files {
		out = append(out, f.Path)
	}
	return out
}

// TestRenderedTiersOverHTTP serves the example bootstrap directory and
// checks what each tier holds and how the spec version is negotiated.
func TestRenderedTiersOverHTTP(t *testing.T) {
	e := newEnvWith(t, mcs.Rendered{R: exampleRenderer(t)})
	ignition := map[string]string{"Accept": "application/vnd.coreos.ignition+json;version=3.5.0, */*;q=0.1"}

	pub := e.do("GET", e.secure.URL+"/config/worker", nil, ignition)
	if pub.status != 200 {
		t.Fatalf("public tier: %d %s", pub.status, pub.body)
	}
	for _, p := range filePaths(t, pub.body) {
		if slices.Contains(render.ForbiddenPublicPaths(), p) {
			t.Errorf("public tier holds %s", p)
		}
	}
	if strings.Contains(string(pub.body), "pull-secret") || strings.Contains(string(pub.body), "auths") {
		t.Error("public tier holds the pull secret")
	}

	full := e.do("GET", e.secure.URL+"/config/worker", nil, map[string]string{
		"Accept": ignition["Accept"], "Authorization": "Bearer " + e.prov.Current()})
	if full.status != 200 {
		t.Fatalf("full tier: %d %s", full.status, full.body)
	}
	paths := filePaths(t, full.body)
	for _, want := range []string{render.KubeconfigPath, render.KubeletCAPath, render.NodeAnnotationsPath, render.MachineConfigContentPath, render.EncapsulatedPath} {
		if !slices.Contains(paths, want) {
			t.Errorf("full tier lacks %s", want)
		}
	}

	cases := []struct {
		name    string
		accept  string
		version string
		reason  attest.Reason
	}{
		{"curl gets 2.2", "*/*", "2.2.0", ""},
		{"no Accept gets 2.2", "", "2.2.0", ""},
		{"3.1", "application/vnd.coreos.ignition+json;version=3.1.0", "3.1.0", ""},
		{"3.4", "application/vnd.coreos.ignition+json;version=3.4.0", "3.4.0", ""},
		{"newer 3.x gets the newest", "application/vnd.coreos.ignition+json;version=3.9.0", "3.5.0", ""},
		{"4.x is refused", "application/vnd.coreos.ignition+json;version=4.0.0", "", attest.ReasonSpecVersion},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]string{}
			if tc.accept != "" {
				h["Accept"] = tc.accept
			}
			r := e.do("GET", e.secure.URL+"/config/worker", nil, h)
			if tc.reason != "" {
				if r.status != 400 || r.reason != tc.reason {
					t.Fatalf("got %d %q, want 400 %s", r.status, r.reason, tc.reason)
				}
				return
			}
			var v struct {
				Ignition struct{ Version string } `json:"ignition"`
			}
			if r.status != 200 || json.Unmarshal(r.body, &v) != nil || v.Ignition.Version != tc.version {
				t.Fatalf("got %d version %q, want %s", r.status, v.Ignition.Version, tc.version)
			}
		})
	}
}
