package agentcli

import (
	"os/exec"
	"strings"
	"testing"
)

// TestAgentImportsNoServerCode: the initramfs binary must stay small and
// must not carry server code or client-go.
func TestAgentImportsNoServerCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/nodeproof/nodeproof/cmd/nodeproof-agent").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{
		"k8s.io/", "sigs.k8s.io/", "go.etcd.io/bbolt",
		"github.com/nodeproof/nodeproof/store", "github.com/nodeproof/nodeproof/approver",
		"github.com/nodeproof/nodeproof/internal/cli",
		"github.com/nodeproof/nodeproof/mcs/render", "github.com/nodeproof/nodeproof/mcs/cluster",
		"github.com/nodeproof/nodeproof/mcs/seal", "github.com/nodeproof/nodeproof/mcs/tokens",
		"github.com/nodeproof/nodeproof/mcs/certs", "github.com/nodeproof/nodeproof/mcs/userdata",
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("nodeproof-agent imports %s", pkg)
			}
		}
		if pkg == "github.com/nodeproof/nodeproof/mcs" {
			t.Errorf("nodeproof-agent imports the server package mcs")
		}
	}
}
