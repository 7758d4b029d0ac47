package uki_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest/uki"
)

// ukiFiles are small sections' contents, the same bytes the recorded
// systemd-measure runs were given (files written with printf).
var ukiFiles = map[string]string{
	".linux":   "not a kernel, only bytes",
	".osrel":   "ID=test\n",
	".cmdline": "quiet",
	".initrd":  "initrd bytes",
	".splash":  "splash",
	".pcrpkey": "-----BEGIN PUBLIC KEY-----\n",
}

// systemdMeasure is systemd 252's systemd-measure on this machine, or "".
func systemdMeasure() string {
	for _, p := range []string{"/usr/lib/systemd/systemd-measure", "/lib/systemd/systemd-measure"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// TestPCR11 holds the prediction to systemd-measure 252's: values it
// printed for these files (`systemd-measure calculate --bank=sha256
// --phase=…`, systemd 252.39-1~deb12u2), and, where systemd-measure is
// installed, what it prints now.
func TestPCR11(t *testing.T) {
	all := []string{".linux", ".osrel", ".cmdline", ".initrd", ".splash", ".pcrpkey"}
	for _, tc := range []struct {
		name     string
		sections []string
		phase    string
		want     string // systemd-measure 252.39's output
	}{
		{"every section, no phase", all, "", "8e0c2be75c7dffd53a69641f3995a500ad28b17821d6051ca579e108336b8c6a"},
		{"every section, entered the initrd", all, "enter-initrd", "6395ab9273ec413a14632b4acfe060eadf4d2a4489d89d2ac01bc622e1a2b40f"},
		{"every section, the system ready", all, "enter-initrd:leave-initrd:sysinit:ready", "91d8484eed71aab40d9d9c56e2e94ff66c573105a3ffc9131de138ca118e67f5"},
		{".linux alone", []string{".linux"}, "", "cccf4d5f1b8a07e17bb52d6409d5513d299741efc481611daddb261535ae5504"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var secs []uki.Section
			for _, n := range tc.sections {
				s := sha256.Sum256([]byte(ukiFiles[n]))
				secs = append(secs, uki.Section{Name: n, SHA256: s[:]})
			}
			got, err := uki.PCR11(secs, tc.phase)
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(got) != tc.want {
				t.Errorf("PCR 11 %x; systemd-measure 252 said %s", got, tc.want)
			}
			events, _ := uki.Events(secs)
			if len(events) != 2*len(secs) || events[0].Section != ".linux" || events[0].Content || !events[1].Content {
				t.Errorf("events %+v", events)
			}
			m := systemdMeasure()
			if m == "" {
				t.Log("systemd-measure is not installed: the recorded values only")
				return
			}
			args := []string{"calculate", "--bank=sha256", "--phase=" + tc.phase}
			dir := t.TempDir()
			for _, n := range tc.sections {
				p := filepath.Join(dir, n[1:])
				if err := os.WriteFile(p, []byte(ukiFiles[n]), 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--"+n[1:]+"="+p)
			}
			out, err := exec.Command(m, args...).Output()
			if err != nil {
				t.Fatalf("systemd-measure: %v", err)
			}
			if line := strings.TrimSpace(string(out)); line != "11:sha256="+hex.EncodeToString(got) {
				t.Errorf("systemd-measure says %q; predicted %x", line, got)
			}
		})
	}
}

func TestEventsRefused(t *testing.T) {
	d := make([]byte, sha256.Size)
	for _, tc := range []struct {
		name     string
		sections []uki.Section
	}{
		{"out of the stub's order", []uki.Section{{".osrel", d}, {".linux", d}}},
		{"twice", []uki.Section{{".linux", d}, {".linux", d}}},
		{".pcrsig, which the stub does not measure", []uki.Section{{".linux", d}, {".pcrsig", d}}},
		{".uname, which 252 does not know", []uki.Section{{".linux", d}, {".uname", d}}},
		{"a digest not SHA-256's", []uki.Section{{".linux", d[:20]}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := uki.Events(tc.sections); err == nil {
				t.Fatal("accepted")
			}
			if _, err := uki.PCR11(tc.sections, ""); err == nil {
				t.Fatal("PCR11 accepted")
			}
		})
	}
}

// TestNameDigest: the name's event is the name with its NUL (sha256sum
// of printf '.linux\0').
func TestNameDigest(t *testing.T) {
	const want = "0da293e37ad5511c59be47993769aacb91b243f7d010288e118dc90e95aaef5a"
	if got := hex.EncodeToString(uki.NameDigest(".linux")); got != want {
		t.Fatalf("%s; want %s", got, want)
	}
}
