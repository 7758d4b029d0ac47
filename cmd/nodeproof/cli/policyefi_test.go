package cli

import (
	"bytes"
	"context"
	"crypto"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// TestPolicyLearnEFI: `policy learn --efi` on Debian's real shim, GRUB
// and kernel names, per stage, the digest and the certificates a signer
// rule would list — among them the authorities the live boot measured
// (Microsoft's UEFI CA for the shim, Debian's CA for GRUB and the kernel)
// — as comments; with --digests it adds the digests to an existing pool
// learned from the live log, and the result still admits that boot.
func TestPolicyLearnEFI(t *testing.T) {
	parts, err := liveboot.LoadParts(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append([]string{"policy", "learn"}, args...), &out, &errb)
		return out.String(), errb.String(), code
	}
	files := []string{parts.Path(parts.Shim), parts.Path(parts.Grub), "kernel=" + parts.Path(parts.Kernel)}
	efi := func() []string {
		var a []string
		for _, f := range files {
			a = append(a, "--efi", f)
		}
		return a
	}
	var live firmwaretestdata.Expected
	logs, err := firmwaretestdata.Logs()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range logs {
		if l.Name == "debian-12-ovmf-secure-boot" {
			live = l.Expected
		}
	}
	digest := map[string]string{}
	for stage, f := range map[string]string{"shim": parts.Shim, "bootloader": parts.Grub, "kernel": parts.Kernel} {
		img, err := bootimage.ReadFile(parts.Path(f))
		if err != nil {
			t.Fatal(err)
		}
		digest[stage] = hex.EncodeToString(img.AuthenticodeSHA256)
	}

	draft, errs, code := run(efi()...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var doc any
	if err := yaml.Unmarshal([]byte(draft), &doc); err != nil || doc != nil {
		t.Fatalf("the draft is not YAML comments alone (%v, %v):\n%s", err, doc, draft)
	}
	for _, want := range append([]string{digest["shim"], digest["bootloader"], digest["kernel"], "# shim:", "# bootloader:", "# kernel:"},
		live.Authorities[0].SHA256, live.Authorities[1].SHA256) {
		if !strings.Contains(draft, want) {
			t.Errorf("the draft lacks %s:\n%s", want, draft)
		}
	}

	dir := t.TempDir()
	logPath := filepath.Join(dir, "live.bin")
	raw := firmwaretestdata.MustLog("debian-12-ovmf-secure-boot")
	if err := os.WriteFile(logPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	pol := filepath.Join(dir, "policy.yaml")
	if _, errs, code := run("--pool", "worker", "--event-log", logPath, "--ek-root", "swtpm=/etc/nodeproof/ek-roots/swtpm", "--node-names", "requested", "-o", pol); code != 0 {
		t.Fatalf("learn from the live log: exit %d: %s", code, errs)
	}
	out := filepath.Join(dir, "policy-efi.yaml")
	if _, errs, code := run(append(efi(), "--digests", "--pool", "worker", "--merge", pol, "-o", out)...); code != 0 {
		t.Fatalf("learn --efi --digests: exit %d: %s", code, errs)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	bc := p.Pools["worker"].TPM.BootComponents
	for stage, allow := range map[string][]string{"shim": bc.Shim.Allow, "bootloader": bc.Bootloader.Allow, "kernel": bc.Kernel.Allow} {
		if !slices.Contains(allow, digest[stage]) {
			t.Errorf("%s: allow %v lacks the file's %s", stage, allow, digest[stage])
		}
	}
	boot, err := tpm.LogBootState(raw, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Evaluate("worker", &attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{EKTrust: "ca:swtpm", PCRBank: "sha256", Boot: boot}}); err != nil {
		t.Errorf("the policy with the files' digests refuses the live boot it was learned from: %v", err)
	}

	notPE := filepath.Join(dir, "not-pe.efi")
	if err := os.WriteFile(notPE, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"--digests without --merge", append(efi(), "--digests", "--pool", "worker"), "--merge"},
		{"--pool without --digests", append(efi(), "--pool", "worker", "--merge", pol), "go with --digests"},
		{"--efi with a machine's log", append(efi(), "--event-log", logPath), "not a machine"},
		{"--digests without --efi", []string{"--digests", "--pool", "worker", "--event-log", logPath}, "goes with --efi"},
		{"a file that is not a boot image", []string{"--efi", notPE}, "not a PE/COFF"},
		{"a stage that is none", []string{"--efi", "initrd=" + parts.Path(parts.Kernel)}, "no boot stage"},
		{"a pool the policy lacks", append(efi(), "--digests", "--pool", "infra", "--merge", pol), "pool infra is not in the policy"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, errs, code := run(c.args...)
			if code == 0 || !strings.Contains(errs, c.want) {
				t.Errorf("exit %d, %q; want a refusal with %q", code, errs, c.want)
			}
		})
	}
}
