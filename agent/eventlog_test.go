package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMissingEventLog(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "binary_bios_measurements")
	if err := os.WriteFile(present, []byte{1}, 0o600); err != nil {
		t.Fatal(err)
	}
	if msg := MissingEventLog(present); msg != "" {
		t.Errorf("a log that is there: %q", msg)
	}
	msg := MissingEventLog(filepath.Join(dir, "tpm0", "binary_bios_measurements"))
	for _, want := range []string{"event log is missing", "EFI stub", "linuxefi"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the console line for a missing log lacks %q: %q", want, msg)
		}
	}
}
