package render

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	ign22 "github.com/coreos/ignition/config/v2_2"
	ign31 "github.com/coreos/ignition/v2/config/v3_1"
	ign32 "github.com/coreos/ignition/v2/config/v3_2"
	ign33 "github.com/coreos/ignition/v2/config/v3_3"
	ign34 "github.com/coreos/ignition/v2/config/v3_4"
	ign35 "github.com/coreos/ignition/v2/config/v3_5"
	"github.com/vincent-petithory/dataurl"
)

// richConfig uses most of what MachineConfigs use and every spec can say.
const richConfig = `{
  "ignition": {"version": "3.5.0"},
  "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA admin@example.com"]}]},
  "storage": {
    "files": [
      {"path": "/etc/hostname", "mode": 420, "overwrite": true, "contents": {"source": "data:,node-1%0A"}},
      {"path": "/etc/kubernetes/kubelet.conf", "mode": 420, "overwrite": true,
       "contents": {"source": "data:text/plain;charset=utf-8;base64,a2luZDogS3ViZWxldENvbmZpZ3VyYXRpb24K"}},
      {"path": "/usr/local/bin/hello", "mode": 493, "contents": {"source": "data:,%23!%2Fbin%2Fsh%0Aecho%20hi%0A"}}
    ],
    "directories": [{"path": "/etc/nodeproof", "mode": 448}],
    "links": [{"path": "/etc/localtime", "target": "../usr/share/zoneinfo/UTC", "hard": false}]
  },
  "systemd": {"units": [
    {"name": "kubelet.service", "enabled": true, "contents": "[Service]\nExecStart=/usr/bin/kubelet\n[Install]\nWantedBy=multi-user.target\n"},
    {"name": "crio.service", "dropins": [{"name": "10-env.conf", "contents": "[Service]\nEnvironment=A=b\n"}]}
  ]}
}`

func mustParse(t *testing.T, raw string) Config {
	t.Helper()
	cfg, err := ParseConfig([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestTranslateParsesBack: the config in every served version parses with
// that version's own parser (Ignition v2's for 3.x, Ignition v0.35's spec
// 2.2 parser for 2.2) and keeps its files and units.
func TestTranslateParsesBack(t *testing.T) {
	cfg := mustParse(t, richConfig)
	type parsed struct {
		version string
		paths   []string
		units   []string
	}
	parsers := map[Version]func([]byte) (parsed, error){
		V3_5: func(b []byte) (parsed, error) {
			c, _, err := ign35.Parse(b)
			var p parsed
			p.version = c.Ignition.Version
			for _, f := range c.Storage.Files {
				p.paths = append(p.paths, f.Path)
			}
			for _, u := range c.Systemd.Units {
				p.units = append(p.units, u.Name)
			}
			return p, err
		},
		V3_4: func(b []byte) (parsed, error) {
			c, _, err := ign34.Parse(b)
			var p parsed
			p.version = c.Ignition.Version
			for _, f := range c.Storage.Files {
				p.paths = append(p.paths, f.Path)
			}
			for _, u := range c.Systemd.Units {
				p.units = append(p.units, u.Name)
			}
			return p, err
		},
		V3_3: func(b []byte) (parsed, error) {
			c, _, err := ign33.Parse(b)
			var p parsed
			p.version = c.Ignition.Version
			for _, f := range c.Storage.Files {
				p.paths = append(p.paths, f.Path)
			}
			for _, u := range c.Systemd.Units {
				p.units = append(p.units, u.Name)
			}
			return p, err
		},
		V3_2: func(b []byte) (parsed, error) {
			c, _, err := ign32.Parse(b)
			var p parsed
			p.version = c.Ignition.Version
			for _, f := range c.Storage.Files {
				p.paths = append(p.paths, f.Path)
			}
			for _, u := range c.Systemd.Units {
				p.units = append(p.units, u.Name)
			}
			return p, err
		},
		V3_1: func(b []byte) (parsed, error) {
			c, _, err := ign31.Parse(b)
			var p parsed
			p.version = c.Ignition.Version
			for _, f := range c.Storage.Files {
				p.paths = append(p.paths, f.Path)
			}
			for _, u := range c.Systemd.Units {
				p.units = append(p.units, u.Name)
			}
			return p, err
		},
		V2_2: func(b []byte) (parsed, error) {
			c, _, err := ign22.Parse(b)
			var p parsed
			p.version = c.Ignition.Version
			for _, f := range c.Storage.Files {
				if f.Filesystem != "root" {
					return p, errors.New("file not on the root filesystem: " + f.Path)
				}
				p.paths = append(p.paths, f.Path)
			}
			for _, u := range c.Systemd.Units {
				p.units = append(p.units, u.Name)
			}
			return p, err
		},
	}
	for _, v := range SupportedVersions() {
		t.Run(v.String(), func(t *testing.T) {
			b, err := Translate(cfg, v)
			if err != nil {
				t.Fatal(err)
			}
			p, err := parsers[v](b)
			if err != nil {
				t.Fatalf("spec %s parser: %v\n%s", v, err, b)
			}
			if p.version != v.String() {
				t.Errorf("version %q, want %q", p.version, v)
			}
			if got, want := strings.Join(p.paths, ","), "/etc/hostname,/etc/kubernetes/kubelet.conf,/usr/local/bin/hello"; got != want {
				t.Errorf("files %s, want %s", got, want)
			}
			if got, want := strings.Join(p.units, ","), "kubelet.service,crio.service"; got != want {
				t.Errorf("units %s, want %s", got, want)
			}
		})
	}
}

// TestTranslateRefuses: what an older spec cannot express is an error, at
// exactly the first version that lacks it.
func TestTranslateRefuses(t *testing.T) {
	cases := []struct {
		name   string
		config string
		okDown Version // lowest version that still works
	}{
		{name: "luks cex needs 3.5", okDown: V3_5, config: `{"ignition":{"version":"3.5.0"},"storage":{"luks":[{"name":"root","device":"/dev/sda4","cex":{"enabled":true}}]}}`},
		{name: "tang advertisement needs 3.4", okDown: V3_4, config: `{"ignition":{"version":"3.5.0"},"storage":{"luks":[{"name":"root","device":"/dev/sda4","clevis":{"tang":[{"url":"http://tang.example","thumbprint":"abc","advertisement":"{\"payload\":\"e30\",\"protected\":\"e30\",\"signature\":\"\"}"}]}}]}}`},
		{name: "setuid file needs 3.4", okDown: V3_4, config: `{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"/usr/local/bin/su","mode":2541,"contents":{"source":"data:,x"}}]}}`},
		{name: "kernel arguments need 3.3", okDown: V3_3, config: `{"ignition":{"version":"3.5.0"},"kernelArguments":{"shouldExist":["audit=1"]}}`},
		{name: "luks needs 3.2", okDown: V3_2, config: `{"ignition":{"version":"3.5.0"},"storage":{"luks":[{"name":"root","device":"/dev/sda4","keyFile":{"source":"data:,secret"}}]}}`},
		{name: "users that should not exist need 3.2", okDown: V3_2, config: `{"ignition":{"version":"3.5.0"},"passwd":{"users":[{"name":"bob","shouldExist":false}]}}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := mustParse(t, c.config)
			for _, v := range SupportedVersions() {
				_, err := Translate(cfg, v)
				switch {
				case v >= c.okDown && err != nil:
					t.Errorf("%s: %v", v, err)
				case v < c.okDown && !errors.Is(err, ErrTranslate):
					t.Errorf("%s: got %v, want ErrTranslate", v, err)
				}
			}
		})
	}
}

// TestTranslate35to34KeepsEverything: the 3.5→3.4 step loses nothing 3.4
// has (here, LUKS with tang advertisement, discard and open options).
func TestTranslate35to34KeepsEverything(t *testing.T) {
	cfg := mustParse(t, `{"ignition":{"version":"3.5.0"},"storage":{"luks":[{"name":"root","device":"/dev/sda4","discard":true,
	"openOptions":["--perf-no_read_workqueue"],"cex":{"enabled":false},
	"clevis":{"tang":[{"url":"http://tang.example","thumbprint":"abc","advertisement":"{\"payload\":\"e30\",\"protected\":\"e30\",\"signature\":\"\"}"}],"threshold":1}}]}}`)
	b, err := Translate(cfg, V3_4)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := ign34.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	l := got.Storage.Luks[0]
	if l.Clevis.Tang[0].Advertisement == nil || l.Discard == nil || !*l.Discard || len(l.OpenOptions) != 1 || *l.Clevis.Threshold != 1 {
		t.Fatalf("lost fields: %s", b)
	}
}

// TestParseConfigVersions: every spec a MachineConfig may hold parses to 3.5.
func TestParseConfigVersions(t *testing.T) {
	for _, c := range []struct{ name, raw string }{
		{"3.0.0", `{"ignition":{"version":"3.0.0"},"storage":{"files":[{"path":"/a","contents":{"source":"data:,a"}}]}}`},
		{"3.1.0", `{"ignition":{"version":"3.1.0"},"storage":{"files":[{"path":"/a","contents":{"source":"data:,a"}}]}}`},
		{"3.2.0", `{"ignition":{"version":"3.2.0"},"storage":{"files":[{"path":"/a","contents":{"source":"data:,a"}}]}}`},
		{"3.3.0", `{"ignition":{"version":"3.3.0"},"storage":{"files":[{"path":"/a","contents":{"source":"data:,a"}}]}}`},
		{"3.4.0", `{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/a","contents":{"source":"data:,a"}}]}}`},
		{"3.5.0", `{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"/a","contents":{"source":"data:,a"}}]}}`},
		{"2.2.0", `{"ignition":{"version":"2.2.0"},"storage":{"files":[{"filesystem":"root","path":"/a","contents":{"source":"data:,a"}}]}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(c.raw))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Ignition.Version != "3.5.0" || len(cfg.Storage.Files) != 1 || cfg.Storage.Files[0].Path != "/a" {
				t.Fatalf("%+v", cfg)
			}
		})
	}
	for _, bad := range []string{"", "{}", `{"ignition":{"version":"4.0.0"}}`, `{"ignition":{"version":"3.5.0"},"storage":{"files":[{"path":"relative"}]}}`, "#cloud-config\n"} {
		if _, err := ParseConfig([]byte(bad)); !errors.Is(err, ErrParse) {
			t.Errorf("ParseConfig(%q) = %v, want ErrParse", bad, err)
		}
	}
}

// TestDataURLMatchesMCS: the fast escaper writes what the MCS's
// dataurl.Escape writes.
func TestDataURLMatchesMCS(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	for _, in := range [][]byte{nil, []byte("plain-text_.!~*'()"), []byte("a b\n\"quoted\" & <tag> 100%"), all} {
		if got, want := dataURL(in), "data:,"+dataurl.Escape(in); got != want {
			t.Errorf("dataURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTranslateOutputIsJSONOfVersion: the bytes are a JSON object whose
// ignition.version is the asked one.
func TestTranslateOutputIsJSONOfVersion(t *testing.T) {
	cfg := mustParse(t, richConfig)
	for _, v := range SupportedVersions() {
		b, err := Translate(cfg, v)
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			Ignition struct{ Version string }
		}
		if err := json.Unmarshal(b, &m); err != nil || m.Ignition.Version != v.String() {
			t.Errorf("%s: %v %q", v, err, m.Ignition.Version)
		}
	}
}

// dataurlEscape is the MCS's escaper, for tests that state expectations
// independently of this package's dataURL.
func dataurlEscape(b []byte) string { return dataurl.Escape(b) }
