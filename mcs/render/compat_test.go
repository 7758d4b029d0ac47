package render

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	ign35 "github.com/coreos/ignition/v2/config/v3_5"
	t35 "github.com/coreos/ignition/v2/config/v3_5/types"
	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"
)

// TestMCSCompatibility: for the example bootstrap directory, the full tier
// served in each 3.x version is what the OpenShift MCS serves. The
// expectation is built here step by step from the MCO's code, not from
// this package's assembly:
//
//   - cluster-server.go / bootstrap-server.go GetConfig: parse the rendered
//     config (ParseAndConvertConfig → 3.5), MigrateKernelArgsIfNecessary
//     (no Ignition kernelArguments in the examples: a no-op), then
//     addDataAndMaybeAppendToIgnition for /etc/kubernetes/kubelet-ca.crt
//     (the rendered config has it: its source is replaced by the
//     ControllerConfig's kubeAPIServerServingCAData) and for the cloud
//     provider CA (empty in the examples: nothing), then getAppenders;
//   - server.go getAppenders, in order: appendNodeAnnotations →
//     /etc/machine-config-daemon/node-annotations.json holding
//     json.Marshal(map{currentConfig, desiredConfig, firstPivotConfig: name,
//     state: "Done"}) (getNodeAnnotation);
//     appendKubeConfig → /etc/kubernetes/kubeconfig; appendInitialMachineConfig
//     → /etc/mcs-machine-config-content.json holding the MachineConfig as
//     indented JSON; appendCerts (none); appendEncapsulated →
//     /etc/ignition-machine-config-encapsulated.json holding the
//     MachineConfig with spec.config = {"ignition":{"version":"3.5.0"}};
//     appendFileToIgnition gives each mode 420, overwrite true and source
//     "data:," + dataurl.Escape(contents);
//   - api.go: 3.5 is served as json.Marshal of that config with
//     clarketm/json, which omits empty objects (encoding/json of the typed
//     config, then render's dropEmptyObjects, gives the same bytes); other
//     versions through the converter chain.
//
// For 3.5 the served bytes must equal the expectation byte for byte, the
// two serialised MachineConfigs excepted: the MCS writes those with
// clarketm/json (which omits empty objects), so they are compared as
// decoded MachineConfigs. Lower versions are compared as parsed configs
// of that version (the MCS also writes them with clarketm/json).
func TestMCSCompatibility(t *testing.T) {
	r, in, kc := newExampleRenderer(t, Options{})
	for _, pool := range []string{"master", "worker"} {
		name := exampleRenderedName(t, in, pool)
		mc := in.configs[name]

		// The MCS's steps, spelled out.
		expected, _, err := ign35.ParseCompatibleVersion(mc.Spec.Config.Raw)
		if err != nil {
			t.Fatal(err)
		}
		replaced := false
		for i := range expected.Storage.Files {
			if expected.Storage.Files[i].Path == "/etc/kubernetes/kubelet-ca.crt" {
				s := "data:," + escapeLikeMCS(in.cc.Spec.KubeAPIServerServingCAData)
				expected.Storage.Files[i].Contents.Source = &s
				replaced = true
			}
		}
		if !replaced {
			t.Fatal("example rendered config has no kubelet CA file to replace")
		}
		if len(in.cc.Spec.CloudProviderCAData) != 0 {
			t.Fatal("examples are expected to have no cloud provider CA")
		}
		appendMCS := func(p, contents string) {
			mode, ow := 420, true
			s := "data:," + escapeLikeMCS([]byte(contents))
			expected.Storage.Files = append(expected.Storage.Files, t35.File{
				Node:          t35.Node{Path: p, Overwrite: &ow},
				FileEmbedded1: t35.FileEmbedded1{Contents: t35.Resource{Source: &s}, Mode: &mode},
			})
		}
		appendMCS("/etc/machine-config-daemon/node-annotations.json",
			`{"machineconfiguration.openshift.io/currentConfig":"`+name+`","machineconfiguration.openshift.io/desiredConfig":"`+name+`","machineconfiguration.openshift.io/firstPivotConfig":"`+name+`","machineconfiguration.openshift.io/state":"Done"}`)
		appendMCS("/etc/kubernetes/kubeconfig", string(kc))
		appendMCS("/etc/mcs-machine-config-content.json", "(compared decoded)")
		appendMCS("/etc/ignition-machine-config-encapsulated.json", "(compared decoded)")

		t.Run(pool+"/3.5.0", func(t *testing.T) {
			got, err := r.Config(pool, TierFull, V3_5)
			if err != nil {
				t.Fatal(err)
			}
			served, _, err := ign35.Parse(got)
			if err != nil {
				t.Fatal(err)
			}
			n := len(served.Storage.Files)
			if n != len(expected.Storage.Files) {
				t.Fatalf("%d files, MCS serves %d", n, len(expected.Storage.Files))
			}
			// The serialised MachineConfigs, decoded.
			content := decodeSource(t, served.Storage.Files[n-2].Contents.Source)
			var contentMC mcfgv1.MachineConfig
			if err := json.Unmarshal(content, &contentMC); err != nil {
				t.Fatal(err)
			}
			if !sameMachineConfig(t, &contentMC, mc) {
				t.Errorf("%s is not the rendered MachineConfig", MachineConfigContentPath)
			}
			if !bytes.HasPrefix(content, []byte("{\n    \"kind\": \"MachineConfig\",")) {
				t.Errorf("%s is not indented with four spaces like the MCS's: %.40q", MachineConfigContentPath, content)
			}
			enc := decodeSource(t, served.Storage.Files[n-1].Contents.Source)
			var encMC mcfgv1.MachineConfig
			if err := json.Unmarshal(enc, &encMC); err != nil {
				t.Fatal(err)
			}
			wantEnc := mc.DeepCopy()
			wantEnc.Spec.Config.Raw = []byte(`{"ignition":{"version":"3.5.0"}}`)
			if !sameMachineConfig(t, &encMC, wantEnc) || string(encMC.Spec.Config.Raw) != `{"ignition":{"version":"3.5.0"}}` {
				t.Errorf("%s is not the rendered MachineConfig with an empty 3.5.0 config", EncapsulatedPath)
			}
			// Everything else, byte for byte.
			expected.Storage.Files[n-2].Contents.Source = served.Storage.Files[n-2].Contents.Source
			expected.Storage.Files[n-1].Contents.Source = served.Storage.Files[n-1].Contents.Source
			want, err := json.Marshal(expected)
			if err != nil {
				t.Fatal(err)
			}
			if want, err = dropEmptyObjects(want); err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(got, []byte(":{}")) {
				t.Errorf("the served config holds an empty object, which the MCS omits")
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("3.5.0 differs from the MCS's bytes")
			}
		})

		for _, v := range []Version{V3_4, V3_3, V3_2, V3_1} {
			t.Run(pool+"/"+v.String(), func(t *testing.T) {
				got, err := r.Config(pool, TierFull, v)
				if err != nil {
					t.Fatal(err)
				}
				// The MCS converts its 3.5 answer down; the file contents
				// do not depend on the version for 3.x (no kernel
				// arguments to migrate in the examples).
				full35, _ := r.Config(pool, TierFull, V3_5)
				cfg35, _, err := ign35.Parse(full35)
				if err != nil {
					t.Fatal(err)
				}
				wantTyped, err := translateTyped(cfg35, v)
				if err != nil {
					t.Fatal(err)
				}
				gotTyped := reflect.New(reflect.TypeOf(wantTyped))
				if err := json.Unmarshal(got, gotTyped.Interface()); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(gotTyped.Elem().Interface(), wantTyped) {
					t.Fatalf("%s differs from the MCS's conversion of its 3.5 answer", v)
				}
			})
		}
	}
}

// escapeLikeMCS is the MCS's getEncodedContent without the "data:,":
// url.URL{Scheme: "data", Opaque: "," + dataurl.Escape(b)}.String().
func escapeLikeMCS(b []byte) string {
	return dataurlEscape(b)
}

// sameMachineConfig compares decoded MachineConfigs, spec.config as a JSON
// value (indenting changes its raw bytes).
func sameMachineConfig(t *testing.T, a, b *mcfgv1.MachineConfig) bool {
	t.Helper()
	if !reflect.DeepEqual(jsonValue(t, a.Spec.Config.Raw), jsonValue(t, b.Spec.Config.Raw)) {
		return false
	}
	a, b = a.DeepCopy(), b.DeepCopy()
	a.Spec.Config.Raw, b.Spec.Config.Raw = nil, nil
	return reflect.DeepEqual(a, b)
}

// TestDropEmptyObjects: empty objects go, recursively, wherever they are
// members; everything else stays as it was, in order.
func TestDropEmptyObjects(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"nothing to drop", `{"b":1,"a":[1,2],"c":"x"}`, `{"b":1,"a":[1,2],"c":"x"}`},
		{"an empty member", `{"ignition":{"version":"3.5.0"},"passwd":{}}`, `{"ignition":{"version":"3.5.0"}}`},
		{"emptied by what it held", `{"ignition":{"security":{"tls":{}},"version":"3.5.0"}}`, `{"ignition":{"version":"3.5.0"}}`},
		{"array elements are kept", `{"files":[{},{"path":"/a"}]}`, `{"files":[{},{"path":"/a"}]}`},
		{"empty arrays, strings, false and null are kept", `{"a":[],"b":"","c":false,"d":null}`, `{"a":[],"b":"","c":false,"d":null}`},
		{"numbers keep their form", `{"mode":420,"big":12345678901234567890}`, `{"mode":420,"big":12345678901234567890}`},
		{"the whole object empty", `{"a":{}}`, `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := dropEmptyObjects([]byte(tc.in))
			if err != nil || string(got) != tc.want {
				t.Fatalf("got %s, %v; want %s", got, err, tc.want)
			}
		})
	}
	for _, bad := range []string{`{"a":`, `{"a":1} 2`, ``} {
		if _, err := dropEmptyObjects([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
