package tpm_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"unicode/utf16"

	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// pcrPhaseHint says how to get what TestSystemdPCRPhase runs.
const pcrPhaseHint = "run hack/deps.sh (apt-get install systemd libtss2-tcti-swtpm0 util-linux: systemd 252 or later, tpm2-tss's swtpm TCTI, unshare)"

// stubPCRVar is the EFI variable systemd-stub sets when it measured the
// UKI into PCR 11 (its value "11", UTF-16 with NUL, after the 4 bytes of
// attributes, as efivarfs shows it); systemd-pcrphase measures nothing
// without it.
const stubPCRVar = "StubPcrKernelImage-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"

// systemdExtends is a machine that booted the real log (a swtpm that
// replayed its events), on which Debian's own systemd-pcrphase then
// measured words, as systemd's units run it after systemd-stub booted
// the system: in a mount namespace of its own whose /sys/firmware shows
// only the stub's variable.
func systemdExtends(t *testing.T, real []byte, words ...string) *swMachine {
	t.Helper()
	bin := "/lib/systemd/systemd-pcrphase"
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: %s", err, pcrPhaseHint)
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("%v: %s", err, pcrPhaseHint)
	}
	m, err := manufacturer(t).NewMachine(context.Background(), t.TempDir(), real)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	m.Collector.Close()
	host, port, err := net.SplitHostPort(m.TPM.Addr)
	if err != nil {
		t.Fatal(err)
	}
	value := []byte{6, 0, 0, 0} // EFI_VARIABLE_BOOTSERVICE_ACCESS, RUNTIME_ACCESS
	for _, u := range utf16.Encode([]rune("11\x00")) {
		value = append(value, byte(u), byte(u>>8))
	}
	varFile := filepath.Join(t.TempDir(), stubPCRVar)
	if err := os.WriteFile(varFile, value, 0o644); err != nil {
		t.Fatal(err)
	}
	script := `set -e
mount -t tmpfs efi /sys/firmware
mkdir -p /sys/firmware/efi/efivars
cp "$1" /sys/firmware/efi/efivars/
dev=$2
shift 2
for w in "$@"; do "` + bin + `" --tpm2-device="$dev" "$w"; done`
	args := append([]string{"-m", "sh", "-c", script, "sh", varFile, "swtpm:host=" + host + ",port=" + port}, words...)
	if out, err := exec.Command("unshare", args...).CombinedOutput(); err != nil {
		t.Fatalf("systemd-pcrphase %q: %v\n%s\n%s", words, err, out, pcrPhaseHint)
	}
	ch, err := tpm.DialSocket("tcp", m.TPM.Addr, real)
	if err != nil {
		t.Fatal(err)
	}
	if m.Collector, err = tpm.NewCollector(ch); err != nil {
		t.Fatal(err)
	}
	return &swMachine{tpm: m.TPM, collector: m.Collector, keySHA: m.KubeletSHA}
}

// TestSystemdPCRPhase: Debian's own systemd-pcrphase (systemd 252), run
// as its units run it on a machine systemd-stub booted (a real UKI boot's
// firmware log replayed into swtpm), extends PCR 11 exactly as the
// verifier reads it (pcr11Phases): the quote verifies, the UKI's sections
// are still known, and the phases are read in order — in the initrd,
// once the real root is up, and with systemd only in the real root.
func TestSystemdPCRPhase(t *testing.T) {
	uki := firmwaretestdata.MustLog("debian-12-ovmf-uki")
	var v *tpm.Verifier // made once the first machine made the vendor's CA
	for _, c := range []struct {
		name  string
		words []string
	}{
		{"in the initrd", []string{"enter-initrd"}},
		{"the real root up", []string{"enter-initrd", "leave-initrd", "sysinit", "ready"}},
		{"shutting down", []string{"enter-initrd", "leave-initrd", "sysinit", "ready", "shutdown", "final"}},
		{"systemd only in the real root", []string{"sysinit", "ready"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := systemdExtends(t, uki, c.words...)
			if v == nil {
				v = swtpmVerifier(t, nil)
			}
			claims, err := swAttest(t, m, v)
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if b := claims.TPM.Boot; !slices.Equal(b.SystemdPhases, c.words) || !b.UKISectionsKnown || !slices.Contains(b.ReplayedPCRs, 11) {
				t.Errorf("phases %q, sections known %v, replayed PCRs %v; want phases %q, the sections known, PCR 11 replayed", b.SystemdPhases, b.UKISectionsKnown, b.ReplayedPCRs, c.words)
			}
		})
	}
}
