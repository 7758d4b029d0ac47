package liveboot_test

import (
	"context"
	"crypto"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/systemtest"
)

// wholeBoot is TestLiveBoot's whole-boot proof, on the signer lab's store
// (its real 186-entry dbx), against the policy `nodeproof policy learn`
// writes by default from a good boot — boot 4's, kernel B (Debian's
// previous kernel, its initramfs, the live grub.cfg) — with kernel B's
// version read from its file (`policy learn --efi`):
//
//  1. the same boot with one line added to the initramfs's /init:
//     refused GrubFileNotAllowed, naming /initrd.img;
//  2. with init=/bin/sh rd.break=pre-mount on the command line: refused
//     KernelCmdlineNotAllowed, naming both words;
//  3. with a grub.cfg that hides the menu and adds an entry: refused
//     GrubFileNotAllowed, naming grub.cfg;
//  4. the kernel update, learned from its files alone (kernel A, its
//     initramfs, the grub.cfg: `policy learn --efi --grub-cfg --initrd
//     --reference-set`, no machine booted first), then booted: admitted,
//     and what the files predicted is what the booted machine's log
//     shows;
//  5. the floor raised to kernel A's version (`policy learn
//     --minimum-kernel`), kernel B booted again: refused
//     KernelBelowMinimum, a rollback, though its reference values are
//     still in the policy.
//
// Each policy goes into the server's --policy file, which it reloads.
func wholeBoot(t *testing.T, ctx context.Context, w *world, g *liveboot.Guest, work string, say func(string, ...any),
	boot func(name, disk, vars string) *liveboot.Result, bootNumber int64, kernelB *liveboot.Result) {
	t.Helper()
	lab, err := liveboot.LoadSignerLab(ctx, testenv.Cache(), say)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(work, "wholeboot")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	np := func(args ...string) string { t.Helper(); return w.policyCmd(t, args...) }
	logB := filepath.Join(dir, "kernel-b.bin")
	raw, ok := kernelB.EventLog()
	if !ok {
		t.Fatal("kernel B's boot left no event log")
	}
	if err := os.WriteFile(logB, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	chainB, err := lab.Chain(ctx, liveboot.ChainDebianPrevious, filepath.Join(dir, "chain-b"))
	if err != nil {
		t.Fatal(err)
	}
	// The files boot 4 booted (signerRules built them: reused as they are).
	initrdB, diskB := filepath.Join(work, liveboot.ChainDebianPrevious, "initrd.img"), filepath.Join(work, liveboot.ChainDebianPrevious, "boot.img")
	learned := filepath.Join(dir, "learned.yaml")
	notes := np("policy", "learn", "--pool", "worker", "--event-log", logB, "--ek-root", systemtest.VendorRoot+"="+w.roots, "--node-names", "requested", "-o", learned)
	for _, want := range []string{"grub and tpm.kernelCmdline", "pinned exactly"} {
		if !strings.Contains(notes, want) {
			t.Errorf("policy learn's notes do not say %q:\n%s", want, notes)
		}
	}
	withB := filepath.Join(dir, "with-b.yaml")
	np("policy", "learn", "--pool", "worker", "--merge", learned, "--efi", "kernel="+chainB.Path(chainB.Kernel), "-o", withB)
	apply := func(file string) {
		t.Helper()
		applyPolicy(t, w, file)
	}
	apply(withB)
	say("whole boot: the policy policy learn wrote from kernel B's boot (its command line, grub.cfg, kernel and initramfs pinned), kernel B's version from its file, in force")

	refused := func(name, disk string, reason attest.Reason, names ...string) {
		t.Helper()
		bootNumber++
		r := boot(name, disk, lab.Vars.Path)
		expectLines(t, r, "nodeproof-liveboot: secure-boot 1", "nodeproof-liveboot: agent reattest start",
			"nodeproof-agent: REFUSED at re-attestation by the server (HTTP 403): "+string(reason), "nodeproof-liveboot: agent exit 3")
		l, _ := r.Find("  reason: ")
		for _, n := range names {
			if !strings.Contains(l.Text, n) {
				t.Errorf("%s: the refusal does not name %q: %q", name, n, l.Text)
			}
		}
		say("whole boot: %s refused %s (%s); %.1fs", name, reason, strings.TrimSpace(strings.TrimPrefix(l.Text, "nodeproof-agent:")), r.Took.Seconds())
	}

	t.Run("a line added to the initramfs's /init: refused, naming the initramfs", func(t *testing.T) {
		tg := *g
		tg.Tamper = "echo nodeproof-liveboot: this line was added to /init"
		initrd, disk := filepath.Join(dir, "tampered-initrd.img"), filepath.Join(dir, "tampered-initrd.boot.img")
		if err := tg.BuildInitramfs(ctx, chainB, initrd); err != nil {
			t.Fatal(err)
		}
		if err := liveboot.BuildBootDiskWith(ctx, chainB, initrd, liveboot.GrubConfig(true, liveboot.KernelCmdline), disk); err != nil {
			t.Fatal(err)
		}
		refused("tampered-initramfs", disk, attest.ReasonPolicyGrubFile, `"/initrd.img"`)
	})
	t.Run("init=/bin/sh rd.break=pre-mount on the command line: refused, naming both", func(t *testing.T) {
		disk := filepath.Join(dir, "cmdline.boot.img")
		if err := liveboot.BuildBootDiskWith(ctx, chainB, initrdB, liveboot.GrubConfig(true, liveboot.KernelCmdline+" init=/bin/sh rd.break=pre-mount"), disk); err != nil {
			t.Fatal(err)
		}
		refused("changed-cmdline", disk, attest.ReasonPolicyKernelCmdline, `"init=/bin/sh"`, `"rd.break=pre-mount"`)
	})
	t.Run("a grub.cfg with its menu hidden and an entry added: refused, naming grub.cfg", func(t *testing.T) {
		disk := filepath.Join(dir, "grubcfg.boot.img")
		cfg := append([]byte("set timeout_style=hidden\nmenuentry 'rescue' {\n\tlinuxefi /vmlinuz init=/bin/sh\n}\n"), liveboot.GrubConfig(true, liveboot.KernelCmdline)...)
		if err := liveboot.BuildBootDiskWith(ctx, chainB, initrdB, cfg, disk); err != nil {
			t.Fatal(err)
		}
		refused("changed-grubcfg", disk, attest.ReasonPolicyGrubFile, "grub.cfg")
	})

	var kernelA *bootimage.Image
	t.Run("a kernel update learned from its files alone: admitted, as predicted", func(t *testing.T) {
		diskA, chainA, err := lab.BootDisk(ctx, liveboot.ChainDebian, g, dir)
		if err != nil {
			t.Fatal(err)
		}
		if kernelA, err = bootimage.ReadFile(chainA.Path(chainA.Kernel)); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(dir, "grub.cfg")
		if err := os.WriteFile(cfg, liveboot.GrubConfig(true, liveboot.KernelCmdline), 0o600); err != nil {
			t.Fatal(err)
		}
		update := filepath.Join(dir, "update.yaml")
		np("policy", "learn", "--pool", "worker", "--merge", w.policyFile, "--efi", "kernel="+chainA.Path(chainA.Kernel), "--grub-cfg", cfg,
			"--initrd", filepath.Join(dir, liveboot.ChainDebian, "initrd.img"), "--reference-set", "kernel-a",
			"--not-after", time.Now().Add(24*time.Hour).UTC().Format(time.RFC3339), "-o", update)
		apply(update)
		bootNumber++
		r := boot("kernel-update", diskA, lab.Vars.Path)
		expectLines(t, r, "nodeproof-liveboot: secure-boot 1", "nodeproof-liveboot: agent reattest start",
			fmt.Sprintf("node %s re-attested (tpm evidence, boot ", node), "nodeproof-liveboot: agent exit 0")
		w.inspectUntil(t, node, 30*time.Second, func(s *inspect.Story) string {
			if s.Binding == nil || !s.Binding.Status.Passed || s.Binding.Status.Boots < bootNumber {
				return fmt.Sprintf("the binding passing a boot after boot %d", bootNumber)
			}
			if a, _, taint := nodeState(s); a != "True" || taint != "" {
				return "the Node attested and untainted again"
			}
			return ""
		})
		// What the files predicted is what the machine measured.
		b, err := os.ReadFile(update)
		if err != nil {
			t.Fatal(err)
		}
		p, err := policy.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		sets := p.Pools["worker"].TPM.ReferenceSets
		i := slices.IndexFunc(sets, func(s policy.ReferenceSet) bool { return s.Name == "kernel-a" })
		if i < 0 || sets[i].Grub == nil || sets[i].KernelCmdline == nil {
			t.Fatalf("the update's reference set: %+v", sets)
		}
		raw, ok := r.EventLog()
		if !ok {
			t.Fatal("the update's boot left no event log")
		}
		bs, err := tpm.LogBootState(raw, crypto.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		var measured []policy.GrubFile
		for _, f := range bs.GrubFiles {
			measured = append(measured, policy.GrubFile{Path: f.Path, Digest: f.Digest})
		}
		if !slices.Equal(sets[i].Grub.Files, measured) || !slices.Equal(sets[i].Grub.Commands, bs.GrubCommands) || sets[i].KernelCmdline.Exact[0] != bs.KernelCmdline {
			t.Errorf("predicted from the files:\n files %+v\n commands %q\n command line %q\nmeasured by the booted machine:\n files %+v\n commands %q\n command line %q",
				sets[i].Grub.Files, sets[i].Grub.Commands, sets[i].KernelCmdline.Exact, measured, bs.GrubCommands, bs.KernelCmdline)
		}
		say("whole boot: kernel A (%s) learned from its files, booted, admitted; the %d files and %d commands predicted are the ones measured; %.1fs",
			kernelA.KernelVersion, len(measured), len(bs.GrubCommands), r.Took.Seconds())
	})
	if kernelA == nil {
		return
	}
	t.Run("the floor raised to the new kernel: the old one, booted again, refused as a rollback", func(t *testing.T) {
		floor := filepath.Join(dir, "floor.yaml")
		np("policy", "learn", "--pool", "worker", "--merge", w.policyFile, "--minimum-kernel", kernelA.KernelVersion, "-o", floor)
		apply(floor)
		refused("rollback", diskB, attest.ReasonPolicyKernelVersion, "rollback", kernelA.KernelVersion)
	})
}

// applyPolicy puts file in the server's --policy file and waits until the
// server says it reloaded it.
func applyPolicy(t testing.TB, w *world, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	w.putPolicy(t, b)
}
