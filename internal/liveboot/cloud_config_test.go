package liveboot_test

import (
	"crypto/sha512"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ignconfig "github.com/coreos/ignition/v2/config"

	"github.com/nodeproof/nodeproof/internal/liveboot"
)

// TestCloudUserData checks the user data the cloud path boots with: it
// parses with Ignition's own parser, keeps the pointer's merge, fetches the
// agent with its SHA-512, enables deploy/node's first-boot unit with a
// drop-in running the agent from /usr/local/bin with the user data's
// settings, and the node's re-attestation unit (which the public tier
// installs) with a drop-in running that agent too; a unit without the
// agent's ExecStart and a pointer that already has a storage section are
// refused.
func TestCloudUserData(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent")
	if err := os.WriteFile(agent, []byte("an agent build"), 0o755); err != nil {
		t.Fatal(err)
	}
	unit, err := os.ReadFile("../../deploy/node/nodeproof-agent-firstboot.service")
	if err != nil {
		t.Fatal(err)
	}
	reattest, err := os.ReadFile("../../deploy/node/nodeproof-reattest.service")
	if err != nil {
		t.Fatal(err)
	}
	pointer := []byte(`{"ignition":{"version":"3.4.0","config":{"merge":[{"source":"https://10.0.2.100:22623/config/worker"}]}}}`)
	sum := sha512.Sum512([]byte("an agent build"))
	for _, tc := range []struct {
		name     string
		pointer  []byte
		unit     []byte
		reattest []byte
		wantErr  string
	}{
		{name: "the pointer plus the agent", pointer: pointer, unit: unit},
		{name: "the pointer plus the agent, the re-attestation unit pointed at it too", pointer: pointer, unit: unit, reattest: reattest},
		{name: "a re-attestation unit without the agent's ExecStart", pointer: pointer, unit: unit, reattest: []byte("[Service]\nExecStart=/bin/true\n"), wantErr: "the re-attestation unit has no ExecStart"},
		{name: "a unit without the agent's ExecStart", pointer: pointer, unit: []byte("[Service]\nExecStart=/bin/true\n"), wantErr: "no ExecStart"},
		{name: "a pointer with a storage section", pointer: []byte(`{"ignition":{"version":"3.4.0"},"storage":{}}`), unit: unit, wantErr: "storage section"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &liveboot.CloudUserData{Pointer: tc.pointer, Agent: agent, AgentURL: "http://10.0.2.100:8080/nodeproof-agent", Unit: tc.unit, Reattest: tc.reattest,
				CABundle: []byte("a CA"), Server: "https://10.0.2.100:22623", Pool: "worker", Evidence: "tpm"}
			b, err := u.Config()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v; want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg, rpt, err := ignconfig.Parse(b)
			if err != nil {
				t.Fatalf("Ignition does not parse it: %v\n%s", err, rpt)
			}
			if len(cfg.Ignition.Config.Merge) != 1 || *cfg.Ignition.Config.Merge[0].Source != "https://10.0.2.100:22623/config/worker" {
				t.Errorf("the pointer's merge is lost: %+v", cfg.Ignition.Config.Merge)
			}
			files := map[string]string{}
			for _, f := range cfg.Storage.Files {
				h := ""
				if f.Contents.Verification.Hash != nil {
					h = *f.Contents.Verification.Hash
				}
				files[f.Path] = h
			}
			if got, want := files[liveboot.CloudAgentPath], "sha512-"+hex.EncodeToString(sum[:]); got != want {
				t.Errorf("the agent's hash %q; want %q", got, want)
			}
			if _, ok := files[liveboot.CloudAgentEnv]; !ok {
				t.Errorf("no %s; files %v", liveboot.CloudAgentEnv, files)
			}
			want := 1
			if tc.reattest != nil {
				want = 2
			}
			if len(cfg.Systemd.Units) != want || cfg.Systemd.Units[0].Enabled == nil || !*cfg.Systemd.Units[0].Enabled || len(cfg.Systemd.Units[0].Dropins) != 1 {
				t.Fatalf("the units: %+v; want the first-boot unit enabled with one drop-in, and %d in all", cfg.Systemd.Units, want)
			}
			d := *cfg.Systemd.Units[0].Dropins[0].Contents
			if !strings.Contains(d, "EnvironmentFile="+liveboot.CloudAgentEnv) || !strings.Contains(d, "ExecStart=\nExecStart="+liveboot.CloudAgentPath+" --mode=fetch ") {
				t.Errorf("the drop-in:\n%s", d)
			}
			if tc.reattest != nil {
				// The public tier installs and enables the unit and its
				// timer: the user data only points it at the agent.
				u := cfg.Systemd.Units[1]
				if u.Name != "nodeproof-reattest.service" || u.Enabled != nil || u.Contents != nil || len(u.Dropins) != 1 {
					t.Fatalf("the re-attestation unit: %+v; want only a drop-in", u)
				}
				d := *u.Dropins[0].Contents
				if !strings.Contains(d, "EnvironmentFile="+liveboot.CloudAgentEnv) || !strings.Contains(d, "ExecStart=\nExecStart="+liveboot.CloudAgentPath+" --mode=reattest ") {
					t.Errorf("the re-attestation drop-in:\n%s", d)
				}
			}
		})
	}
}
