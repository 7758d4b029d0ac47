package liveboot

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/internal/testenv"
)

func TestModuleClosure(t *testing.T) {
	mods := map[string]module{
		"virtio_ring": {}, "virtio": {depends: []string{"virtio_ring"}},
		"virtio_pci": {depends: []string{"virtio_ring", "virtio"}}, "failover": {},
		"net_failover": {depends: []string{"failover"}}, "virtio_net": {depends: []string{"virtio", "net_failover", "virtio_ring"}},
		"a": {depends: []string{"b"}}, "b": {depends: []string{"a"}},
	}
	for _, c := range []struct {
		name  string
		roots []string
		want  []string
		err   string
	}{
		{"dependencies first, each once", []string{"virtio_pci", "virtio_net"}, []string{"virtio_ring", "virtio", "virtio_pci", "failover", "net_failover", "virtio_net"}, ""},
		{"a module the kernel lacks", []string{"virtio_gpu"}, nil, "no module virtio_gpu"},
		{"a cycle", []string{"a"}, nil, "cycle: a -> b -> a"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := moduleClosure(mods, c.roots)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("%v; want an error with %q", err, c.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("%v %v; want %v", got, err, c.want)
			}
		})
	}
}

// TestModuleDepends reads depends= from the cached kernel's modules (make
// tools fetches them) and from a file that is not a module.
func TestModuleDepends(t *testing.T) {
	parts, err := LoadParts(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string][]string{}
	for _, p := range parts.ModulePaths() {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		deps, err := ModuleDepends(b)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		byName[ModuleName(p)] = deps
	}
	if d := byName["net_failover"]; !slices.Equal(d, []string{"failover"}) {
		t.Errorf("net_failover depends on %v; want failover", d)
	}
	if d := byName["virtio_net"]; !slices.Contains(d, "net_failover") || !slices.Contains(d, "virtio") {
		t.Errorf("virtio_net depends on %v", d)
	}
	if _, err := ModuleDepends([]byte("not an ELF file")); err == nil {
		t.Error("a file that is not a module read")
	}
}

func TestCleanLine(t *testing.T) {
	for in, want := range map[string]string{
		"\x1b[0m\x1b[30m\x1b[47mWelcome to GRUB!\r": "Welcome to GRUB!",
		"\x1b[2J\x1b[01;01HBdsDxe: loading":         "BdsDxe: loading",
		"plain\ttext":                               "plain\ttext",
		"bell\a and NUL\x00":                        "bell and NUL",
	} {
		if got := cleanLine(in); got != want {
			t.Errorf("cleanLine(%q) = %q; want %q", in, got, want)
		}
	}
}

func TestGrubConfig(t *testing.T) {
	efi := string(GrubConfig(true, "console=ttyS0"))
	if !strings.Contains(efi, "linuxefi /vmlinuz console=ttyS0\ninitrdefi /initrd.img\n") {
		t.Errorf("linuxefi config:\n%s", efi)
	}
	plain := string(GrubConfig(false, "console=ttyS0"))
	if !strings.Contains(plain, "\nlinux /vmlinuz console=ttyS0\ninitrd /initrd.img\n") {
		t.Errorf("linux config:\n%s", plain)
	}
}
