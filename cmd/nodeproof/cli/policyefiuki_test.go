package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/internal/ukitest"
)

// TestPolicyLearnEFIUKI: `policy learn --efi` on a UKI built from Debian's
// systemd-stub 252 and kernel and signed by the test db signer writes, as
// comments, its digest and signer, its os-release, its kernel's version,
// each section systemd-stub measures with the sha256 of the file that went
// in, and the PCR 11 they give; --merge refuses it for now, and uki= on a
// file that is not a UKI is refused.
func TestPolicyLearnEFIUKI(t *testing.T) {
	parts, err := liveboot.LoadParts(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	stub, err := ukitest.Stub(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	keys, err := liveboot.EnsureSecureBootKeys(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	osrel := ukitest.WriteT(t, "os-release", []byte("# the image's\nPRETTY_NAME=\"Node OS 7 (\\\"edge\\\")\"\nID=nodeos\nVERSION_ID='7'\nIMAGE_VERSION=7.1\n"))
	cmdline := ukitest.WriteT(t, "cmdline", []byte("console=ttyS0 ro"))
	initrd := ukitest.WriteT(t, "initrd", bytes.Repeat([]byte("initrd"), 5000))
	kernel := parts.Path(parts.Kernel)
	unsigned := ukitest.BuildT(t, stub, ukitest.Standard(osrel, cmdline, kernel, initrd))
	signed := filepath.Join(t.TempDir(), "node-7.efi")
	k := keys.DBSigner
	if out, err := exec.Command("sbsign", "--key", k.KeyPath, "--cert", k.CertPath, "--output", signed, unsigned).CombinedOutput(); err != nil {
		t.Fatalf("sbsign (sbsigntool): %v: %s", err, out)
	}
	img, err := bootimage.ReadFile(signed)
	if err != nil {
		t.Fatal(err)
	}
	kimg, err := bootimage.ReadFile(kernel)
	if err != nil {
		t.Fatal(err)
	}
	sum := func(path string) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		return s[:]
	}
	// PCR 11 as the stub extends it: each section's name (with its NUL),
	// then its content, .linux first.
	pcr := make([]byte, 32)
	var sectionLines []string
	for _, s := range []struct{ name, file string }{{".linux", kernel}, {".osrel", osrel}, {".cmdline", cmdline}, {".initrd", initrd}} {
		n := sha256.Sum256(append([]byte(s.name), 0))
		for _, d := range [][]byte{n[:], sum(s.file)} {
			e := sha256.Sum256(append(pcr, d...))
			pcr = e[:]
		}
		sectionLines = append(sectionLines, s.name, "sha256:"+hex.EncodeToString(sum(s.file)))
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

	pol := ukitest.WriteT(t, "policy.yaml", []byte("pools: {}\n"))
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"a UKI into a pool", []string{"--efi", signed, "--pool", "worker", "--merge", pol}, "not supported yet"},
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
