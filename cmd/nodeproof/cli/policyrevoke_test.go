package cli

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/attest/uefivar"
	"github.com/nodeproof/nodeproof/attest/uefivar/uefivartest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// debianCA is the fingerprint of Debian's Secure Boot CA, the shim's
// vendor certificate, which verified GRUB and the kernel in the Debian 12
// log.
const debianCA = "079646974bce09b1f04da67bd722d1fb0947ae4c4010bccdbba52d5b23cbf1a2"

// measuredAuthority is the certificate of fingerprint fp that a log
// measured as a Secure Boot authority, read with go-eventlog.
func measuredAuthority(t *testing.T, raw []byte, fp string) *x509.Certificate {
	t.Helper()
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range el.Events(register.HashSHA256) {
		if ev.Index != 7 || ev.Type != tcg.EFIVariableAuthority {
			continue
		}
		v, err := tcg.ParseUEFIVariableData(bytes.NewReader(ev.Data))
		if err != nil || string(utf16.Decode(v.UnicodeName)) == "SbatLevel" {
			continue
		}
		a, err := tcg.ParseUEFIVariableAuthority(v)
		if err != nil && !errors.Is(err, tcg.ErrSigMissingGUID) {
			continue
		}
		for _, c := range a.Certs {
			if uefivar.Fingerprint(&c) == fp {
				return &c
			}
		}
	}
	t.Fatalf("the log measured no authority %s", fp)
	return nil
}

// TestPolicyRevoke: `policy revoke` reads a dbx update as published (an
// authenticated variable the lab's KEK signed) or bare lists, and shim's
// SbatLevel, into a pool learned from a real machine (Debian 12 under
// OVMF with Secure Boot); `policy check --event-log` then judges that
// machine's log by the new policy: refused with the reason of the rule
// each revocation became when it names what the machine booted, admitted
// when it does not. Files that do not read change nothing.
func TestPolicyRevoke(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	raw := firmwaretestdata.MustLog("debian-12-ovmf-secure-boot")
	logFile := write("debian.log", raw)
	bs, err := tpm.LogBootState(raw, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	doc, _, err := policy.Learn(nil, "worker", policy.Learned{EKTrust: "ca:vendor", Bank: "sha256", Boot: bs,
		Root: &policy.EKRoot{Name: "vendor", Dir: dir}, NodeNames: "requested"})
	if err != nil {
		t.Fatal(err)
	}
	pol := write("policy.yaml", doc)

	kek := uefivartest.NewKEK(t, "nodeproof lab KEK")
	at := time.Date(2025, 2, 18, 0, 0, 0, 0, time.UTC)
	nobody := sha256.Sum256([]byte("an image nobody here booted"))
	grub, err := hex.DecodeString(bs.BootApplications[1])
	if err != nil {
		t.Fatal(err)
	}
	revokedGrub := write("grub.bin", kek.Authenticated(t, at, uefivartest.List(uefivar.CertSHA256, nobody[:], grub)))
	revokedCA := write("ca.bin", kek.Authenticated(t, at, uefivartest.List(uefivar.CertX509, measuredAuthority(t, raw, debianCA).Raw)))
	bare := write("bare.esl", uefivartest.List(uefivar.CertSHA256, nobody[:]))
	newer := write("sbat-newer.txt", []byte("sbat,1,2025051000\nshim,4\ngrub,6\n"))
	efivarfs := write("SbatLevelRT", append([]byte{0x06, 0, 0, 0}, "sbat,1,2024010900\nshim,4\ngrub,5\n"...))
	twice := write("sbat-twice.txt", []byte("sbat,1,2025051000\ngrub,6\ngrub,4\n"))
	truncated := write("cut.bin", kek.Authenticated(t, at, uefivartest.List(uefivar.CertSHA256, nobody[:]))[:30])

	for _, tc := range []struct {
		name   string
		args   []string
		code   int      // of revoke
		says   []string // on revoke's standard error
		refuse string   // check's refusal of the log by the new policy; "" admitted
	}{
		{name: "a revoked GRUB, in an update as published", args: []string{"--dbx-update", revokedGrub},
			says:   []string{"an authenticated variable (EFI_VARIABLE_AUTHENTICATION_2, 2025-02-18T00:00:00Z)", "CN=nodeproof lab KEK", "not verified", "2 image hash(es)", "deniedDigests: 2 revoked image digest(s) added"},
			refuse: "BootComponentDenied"},
		{name: "a revoked signer: Debian's CA", args: []string{"--dbx-update", revokedCA},
			says:   []string{"Debian Secure Boot CA", debianCA, "bootComponents.bootloader.signedBy lists " + debianCA},
			refuse: "BootSignerDenied"},
		{name: "an SbatLevel newer than the shim's", args: []string{"--sbat-level", newer},
			says: []string{"SbatLevel of 2025051000: grub 6, shim 4", "minimumSBAT.grub: raised from 5 to 6"}, refuse: "SBATLevelOutdated"},
		{name: "the shim's own SbatLevelRT, copied from efivarfs", args: []string{"--sbat-level", efivarfs},
			says: []string{"an efivarfs copy", "already holds every revocation"}},
		{name: "bare lists, the node's dbx required to hold them", args: []string{"--dbx-update", bare, "--require-dbx"},
			says: []string{"bare EFI_SIGNATURE_LISTs", "minimumDBX.contains: 1 hash(es) added"}, refuse: "DBXOutdated"},
		{name: "bare lists of what this machine did not boot", args: []string{"--dbx-update", bare}, says: []string{"deniedDigests: 1"}},
		{name: "a truncated update", args: []string{"--dbx-update", truncated}, code: 1, says: []string{"truncated"}},
		{name: "an SbatLevel naming grub twice", args: []string{"--sbat-level", twice}, code: 1, says: []string{"twice"}},
		{name: "--require-dbx without an update", args: []string{"--sbat-level", newer, "--require-dbx"}, code: 2},
		{name: "nothing to revoke", args: nil, code: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml")
			args := append(append([]string{"policy", "revoke", "--pool", "worker", "-o", out}, tc.args...), pol)
			var stdout, stderr bytes.Buffer
			if code := Run(ctx, args, &stdout, &stderr); code != tc.code {
				t.Fatalf("revoke: exit %d, want %d\n%s", code, tc.code, stderr.String())
			}
			for _, s := range tc.says {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("revoke does not say %q:\n%s", s, stderr.String())
				}
			}
			if tc.code != 0 {
				if _, err := os.Stat(out); err == nil {
					t.Fatal("a refused revocation wrote a policy")
				}
				return
			}
			stdout.Reset()
			stderr.Reset()
			code := Run(ctx, []string{"policy", "check", "--document-only", "--pool", "worker", "--event-log", logFile, out}, &stdout, &stderr)
			switch {
			case tc.refuse == "" && code != 0:
				t.Fatalf("check: exit %d, want the machine admitted\n%s%s", code, stdout.String(), stderr.String())
			case tc.refuse != "" && (code != 1 || !strings.Contains(stdout.String(), "refused by pools.worker")):
				t.Fatalf("check: exit %d, want the machine refused %s\n%s%s", code, tc.refuse, stdout.String(), stderr.String())
			case tc.refuse != "" && !strings.Contains(stdout.String(), "  "+tc.refuse+"\t"):
				t.Fatalf("check: refused, not %s:\n%s", tc.refuse, stdout.String())
			}
		})
	}
}
