package cli

import (
	"crypto"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/attest/grubcfg"
	"github.com/nodeproof/nodeproof/attest/policy"
)

// afterFiles are `policy learn`'s files for what runs after the boot
// loader: the initramfs, grub.cfg, other files grub.cfg reads, the
// kernel command line, the bank their digests are in.
type afterFiles struct {
	initrd, grubCfg, cmdline, bank string
	files                          grubFileFlag
}

func (a *afterFiles) given() bool {
	return a.initrd != "" || a.grubCfg != "" || a.cmdline != "" || len(a.files) > 0
}

// grubFileFlag is --grub-file GRUBPATH=FILE, repeatable.
type grubFileFlag []string

func (f *grubFileFlag) String() string     { return strings.Join(*f, ",") }
func (f *grubFileFlag) Set(v string) error { *f = append(*f, v); return nil }

// predictAfter predicts what GRUB will measure for a boot of these files
// (attest/grubcfg), with what GRUB runs before grub.cfg taken from the
// pool's learned rules (policy.GrubRules.Prefix): the commands (that
// prefix, then grub.cfg's), the files it reads (the prefix's, grub.cfg,
// then each file grub.cfg's commands read: the kernel is the --efi
// kernel, the initramfs --initrd, any other --grub-file), the kernel
// command line. Without --grub-cfg only the command line is set
// (--kernel-cmdline), and the pool's GRUB rules are kept.
func predictAfter(a afterFiles, kernel *efiFile, doc []byte, pool string) (*policy.Predicted, error) {
	bank, err := bankHash(a.bank)
	if err != nil {
		return nil, err
	}
	if a.grubCfg == "" {
		if a.initrd != "" || len(a.files) > 0 {
			return nil, errors.New("--initrd and --grub-file need --grub-cfg: what GRUB reads, and in what order, is what grub.cfg says")
		}
		if a.cmdline == "" {
			return nil, nil
		}
		return &policy.Predicted{KernelCmdline: a.cmdline}, nil
	}
	p, err := policy.Parse(doc)
	if err != nil {
		return nil, fmt.Errorf("--merge: %w", err)
	}
	pp, ok := p.Pools[pool]
	if !ok {
		return nil, fmt.Errorf("pool %s is not in the policy to merge into", pool)
	}
	prefixCmds, prefixFiles, cfgPath, err := pp.TPM.Grub.Prefix()
	if err != nil {
		return nil, fmt.Errorf("--grub-cfg: pools.%s.tpm.grub: %w", pool, err)
	}
	cfg, err := os.ReadFile(a.grubCfg)
	if err != nil {
		return nil, err
	}
	// What GRUB's built-in configuration leaves set: the directory and the
	// device it found grub.cfg on.
	vars := map[string]string{"prefix": path.Dir(cfgPath)}
	if dev, _, ok := strings.Cut(strings.TrimPrefix(cfgPath, "("), ")"); ok && strings.HasPrefix(cfgPath, "(") {
		vars["root"] = dev
	}
	m, err := grubcfg.Run(cfg, vars)
	if err != nil {
		return nil, fmt.Errorf("--grub-cfg %s: %w", a.grubCfg, err)
	}
	if a.cmdline != "" && a.cmdline != m.KernelCmdline {
		return nil, fmt.Errorf("--kernel-cmdline %q is not the command line grub.cfg gives the kernel (%q)", a.cmdline, m.KernelCmdline)
	}
	given := map[string]string{}
	for _, f := range a.files {
		gp, local, ok := strings.Cut(f, "=")
		if !ok || gp == "" || local == "" {
			return nil, fmt.Errorf("--grub-file %q: want GRUBPATH=FILE", f)
		}
		given[gp] = local
	}
	out := &policy.Predicted{KernelCmdline: m.KernelCmdline, Commands: append(prefixCmds, m.Commands...), Files: prefixFiles}
	out.Files = append(out.Files, policy.GrubFile{Path: cfgPath, Digest: fileDigest(bank, cfg)})
	initrds := 0
	for _, gp := range m.Files {
		local, ok := given[gp]
		switch {
		case ok:
		case gp == m.KernelPath && kernel != nil:
			local = kernel.path
		case gp != m.KernelPath && a.initrd != "" && initrds == 0:
			local = a.initrd
			initrds++
		case gp == m.KernelPath:
			return nil, fmt.Errorf("grub.cfg boots the kernel %s: give it with --efi kernel=FILE", gp)
		default:
			return nil, fmt.Errorf("grub.cfg reads %s: give it with --initrd FILE or --grub-file %s=FILE", gp, gp)
		}
		b, err := os.ReadFile(local)
		if err != nil {
			return nil, err
		}
		out.Files = append(out.Files, policy.GrubFile{Path: gp, Digest: fileDigest(bank, b)})
	}
	return out, nil
}

func bankHash(bank string) (crypto.Hash, error) {
	switch bank {
	case "", "sha256":
		return crypto.SHA256, nil
	case "sha1":
		return crypto.SHA1, nil
	case "sha384":
		return crypto.SHA384, nil
	}
	return 0, fmt.Errorf("--bank %q: want sha256, sha384 or sha1", bank)
}

func fileDigest(bank crypto.Hash, b []byte) string {
	switch bank {
	case crypto.SHA1:
		s := sha1.Sum(b)
		return hex.EncodeToString(s[:])
	case crypto.SHA384:
		s := sha512.Sum384(b)
		return hex.EncodeToString(s[:])
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// kernelOf is the one kernel among the --efi files (nil with none, an
// error with several: which does grub.cfg boot?).
func kernelOf(files []efiFile) (*efiFile, error) {
	var k *efiFile
	for i := range files {
		if files[i].stage == bootimage.StageKernel {
			if k != nil {
				return nil, errors.New("--grub-cfg: two --efi kernels: give the one grub.cfg boots (another release is another policy learn)")
			}
			k = &files[i]
		}
	}
	return k, nil
}
