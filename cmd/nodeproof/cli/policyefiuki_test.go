package cli

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/attest/policy"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/internal/ukitest"
)

// TestPolicyLearnEFIUKI: `policy learn --efi` on a UKI built from Debian's
// systemd-stub 252 and kernel and signed by the test db signer writes, as
// comments, its digest and signer, its os-release, its kernel's version,
// each section systemd-stub measures with the sha256 of the file that went
// in, and the PCR 11 they give; with --merge its signer (and with
// --digests its digest) goes into tpm.uki, a GRUB pool becoming a UKI pool
// only with --uki-pool; uki= on a file that is not a UKI is refused.
func TestPolicyLearnEFIUKI(t *testing.T) {
	stub, kernel := ukitest.StubAndKernelT(t, testenv.Cache())
	osrel := ukitest.WriteT(t, "os-release", []byte("# the image's\nPRETTY_NAME=\"Node OS 7 (\\\"edge\\\")\"\nID=nodeos\nVERSION_ID='7'\nIMAGE_VERSION=7.1\n"))
	cmdline := ukitest.WriteT(t, "cmdline", []byte("console=ttyS0 ro"))
	initrd := ukitest.WriteT(t, "initrd", bytes.Repeat([]byte("initrd"), 5000))
	unsigned := ukitest.BuildT(t, stub, ukitest.Standard(osrel, cmdline, kernel, initrd))
	signed, k := ukitest.SignT(t, testenv.Cache(), unsigned, "node-7.efi")
	img, err := bootimage.ReadFile(signed)
	if err != nil {
		t.Fatal(err)
	}
	kimg, err := bootimage.ReadFile(kernel)
	if err != nil {
		t.Fatal(err)
	}
	// The sections in the order the stub measures them, .linux first, and
	// the PCR 11 they give.
	measured := []ukitest.Section{{Name: ".linux", File: kernel}, {Name: ".osrel", File: osrel}, {Name: ".cmdline", File: cmdline}, {Name: ".initrd", File: initrd}}
	pcr := ukitest.PCR11T(t, measured)
	var sectionLines []string
	for _, s := range measured {
		sectionLines = append(sectionLines, s.Name, "sha256:"+hex.EncodeToString(ukitest.FileSHA256T(t, s.File)))
	}

	run := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append([]string{"policy", "learn"}, args...), &out, &errb)
		return out.String(), errb.String(), code
	}
	for _, arg := range []string{signed, "uki=" + signed} {
		t.Run("--efi "+filepath.Base(arg), func(t *testing.T) {
			draft, errs, code := run("--efi", arg)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			var doc any
			if err := yaml.Unmarshal([]byte(draft), &doc); err != nil || doc != nil {
				t.Fatalf("the draft is not YAML comments alone (%v, %v):\n%s", err, doc, draft)
			}
			for _, want := range append([]string{
				"# uki: node-7.efi (uki)",
				hex.EncodeToString(img.AuthenticodeSHA256),
				fmt.Sprintf("signer %q sha256:%s", k.Cert.Subject.String(), k.SHA256()),
				`PRETTY_NAME "Node OS 7 (\"edge\")", ID "nodeos", VERSION_ID "7", IMAGE_ID "", IMAGE_VERSION "7.1"`,
				"embedded kernel (.linux) version: " + kimg.KernelVersion,
				`command line (.cmdline): "console=ttyS0 ro"`,
				"covers its kernel, initrd and command line",
				"sbat systemd,1",
				"PCR 11 after the stub: " + hex.EncodeToString(pcr),
			}, sectionLines...) {
				if !strings.Contains(draft, want) {
					t.Errorf("the draft lacks %s:\n%s", want, draft)
				}
			}
			if kimg.KernelVersion == "" {
				t.Error("the kernel file names no version")
			}
		})
	}

	// Into a pool: a GRUB pool learned from the live log becomes a UKI
	// pool only when asked (--uki-pool); the UKI's signer goes into
	// tpm.uki, its digest with --digests; GRUB's rules go.
	dir := t.TempDir()
	logPath := filepath.Join(dir, "live.bin")
	if err := os.WriteFile(logPath, firmwaretestdata.MustLog("debian-12-ovmf-secure-boot"), 0o600); err != nil {
		t.Fatal(err)
	}
	pol := filepath.Join(dir, "policy.yaml")
	if _, errs, code := run("--pool", "worker", "--event-log", logPath, "--ek-root", "swtpm="+testRoots(t), "--node-names", "requested", "-o", pol); code != 0 {
		t.Fatalf("learn from the live log: exit %d: %s", code, errs)
	}
	ukiPol := filepath.Join(dir, "policy-uki.yaml")
	_, errs, code := run("--efi", "uki="+signed, "--digests", "--uki-pool", "--pool", "worker", "--merge", pol, "-o", ukiPol)
	if code != 0 {
		t.Fatalf("--uki-pool: exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "the pool now judges unified kernel images; removed: bootComponents.bootloader, bootComponents.kernel, kernelCmdline, grub") {
		t.Errorf("--uki-pool's notes do not say what went:\n%s", errs)
	}
	b, err := os.ReadFile(ukiPol)
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	tp := p.Pools["worker"].TPM
	if tp.UKI == nil || !slices.Contains(tp.UKI.SignedBy, k.SHA256()) || !slices.Equal(tp.UKI.Allow, []string{hex.EncodeToString(img.AuthenticodeSHA256)}) ||
		tp.Grub != nil || tp.KernelCmdline != nil || len(tp.BootComponents.Shim.SignedBy) == 0 {
		t.Errorf("the UKI pool:\n%s\nwant tpm.uki with the UKI's signer and digest, the shim's rule kept, no GRUB rules", b)
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"a UKI into a GRUB pool without --uki-pool", []string{"--efi", signed, "--pool", "worker", "--merge", pol}, "give --uki-pool"},
		{"--uki-pool without a UKI", []string{"--efi", "kernel=" + kernel, "--uki-pool", "--pool", "worker", "--merge", pol}, "give one (--efi uki=FILE)"},
		{"a kernel into a UKI pool", []string{"--efi", "kernel=" + kernel, "--pool", "worker", "--merge", ukiPol}, "a kernel file has no stage there"},
		{"a UKI into a reference set", []string{"--efi", signed, "--pool", "worker", "--merge", ukiPol, "--reference-set", "next"}, "takes no reference set"},
		{"uki= on a kernel", []string{"--efi", "uki=" + kernel}, "not a unified kernel image"},
		{"uki= on the stub alone", []string{"--efi", "uki=" + stub}, "not a unified kernel image"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, errs, code := run(c.args...)
			if code == 0 || !strings.Contains(errs, c.want) {
				t.Errorf("exit %d, %q; want a refusal with %q", code, errs, c.want)
			}
		})
	}
}
