package liveboot

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The boot chains the signer tests boot: the same machine (its own
// Secure Boot keys: SignerLab.Vars) booting kernels that Debian signed,
// one Debian signed with the same key, and ones another key signed.
const (
	// ChainDebian (kernel A): Debian's shim, GRUB and kernel as shipped.
	ChainDebian = "debian"
	// ChainDebianPrevious (kernel B): Debian's previous kernel (another
	// image, signed with the same key), after the same shim and GRUB.
	ChainDebianPrevious = "debian-previous"
	// ChainTestDB (kernel C): kernel A re-signed by the test db signer:
	// the same code (the same Authenticode digest), another key; the shim
	// verifies it against db.
	ChainTestDB = "test-db"
	// ChainTestMOK: kernel A re-signed by the test MOK signer; the shim
	// verifies it against its MokList (a machine-owner key).
	ChainTestMOK = "test-mok"
	// ChainTestDBAll: GRUB and kernel A both re-signed by the test db
	// signer: the shim measures one authority for both, so the claims
	// name the kernel's signer (with two, the kernel's is ambiguous).
	ChainTestDBAll = "test-db-all"
)

// Chains lists every chain SignerLab.Chain makes.
var Chains = []string{ChainDebian, ChainDebianPrevious, ChainTestDB, ChainTestMOK, ChainTestDBAll}

// SignerLab is what the signer tests boot with, made once and cached:
// the boot chain and the previous kernel (hack/tools.sh boot-chain), the
// test keys, and a variable store enrolled with them (PK and KEK of the
// tests; db: Microsoft's and the test db CA; dbx: a real one, RealDBX;
// MokList: the test MOK CA).
type SignerLab struct {
	Current, Previous *Parts
	Keys              *SecureBootKeys
	Vars              *VarStore
}

// LoadSignerLab loads the parts (an error says how to fetch them) and
// makes the keys and the enrolled store when the cache lacks them (one
// firmware boot, ~10 s).
func LoadSignerLab(ctx context.Context, cache string, say func(string, ...any)) (*SignerLab, error) {
	cur, err := LoadParts(cache)
	if err != nil {
		return nil, err
	}
	prev, err := LoadPreviousKernel(cache)
	if err != nil {
		return nil, err
	}
	keys, err := EnsureSecureBootKeys(cache)
	if err != nil {
		return nil, err
	}
	dbx, err := RealDBX()
	if err != nil {
		return nil, err
	}
	vars, err := EnsureVars(ctx, cache, keys, dbx, say)
	if err != nil {
		return nil, err
	}
	return &SignerLab{Current: cur, Previous: prev, Keys: keys, Vars: vars}, nil
}

// Chain returns the parts of chain name (Chains), re-signed images
// written under work.
func (l *SignerLab) Chain(ctx context.Context, name, work string) (*Parts, error) {
	p := l.Current.WithKernel(l.Current)
	resign := func(file string, k KeyPair, out string) (string, error) {
		dst := filepath.Join(work, out)
		if err := k.Sign(ctx, file, dst); err != nil {
			return "", err
		}
		return dst, nil
	}
	var err error
	switch name {
	case ChainDebian:
	case ChainDebianPrevious:
		p = l.Current.WithKernel(l.Previous)
	case ChainTestDB:
		p.Kernel, err = resign(p.Kernel, l.Keys.DBSigner, "vmlinuz-test-db")
	case ChainTestMOK:
		p.Kernel, err = resign(p.Kernel, l.Keys.MOKSigner, "vmlinuz-test-mok")
	case ChainTestDBAll:
		if p.Kernel, err = resign(p.Kernel, l.Keys.DBSigner, "vmlinuz-test-db"); err == nil {
			p.Grub, err = resign(p.Grub, l.Keys.DBSigner, "grubx64-test-db.efi")
		}
	default:
		return nil, fmt.Errorf("liveboot: no boot chain %q (%s)", name, strings.Join(Chains, ", "))
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// BootDisk builds the boot disk of chain name for g (its initramfs with
// the chain's kernel's modules, GRUB's linuxefi) under work, and returns
// it with the chain's parts.
func (l *SignerLab) BootDisk(ctx context.Context, name string, g *Guest, work string) (string, *Parts, error) {
	dir := filepath.Join(work, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	p, err := l.Chain(ctx, name, dir)
	if err != nil {
		return "", nil, err
	}
	initramfs := filepath.Join(dir, "initrd.img")
	if err := g.BuildInitramfs(ctx, p, initramfs); err != nil {
		return "", nil, err
	}
	disk := filepath.Join(dir, "boot.img")
	if err := BuildBootDisk(ctx, p, initramfs, true, disk); err != nil {
		return "", nil, err
	}
	return disk, p, nil
}

// EventLog is the firmware's event log the guest left (its
// binary_bios_measurements), if it found one.
func (r *Result) EventLog() ([]byte, bool) {
	b, ok := r.Files["var/lib/liveboot/eventlog.bin"]
	return b, ok
}

// PCRs are the SHA-256 PCRs the guest's kernel showed
// (/sys/class/tpm/tpm0/pcr-sha256/N), lower-case hex by index.
func (r *Result) PCRs() (map[int]string, error) {
	b, ok := r.Files["var/lib/liveboot/pcr-sha256"]
	if !ok {
		return nil, fmt.Errorf("liveboot: the guest left no PCR values")
	}
	out := map[int]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("liveboot: PCR line %q", line)
		}
		i, err := strconv.Atoi(f[0])
		if err != nil || len(f[1]) != 64 {
			return nil, fmt.Errorf("liveboot: PCR line %q", line)
		}
		out[i] = strings.ToLower(f[1])
	}
	if len(out) != 24 {
		return nil, fmt.Errorf("liveboot: %d PCRs from the guest", len(out))
	}
	return out, nil
}
