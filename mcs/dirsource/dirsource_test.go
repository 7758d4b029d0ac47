package dirsource_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/mcs/dirsource"
)

// TestDirectoryModeRefusesIncompleteInputs: a bootstrap directory does not
// fill in later, so a pool whose rendered config lists a MachineConfig the
// directory lacks is an error at load, naming it — not a public tier
// served without that config's files.
func TestDirectoryModeRefusesIncompleteInputs(t *testing.T) {
	tests := []struct {
		name    string
		remove  string // file under the bootstrap directory
		wantErr string // "": loads
	}{
		{name: "complete", remove: ""},
		{name: "a public source missing", remove: "machine-configs/50-worker-nodeproof-agent.yaml", wantErr: "MachineConfig 50-worker-nodeproof-agent"},
		{name: "a private source missing", remove: "machine-configs/99-worker-ssh.yaml", wantErr: "MachineConfig 99-worker-ssh"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.CopyFS(dir, os.DirFS("../../deploy/examples/bootstrap")); err != nil {
				t.Fatal(err)
			}
			if tc.remove != "" {
				if err := os.Remove(filepath.Join(dir, tc.remove)); err != nil {
					t.Fatal(err)
				}
			}
			d, err := dirsource.New(dirsource.Options{Dir: dir, Kubeconfig: "../../deploy/examples/bootstrap-kubeconfig", Log: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			_, err = d.Load()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("load: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("load: %v; want an error naming %s", err, tc.wantErr)
			}
		})
	}
}
