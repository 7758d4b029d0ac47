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
	// A pool learned from a machine that booted with Secure Boot off
	// (no signers, no SBAT minimum: the shim pinned by digest), then the
	// files' signer rules and SBAT minimum.
	offPol := filepath.Join(dir, "policy-off.yaml")
	offLog := filepath.Join(dir, "off.bin")
	if err := os.WriteFile(offLog, firmwaretestdata.MustLog("debian-12-ovmf-no-secure-boot"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := run("--pool", "worker", "--event-log", offLog, "--ek-root", "swtpm=/etc/nodeproof/ek-roots/swtpm", "--node-names", "requested", "-o", offPol); code != 0 {
		t.Fatalf("learn from the Secure Boot off log: exit %d: %s", code, errs)
	}
	signed := filepath.Join(dir, "policy-signers.yaml")
	if _, errs, code := run(append(efi(), "--pool", "worker", "--merge", offPol, "-o", signed)...); code != 0 {
		t.Fatalf("learn --efi: exit %d: %s", code, errs)
	}
	sb, err := os.ReadFile(signed)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := policy.Parse(sb)
	if err != nil {
		t.Fatalf("%v\n%s", err, sb)
	}
	st := sp.Pools["worker"].TPM
	const microsoft2011, debianCA = "48e99b991f57fc52f76149599bff0a58c47154229b9f8d603ac40d3500248507", "079646974bce09b1f04da67bd722d1fb0947ae4c4010bccdbba52d5b23cbf1a2"
	if !slices.Contains(st.BootComponents.Shim.SignedBy, microsoft2011) || !slices.Equal(st.BootComponents.Bootloader.SignedBy, []string{debianCA}) ||
		st.BootComponents.Kernel.Any != true || st.MinimumSBAT["shim"] != 4 || st.MinimumSBAT["grub"] != 5 {
		t.Errorf("learned from the files: %+v, SBAT %v; want the shim's chain (Microsoft's 2011 CA among it), Debian's CA for GRUB, the kernel any as learned, SBAT shim 4, grub 5",
			st.BootComponents, st.MinimumSBAT)
	}
	if len(st.BootComponents.Bootloader.Allow) != 1 { // the digest learned from the log (no signer there), no other
		t.Errorf("learn --efi without --digests added digests: %v", st.BootComponents.Bootloader.Allow)
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
	if !slices.Equal(bc.Kernel.SignedBy, []string{debianCA}) || p.Pools["worker"].TPM.MinimumSBAT["grub"] != 5 {
		t.Errorf("learned from the live log and the files: kernel signers %v, SBAT %v; want Debian's CA once, grub 5", bc.Kernel.SignedBy, p.Pools["worker"].TPM.MinimumSBAT)
	}
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
		{"--pool without --merge", append(efi(), "--pool", "worker"), "go together"},
		{"--efi with a machine's log", append(efi(), "--event-log", logPath), "not a machine"},
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
