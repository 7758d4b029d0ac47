package grubcfg_test

import (
	"crypto"
	"slices"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/attest/grubcfg"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// liveGrubCfg is the grub.cfg internal/liveboot writes (GrubConfig with
// linuxefi), whose boot firmware-testdata keeps.
const liveGrubCfg = "set timeout=0\nlinuxefi /vmlinuz console=ttyS0 quiet panic=-1\ninitrdefi /initrd.img\nboot\n"

// TestRunPredictsALiveBoot: what Run predicts for the live boot's
// grub.cfg is what GRUB measured into PCR 8 after sourcing it, and the
// files it read after grub.cfg, in the live boot's own log.
func TestRunPredictsALiveBoot(t *testing.T) {
	bs, err := tpm.LogBootState(firmwaretestdata.MustLog("debian-12-ovmf-secure-boot"), crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	m, err := grubcfg.Run([]byte(liveGrubCfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	src := slices.IndexFunc(bs.GrubCommands, func(c string) bool { return strings.HasPrefix(c, "source ") })
	if src < 0 {
		t.Fatalf("the live log's commands %q source no grub.cfg", bs.GrubCommands)
	}
	if got := bs.GrubCommands[src+1:]; !slices.Equal(m.Commands, got) {
		t.Errorf("predicted commands %q; the live boot ran %q", m.Commands, got)
	}
	var paths []string
	for _, f := range bs.GrubFiles[1:] { // after grub.cfg itself
		paths = append(paths, f.Path)
	}
	if !slices.Equal(m.Files, paths) {
		t.Errorf("predicted files %q; the live boot read %q", m.Files, paths)
	}
	if m.KernelCmdline != bs.KernelCmdline {
		t.Errorf("predicted command line %q; the live boot's %q", m.KernelCmdline, bs.KernelCmdline)
	}
}

func TestRun(t *testing.T) {
	cases := []struct {
		name     string
		cfg      string
		vars     map[string]string
		commands []string
		files    []string
		cmdline  string
		err      string // in the error; "" none
	}{
		{"comments and blank lines are not measured", "# a comment\n\n  set timeout=5 # trailing\n", nil, []string{"set timeout=5"}, nil, "", ""},
		{"variables and quotes", "set k=/vmlinuz-6.1\nset root='(hd0,gpt2)'\nlinux ${k} root=$root \"quiet\"\n", nil,
			[]string{"set k=/vmlinuz-6.1", "set root=(hd0,gpt2)", "linux /vmlinuz-6.1 root=(hd0,gpt2) quiet", "/vmlinuz-6.1 root=(hd0,gpt2) quiet"},
			[]string{"/vmlinuz-6.1"}, "/vmlinuz-6.1 root=(hd0,gpt2) quiet", ""},
		{"a variable GRUB set before", "linux $prefix/vmlinuz ro\n", map[string]string{"prefix": "(hd0,gpt1)"},
			[]string{"linux (hd0,gpt1)/vmlinuz ro", "(hd0,gpt1)/vmlinuz ro"}, []string{"(hd0,gpt1)/vmlinuz"}, "(hd0,gpt1)/vmlinuz ro", ""},
		{"a bare assignment", "defaultA=2\n", nil, []string{"defaultA=2"}, nil, "", ""},
		{"two initrds", "linux /k ro\ninitrd /ucode.img /initrd.img\n", nil,
			[]string{"linux /k ro", "/k ro", "initrd /ucode.img /initrd.img"}, []string{"/k", "/ucode.img", "/initrd.img"}, "/k ro", ""},
		{"an unset variable is empty", "set a=$nothing.x\n", nil, []string{"set a=.x"}, nil, "", ""},
		{"if", "if [ -e /x ]; then\n  linux /k\nfi\n", nil, nil, nil, "", `line 1: "if"`},
		{"a menu entry", "menuentry 'Debian' {\n linux /k\n}\n", nil, nil, nil, "", `line 1: "menuentry"`},
		{"another file", "set x=1\nsource /boot/grub/other.cfg\n", nil, nil, nil, "", `line 2: "source"`},
		{"grubenv", "load_env\n", nil, nil, nil, "", "grubenv"},
		{"BLS entries", "blscfg\n", nil, nil, nil, "", "BootLoaderSpec"},
		{"an argument GRUB quotes again", "linux /k \"a b\"\n", nil, nil, nil, "", "quotes again"},
		{"two linux commands", "linux /k\nlinux /k2\n", nil, nil, nil, "", "second linux"},
		{"linux without a kernel", "linux\n", nil, nil, nil, "", "without a kernel"},
		{"an unterminated quote", "set a='x\n", nil, nil, nil, "", "unterminated"},
		{"a continued line", "set a=x \\\n", nil, nil, nil, "", "continued"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := grubcfg.Run([]byte(tc.cfg), tc.vars)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v; want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(m.Commands, tc.commands) || !slices.Equal(m.Files, tc.files) || m.KernelCmdline != tc.cmdline {
				t.Errorf("got commands %q files %q cmdline %q; want %q %q %q", m.Commands, m.Files, m.KernelCmdline, tc.commands, tc.files, tc.cmdline)
			}
		})
	}
}

// FuzzRun: any input is predicted or refused with an error, never a
// panic; a prediction's kernel command line is its linux command's
// arguments, and each file it reads is a word of a command it ran.
func FuzzRun(f *testing.F) {
	f.Add([]byte(liveGrubCfg))
	f.Add([]byte("set a=$b\nlinux ${a}/k 'x'\ninitrd /i\n"))
	f.Fuzz(func(t *testing.T, cfg []byte) {
		m, err := grubcfg.Run(cfg, map[string]string{"prefix": "(hd0)"})
		if err != nil {
			return
		}
		if m.KernelCmdline != "" && !slices.ContainsFunc(m.Commands, func(c string) bool { return strings.HasSuffix(c, " "+m.KernelCmdline) }) {
			t.Fatalf("command line %q is no linux command's arguments in %q", m.KernelCmdline, m.Commands)
		}
		for _, f := range m.Files {
			if !slices.ContainsFunc(m.Commands, func(c string) bool { return slices.Contains(strings.Split(c, " "), f) }) {
				t.Fatalf("file %q is in no command %q", f, m.Commands)
			}
		}
	})
}
