package liveboot_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// ukiBoots is TestLiveBoot's proof of unified kernel images (systemd-stub
// 252 from Debian's systemd-boot-efi), on the signer lab's store (its own
// PK and KEK; db: Microsoft's CAs and the test db CA; a real dbx; the test
// MOK CA in the shim's MokList):
//
//  1. UKI A — kernel A, the live boot's initramfs, its command line —
//     signed by the test db signer (its CA carried in the signature, as a
//     vendor's is); `policy learn --efi uki=A --uki-pool` turns the pool
//     in force into a UKI pool before any machine boots A; the firmware
//     runs A: re-attested and admitted, and the binding's claims name the
//     unified kernel image and its sections, each the sha256 of what went
//     in;
//  2. UKI M — another initramfs (a line added to /init) and another
//     command line — signed by the test MOK signer and run by Debian's
//     shim, which verifies it against its MokList (the firmware's chain
//     trusts it): refused BootSignerNotAllowed, naming the MOK CA;
//  3. UKI C — kernel B (Debian's previous kernel) with its own initramfs
//     — signed by the test db signer: admitted with no policy change.
//
// The policy in force before is put back after.
func ukiBoots(t *testing.T, ctx context.Context, w *world, g *liveboot.Guest, work string, say func(string, ...any),
	boot func(name, disk, vars string) *liveboot.Result) {
	t.Helper()
	lab, err := liveboot.LoadSignerLab(ctx, testenv.Cache(), say)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(work, "uki")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(w.policyFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		saved := filepath.Join(dir, "before.yaml")
		if err := os.WriteFile(saved, before, 0o600); err == nil {
			applyPolicy(t, w, saved)
		}
	})
	build := func(name string, kernel *liveboot.Parts, g *liveboot.Guest, cmdline string, signer, issuer liveboot.KeyPair, shim bool) (string, string, liveboot.UKI) {
		t.Helper()
		return buildUKI(t, ctx, lab, filepath.Join(dir, name), kernel, g, cmdline, signer, issuer, shim)
	}
	keys := lab.Keys
	admitted := func(name, disk string, u liveboot.UKI) *liveboot.Result {
		t.Helper()
		seen := w.inspectUntil(t, node, time.Second, func(*inspect.Story) string { return "" }).Binding.Status.Boots
		r := boot(name, disk, lab.Vars.Path)
		expectLines(t, r, "nodeproof-liveboot: secure-boot 1", "nodeproof-liveboot: agent reattest start",
			fmt.Sprintf("node %s re-attested (tpm evidence, boot ", node), "nodeproof-liveboot: agent exit 0")
		s := w.inspectUntil(t, node, 30*time.Second, func(s *inspect.Story) string {
			if s.Binding == nil || !s.Binding.Status.Passed || s.Binding.Status.Boots <= seen {
				return fmt.Sprintf("the binding passing a boot after the %d it had seen", seen)
			}
			if a, _, taint := nodeState(s); a != "True" || taint != "" {
				return "the Node attested and untainted"
			}
			return ""
		})
		// The claims recorded: the UKI, and its sections as the stub
		// measured them — the sha256 of each input.
		b := claimedBoot(t, s)
		want := ukiSections(t, u)
		if !b.UKISectionsKnown || !slices.Equal(b.UKISections, want) || len(b.BootApplications) != 1 || b.StageOf(0) != "unified kernel image" {
			t.Errorf("%s: the recorded boot: applications %v, UKI sections %v (known %v); want the UKI alone and %v", name, b.BootApplications, b.UKISections, b.UKISectionsKnown, want)
		}
		return r
	}

	// 1. UKI A, learned from its file, then booted.
	imageA, diskA, ukiA := build("uki-a", lab.Current, g, liveboot.KernelCmdline, keys.DBSigner, keys.DBCA, false)
	ukiPool := filepath.Join(dir, "uki-pool.yaml")
	notes := w.policyCmd(t, "policy", "learn", "--efi", "uki="+imageA, "--uki-pool", "--pool", "worker", "--merge", w.policyFile, "-o", ukiPool)
	if !strings.Contains(notes, "the pool now judges unified kernel images") {
		t.Errorf("policy learn --uki-pool's notes do not say the pool changed:\n%s", notes)
	}
	b, err := os.ReadFile(ukiPool)
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if u := p.Pools["worker"].TPM.UKI; u == nil || !slices.Contains(u.SignedBy, keys.DBCA.SHA256()) {
		t.Fatalf("the UKI pool learned from UKI A's file:\n%s\nwant tpm.uki.signedBy with the test db CA", b)
	}
	applyPolicy(t, w, ukiPool)
	say("UKI: the pool learned from UKI A's file (policy learn --efi uki= --uki-pool: signed by the test db CA) in force")
	rA := admitted("uki-a", diskA, ukiA)
	say("UKI: A (kernel A, run by the firmware) admitted; PCR 11 shows its four sections; %.1fs", rA.Took.Seconds())

	// 2. UKI M: what the firmware's chain trusts (the shim and its
	// MokList), not what the pool's signer rule names.
	tampered := *g
	tampered.Tamper = "echo nodeproof-liveboot: a tampered initramfs, not signed by the key the pool names"
	_, diskM, _ := build("uki-m", lab.Current, &tampered, liveboot.KernelCmdline+" nodeproof.tampered=1", keys.MOKSigner, keys.MOKCA, true)
	rM := boot("uki-mok-shim", diskM, lab.Vars.Path)
	expectLines(t, rM, "nodeproof-liveboot: a tampered initramfs, not signed by the key the pool names", "nodeproof-liveboot: secure-boot 1", "nodeproof-liveboot: agent reattest start",
		"nodeproof-agent: REFUSED at re-attestation by the server (HTTP 403): "+string(attest.ReasonPolicyBootSigner), "nodeproof-liveboot: agent exit 3")
	if l, _ := rM.Find("  reason: "); !strings.Contains(l.Text, "nodeproof test MOK CA") || !strings.Contains(l.Text, "uki.signedBy") {
		t.Errorf("the refusal does not name the MOK CA and tpm.uki.signedBy: %q", l.Text)
	}
	w.inspectUntil(t, node, 30*time.Second, func(s *inspect.Story) string {
		if a, _, taint := nodeState(s); s.State != inspect.StateFailed || s.Reason != string(attest.ReasonPolicyBootSigner) || a != "False" || taint == "" {
			return "state Failed " + string(attest.ReasonPolicyBootSigner) + ", tainted, not " + s.State + " " + s.Reason
		}
		return ""
	})
	say("UKI: M (another initramfs and command line, signed by the MOK signer, run by the shim) refused %s; %.1fs", attest.ReasonPolicyBootSigner, rM.Took.Seconds())

	// 3. UKI C: a new kernel and initramfs, signed by the same key.
	imageC, diskC, ukiC := build("uki-c", lab.Previous, g, liveboot.KernelCmdline, keys.DBSigner, keys.DBCA, false)
	rC := admitted("uki-c", diskC, ukiC)
	imgA, err := bootimage.ReadFile(imageA)
	if err != nil {
		t.Fatal(err)
	}
	imgC, err := bootimage.ReadFile(imageC)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(imgA.AuthenticodeSHA256, imgC.AuthenticodeSHA256) {
		t.Error("UKI C is UKI A")
	}
	after, err := os.ReadFile(w.policyFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(b) {
		t.Error("the policy changed between UKI A and UKI C")
	}
	say("UKI: C (kernel B %s, its own initramfs, the same signer) admitted with no policy change; %.1fs", imgC.UKI.KernelVersion, rC.Took.Seconds())
}

// claimedBoot is the boot the claims of s's binding recorded.
func claimedBoot(t testing.TB, s *inspect.Story) attest.BootState {
	t.Helper()
	var c attest.Claims
	if err := json.Unmarshal(s.Claims, &c); err != nil || c.TPM == nil {
		t.Fatalf("the binding's claims: %v", err)
	}
	return c.TPM.Boot
}

// ukiSections are the sections systemd-stub measures of u (a UKI of a
// kernel, an initramfs, a command line and an os-release): each name
// with the sha256 of what went in, in the stub's order.
func ukiSections(t testing.TB, u liveboot.UKI) []attest.MeasuredFile {
	t.Helper()
	var want []attest.MeasuredFile
	for _, sec := range []struct{ name, file string }{{".linux", u.Kernel}, {".osrel", ""}, {".cmdline", ""}, {".initrd", u.Initrd}} {
		var data []byte
		switch sec.name {
		case ".osrel":
			data = u.OSRelease
		case ".cmdline":
			data = []byte(u.Cmdline)
		default:
			var err error
			if data, err = os.ReadFile(sec.file); err != nil {
				t.Fatal(err)
			}
		}
		sum := sha256.Sum256(data)
		want = append(want, attest.MeasuredFile{Path: sec.name, Digest: hex.EncodeToString(sum[:])})
	}
	return want
}

// buildUKI makes, under dir, a UKI of kernel (with its own initramfs for
// g) and the command line, signed by signer (its issuer carried), on a
// boot disk for the firmware, or for Debian's shim; it returns the image,
// the disk and what went in.
func buildUKI(t testing.TB, ctx context.Context, lab *liveboot.SignerLab, dir string, kernel *liveboot.Parts, g *liveboot.Guest, cmdline string,
	signer, issuer liveboot.KeyPair, shim bool) (image, disk string, u liveboot.UKI) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(dir, "initrd.img")
	if err := g.BuildInitramfs(ctx, kernel, initrd); err != nil {
		t.Fatal(err)
	}
	return signedUKI(t, ctx, lab, dir, kernel, initrd, cmdline, signer, issuer, shim)
}

// signedUKI is buildUKI with the initramfs initrd.
func signedUKI(t testing.TB, ctx context.Context, lab *liveboot.SignerLab, dir string, kernel *liveboot.Parts, initrd, cmdline string,
	signer, issuer liveboot.KeyPair, shim bool) (image, disk string, u liveboot.UKI) {
	t.Helper()
	u = liveboot.UKI{Stub: lab.Current.Path(lab.Current.Stub), Kernel: kernel.Path(kernel.Kernel), Initrd: initrd, Cmdline: cmdline, OSRelease: []byte(liveboot.UKIOSRelease)}
	unsigned := filepath.Join(dir, "unsigned.efi")
	image, disk = filepath.Join(dir, "uki.efi"), filepath.Join(dir, "boot.img")
	if _, err := liveboot.BuildUKI(ctx, u, unsigned); err != nil {
		t.Fatal(err)
	}
	if err := signer.SignCarrying(ctx, unsigned, image, issuer); err != nil {
		t.Fatal(err)
	}
	var err error
	if shim {
		err = liveboot.BuildUKIShimDisk(ctx, lab.Current.Path(lab.Current.Shim), image, disk)
	} else {
		err = liveboot.BuildUKIDisk(ctx, image, disk)
	}
	if err != nil {
		t.Fatal(err)
	}
	return image, disk, u
}
