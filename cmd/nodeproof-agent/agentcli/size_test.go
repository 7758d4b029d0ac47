package agentcli

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// maxAgentSize bounds the stripped agent binary: it goes into every
// node's initramfs (README: about 10 MB).
const maxAgentSize = 16 << 20

// TestAgentBinarySize builds nodeproof-agent as an image build would
// (-trimpath, -ldflags=-s -w, no cgo) and checks it stays under
// maxAgentSize.
func TestAgentBinarySize(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "nodeproof-agent")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "github.com/nodeproof/nodeproof/cmd/nodeproof-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("nodeproof-agent, stripped: %d bytes (%.1f MiB; bound %d MiB)", fi.Size(), float64(fi.Size())/(1<<20), maxAgentSize>>20)
	if fi.Size() > maxAgentSize {
		t.Errorf("nodeproof-agent is %d bytes stripped, more than %d", fi.Size(), maxAgentSize)
	}
}
