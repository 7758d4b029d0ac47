package cli

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
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
	if _, errs, code := run("--pool", "worker", "--event-log", logPath, "--ek-root", "swtpm="+testRoots(t), "--node-names", "requested", "-o", pol); code != 0 {
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
	if _, errs, code := run("--pool", "worker", "--event-log", offLog, "--ek-root", "swtpm="+testRoots(t), "--node-names", "requested", "-o", offPol); code != 0 {
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
	// The live log was recorded once; Debian's kernel moves on (its ABI
	// changes with each security update), so the files may no longer be
	// what the log booted. Either way the answer is known: admitted when
	// every file is the one the log measured, else refused naming the
	// first stage whose file differs. (That the files of a chain admit a
	// live boot of that same chain is proved live in make test-boot.)
	err = p.Evaluate("worker", &attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{EKTrust: "ca:swtpm", EKKind: attest.EKKindRSA2048, PCRBank: "sha256", Boot: boot}})
	differs := ""
	for i, stage := range []string{"shim", "bootloader", "kernel"} {
		if differs == "" && digest[stage] != live.BootApplications[i] {
			differs = stage
		}
	}
	switch {
	case differs == "" && err != nil:
		t.Errorf("the policy with the files' digests refuses the live boot it was learned from (the same files): %v", err)
	case differs != "" && (err == nil || !strings.Contains(err.Error(), string(attest.ReasonPolicyBootNotAllowed)) || !strings.Contains(err.Error(), "bootComponents."+differs+".allow")):
		t.Errorf("the live boot under the digests of files it did not boot (%s differs): %v; want %s naming bootComponents.%s.allow", differs, err, attest.ReasonPolicyBootNotAllowed, differs)
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

// TestPolicyLearnFromFiles: a release learned from its files before any
// machine boots it. A pool learned from the live boot's log (Debian's
// shim, GRUB and kernel, the live grub.cfg, its initramfs); then `policy
// learn --efi kernel=… --grub-cfg … --initrd … --reference-set` predicts
// what GRUB will measure: GRUB's built-in commands from the pool, grub.cfg's
// commands and the kernel command line exactly as the live boot measured
// them, grub.cfg's digest the live boot's own, the kernel's file digest
// its file's, the new initramfs's digest; with the kernel's version
// recorded and a floor (--minimum-kernel). `policy check --event-log`
// then judges the live log: admitted by the pool's own rules beside the
// release; refused, with every reason, by a pool of the new release
// alone and by a floor above its kernel. The log was recorded once and
// Debian's kernel moves on, so the kernel file may not be the one the log
// booted: where that matters the test says which answer each case gives.
// The same learning judged against a live boot of the same files is
// proved in make test-boot (the whole-boot case).
func TestPolicyLearnFromFiles(t *testing.T) {
	parts, err := liveboot.LoadParts(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), args, &out, &errb)
		return out.String(), errb.String(), code
	}
	dir := t.TempDir()
	raw := firmwaretestdata.MustLog("debian-12-ovmf-secure-boot")
	logPath := filepath.Join(dir, "live.bin")
	grubCfg := filepath.Join(dir, "grub.cfg")
	initrd := filepath.Join(dir, "initrd-2.img")
	for f, b := range map[string][]byte{logPath: raw, grubCfg: liveboot.GrubConfig(true, liveboot.KernelCmdline), initrd: []byte("a new initramfs")} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pol := filepath.Join(dir, "policy.yaml")
	if _, errs, code := run("policy", "learn", "--pool", "worker", "--event-log", logPath, "--ek-root", "swtpm="+testRoots(t), "--node-names", "requested", "-o", pol); code != 0 {
		t.Fatalf("learn from the live log: exit %d: %s", code, errs)
	}
	kernel := parts.Path(parts.Kernel)
	img, err := bootimage.ReadFile(kernel)
	if err != nil {
		t.Fatal(err)
	}
	kernelFile, err := os.ReadFile(kernel)
	if err != nil {
		t.Fatal(err)
	}
	kernelSum := sha256.Sum256(kernelFile)
	parse := func(file string) *policy.Policy {
		t.Helper()
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		p, err := policy.Parse(b)
		if err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		return p
	}
	next := filepath.Join(dir, "policy-next.yaml")
	_, errs, code := run("policy", "learn", "--pool", "worker", "--merge", pol, "--efi", "kernel="+kernel, "--grub-cfg", grubCfg, "--initrd", initrd,
		"--reference-set", "release-2", "--not-after", "2027-03-01", "-o", next)
	if code != 0 {
		t.Fatalf("learn from the files: exit %d: %s", code, errs)
	}
	tp := parse(next).Pools["worker"].TPM
	if len(tp.ReferenceSets) != 1 || tp.ReferenceSets[0].Name != "release-2" || tp.ReferenceSets[0].NotAfter == nil || tp.ReferenceSets[0].Grub == nil {
		t.Fatalf("reference sets %+v; want release-2 with its GRUB rules and notAfter", tp.ReferenceSets)
	}
	set := tp.ReferenceSets[0]
	learned, predicted := tp.Grub, set.Grub
	if !slices.Equal(predicted.Commands, learned.Commands) {
		t.Errorf("predicted commands %q; the live boot ran %q", predicted.Commands, learned.Commands)
	}
	if len(predicted.Files) != 3 || predicted.Files[0] != learned.Files[0] || predicted.Files[1].Path != learned.Files[1].Path || predicted.Files[1].Digest != hex.EncodeToString(kernelSum[:]) {
		t.Errorf("predicted files %+v; want grub.cfg's as the live boot measured it %+v, the kernel's path as it read it and the file's digest, then the new initramfs", predicted.Files, learned.Files)
	}
	sameKernel := learned.Files[1].Digest == hex.EncodeToString(kernelSum[:])
	sum := sha256.Sum256([]byte("a new initramfs"))
	if len(predicted.Files) == 3 && predicted.Files[2].Digest != hex.EncodeToString(sum[:]) {
		t.Errorf("the new initramfs predicted as %+v", predicted.Files[2])
	}
	if !slices.Equal(set.KernelCmdline.Exact, tp.KernelCmdline.Exact) {
		t.Errorf("predicted command line %q; the live boot's %q", set.KernelCmdline.Exact, tp.KernelCmdline.Exact)
	}
	withFloor := filepath.Join(dir, "policy-next-floor.yaml")
	if _, errs, code := run("policy", "learn", "--pool", "worker", "--merge", next, "--efi", "kernel="+kernel, "--minimum-kernel", img.KernelVersion, "-o", withFloor); code != 0 {
		t.Fatalf("learn the kernel's floor: exit %d: %s", code, errs)
	}
	if m := parse(withFloor).Pools["worker"].TPM.MinimumKernel; m == nil || m.Version != img.KernelVersion || m.Versions[hex.EncodeToString(img.AuthenticodeSHA256)] != img.KernelVersion {
		t.Errorf("minimumKernel %+v; want %s, the kernel's digest mapped to it", m, img.KernelVersion)
	}

	check := func(policyFile string) (string, int) {
		out, errs, code := run("policy", "check", policyFile, "--pool", "worker", "--event-log", logPath)
		return out + errs, code
	}
	// Learning a kernel's file records its version and a floor at the
	// oldest version known: a kernel the policy has no version for is
	// refused. So the live log is admitted when the kernel file is the one
	// it booted, else refused for that kernel's unknown version alone.
	switch out, code := check(next); {
	case !strings.Contains(out, "GRUB read: "+learned.Files[2].Digest):
		t.Errorf("the live log under the pool and its new release: the initramfs it read is not said\n%s", out)
	case sameKernel && (code != 0 || !strings.Contains(out, "admitted by pools.worker")):
		t.Errorf("the live log under the pool and its new release (the same kernel file): exit %d; want admitted\n%s", code, out)
	case !sameKernel && (code != 1 || !strings.Contains(out, string(attest.ReasonPolicyKernelVersion)) || !strings.Contains(out, "its version is unknown") || strings.Contains(out, string(attest.ReasonPolicyGrubFile))):
		t.Errorf("the live log under the pool and its new release (another kernel file): exit %d; want 1, %s for its unknown version alone\n%s", code, attest.ReasonPolicyKernelVersion, out)
	}
	// The pool of the new release alone (its rules in place of the
	// pool's, no reference set): the live boot's initramfs is not it.
	alone := filepath.Join(dir, "policy-alone.yaml")
	if _, errs, code := run("policy", "learn", "--pool", "worker", "--merge", pol, "--efi", "kernel="+kernel, "--grub-cfg", grubCfg, "--initrd", initrd, "-o", alone); code != 0 {
		t.Fatalf("learn the new release into the pool: exit %d: %s", code, errs)
	}
	// It names the first file that differs: the initramfs when the kernel
	// file is the one the log booted, else the kernel.
	first := `"/initrd.img"`
	if !sameKernel {
		first = `"/vmlinuz"`
	}
	if out, code := check(alone); code != 1 || !strings.Contains(out, string(attest.ReasonPolicyGrubFile)) || !strings.Contains(out, first) {
		t.Errorf("the live log under the new release alone: exit %d; want 1, GrubFileNotAllowed naming %s\n%s", code, first, out)
	}
	// A floor above the live boot's kernel, and every reason said.
	floor := filepath.Join(dir, "policy-floor.yaml")
	if _, errs, code := run("policy", "learn", "--pool", "worker", "--merge", alone, "--minimum-kernel", "6.1.0-999-amd64", "-o", floor); code != 0 {
		t.Fatalf("raise the floor: exit %d: %s", code, errs)
	}
	out, code := check(floor)
	// Below the floor: a rollback when the pool knows the kernel's
	// version (its file is the one the log booted), else unknown.
	why := "rollback"
	if !sameKernel {
		why = "its version is unknown"
	}
	if code != 1 || !strings.Contains(out, string(attest.ReasonPolicyGrubFile)) || !strings.Contains(out, string(attest.ReasonPolicyKernelVersion)) || !strings.Contains(out, why) {
		t.Errorf("the live log under the new release with a floor above its kernel: exit %d; want 1 with both reasons\n%s", code, out)
	}

	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"--grub-cfg with a menu", []string{"--grub-cfg", writeFile(t, dir, "menu.cfg", "menuentry 'x' {\n linux /vmlinuz\n}\n")}, `line 1: "menuentry"`},
		{"--grub-cfg without the kernel's file", []string{"--grub-cfg", grubCfg, "--initrd", initrd}, "--efi kernel=FILE"},
		{"--grub-cfg without the initramfs", []string{"--grub-cfg", grubCfg, "--efi", "kernel=" + kernel}, "--initrd FILE"},
		{"--initrd without --grub-cfg", []string{"--initrd", initrd}, "need --grub-cfg"},
		{"a command line grub.cfg does not give", []string{"--grub-cfg", grubCfg, "--efi", "kernel=" + kernel, "--initrd", initrd, "--kernel-cmdline", "/vmlinuz init=/bin/sh"}, "is not the command line"},
		{"--not-after without a set", []string{"--efi", "kernel=" + kernel, "--not-after", "2027-01-01"}, "--reference-set"},
		{"a pool learned from no booted machine", []string{"--grub-cfg", grubCfg, "--efi", "kernel=" + kernel, "--initrd", initrd, "--merge", writeFile(t, dir, "hand.yaml",
			"apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\npools:\n  worker:\n    evidence: [tpm]\n    tpm: {anyEKTrust: true, bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}\ntrust: {ekInventory: i.yaml}\n")}, "learn the pool from a machine first"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"policy", "learn", "--pool", "worker"}, c.args...)
			if !slices.Contains(args, "--merge") {
				args = append(args, "--merge", pol)
			}
			_, errs, code := run(args...)
			if code == 0 || !strings.Contains(errs, c.want) {
				t.Errorf("exit %d, %q; want a refusal with %q", code, errs, c.want)
			}
		})
	}
}

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
