package cli

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/attest/uki"
	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/safetext"
)

// efiFlag is --efi [STAGE=]FILE, repeatable.
type efiFlag []string

func (f *efiFlag) String() string     { return strings.Join(*f, ",") }
func (f *efiFlag) Set(v string) error { *f = append(*f, v); return nil }

// efiFile is one boot file and the stage it is.
type efiFile struct {
	path, stage string
	img         *bootimage.Image
}

// readEFIFiles reads each --efi argument: the stage given (STAGE=FILE),
// or the one the image says it is (bootimage's Stage).
func readEFIFiles(args []string) ([]efiFile, error) {
	var out []efiFile
	for _, a := range args {
		stage, path, given := strings.Cut(a, "=")
		if !given || strings.ContainsAny(stage, `/\.`) {
			stage, path = "", a
		}
		img, err := bootimage.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("--efi %s: %w", a, err)
		}
		if stage == "" {
			if stage = img.Stage(); stage == "" {
				return nil, fmt.Errorf("--efi %s: the file does not say which boot stage it is; say it: --efi shim=%s, bootloader=…, kernel=…, uki=…", path, path)
			}
		}
		switch stage {
		case bootimage.StageShim, bootimage.StageBootloader, bootimage.StageKernel:
		case bootimage.StageUKI:
			if img.UKI == nil {
				return nil, fmt.Errorf("--efi %s: not a unified kernel image: it has no .linux section", a)
			}
		default:
			return nil, fmt.Errorf("--efi %s: no boot stage %q (shim, bootloader, kernel, uki)", a, stage)
		}
		out = append(out, efiFile{path: path, stage: stage, img: img})
	}
	return out, nil
}

// efiLearn is what `policy learn` learns from files: the boot files
// (--efi), what runs after the boot loader (--initrd, --grub-cfg,
// --grub-file, --kernel-cmdline, --bank), where it goes (--pool, --merge,
// --reference-set, --not-after) and a kernel floor (--minimum-kernel).
type efiLearn struct {
	files                  []string
	digests                bool
	pool, merge, out       string
	after                  afterFiles
	referenceSet, notAfter string
	minimumKernel          string
	ukiPool                bool
}

// cmdPolicyLearnEFI is `nodeproof policy learn --efi FILE...`: reference
// values from the boot files themselves. It writes a draft of comments
// naming, per stage, each file's Authenticode digest, its signers and the
// certificates their signatures carry, a kernel's version, the shim's
// vendor certificate (what verifies GRUB and the kernel) and SBAT data;
// for a unified kernel image (stage uki) also its os-release, its
// kernel's version and command line, and the sections systemd-stub
// measures into PCR 11 with the PCR 11 value they give. A UKI's signers
// (and with --digests its digest) go into the pool's tpm.uki; a pool that
// judges GRUB's chain becomes a UKI pool only with --uki-pool.
// With --pool and --merge (an existing pool) it adds to that pool (or to
// --reference-set's set) the files' signer rules (efiSigners), the
// SbatLevel the shim applies as minimumSBAT, each kernel's version under
// its digest (minimumKernel.versions), with --digests their Authenticode
// digests too, and with --grub-cfg (--initrd, --grub-file) what GRUB will
// measure for them (predictAfter), and writes that policy after the
// comments.
func cmdPolicyLearnEFI(o efiLearn, stdout, stderr io.Writer) error {
	if (o.pool == "") != (o.merge == "") {
		return errors.New("policy learn --efi: --pool and --merge go together (the policy whose pool gets the files' signers)")
	}
	if o.pool == "" && (o.digests || o.after.given() || o.referenceSet != "" || o.minimumKernel != "") {
		return errors.New("policy learn --efi: --digests, --initrd, --grub-cfg, --grub-file, --kernel-cmdline, --reference-set and --minimum-kernel write into a pool: --pool and --merge are required")
	}
	if o.notAfter != "" && o.referenceSet == "" {
		return errors.New("policy learn: --not-after is a reference set's: give --reference-set")
	}
	read, err := readEFIFiles(o.files)
	if err != nil {
		return err
	}
	if o.ukiPool && !slices.ContainsFunc(read, func(f efiFile) bool { return f.stage == bootimage.StageUKI }) {
		return errors.New("policy learn --efi: --uki-pool makes a pool judge unified kernel images: give one (--efi uki=FILE)")
	}
	var b strings.Builder
	writeEFIDraft(&b, read)
	doc := []byte(b.String())
	if o.pool != "" {
		cur, err := os.ReadFile(o.merge)
		if err != nil {
			return err
		}
		refs, notes, err := efiReferences(read, o.digests)
		if err != nil {
			return err
		}
		kernel, err := kernelOf(read)
		if err != nil && o.after.grubCfg != "" {
			return err
		}
		if refs.After, err = predictAfter(o.after, kernel, cur, o.pool); err != nil {
			return err
		}
		refs.ReferenceSet, refs.NotAfter, refs.MinimumKernel, refs.UKIPool = o.referenceSet, o.notAfter, o.minimumKernel, o.ukiPool
		learned, more, err := policy.AddReferences(cur, o.pool, refs)
		if err != nil {
			return err
		}
		for _, n := range append(notes, more...) {
			fmt.Fprintln(stderr, "note:", n)
		}
		doc = append(doc, learned...)
	}
	if o.out == "" {
		_, err := stdout.Write(doc)
		return err
	}
	if err := fsutil.WriteFileAtomic(o.out, doc, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s\n", o.out)
	return nil
}

// efiReferences are the files' reference values (policy.References):
// per stage the certificates that may verify each file (efiSigners), its
// Authenticode digest when digests is set, and the SbatLevel a shim
// among them applies (its generations as minimumSBAT).
func efiReferences(files []efiFile, digests bool) (policy.References, []string, error) {
	r := policy.References{Signers: map[string][]string{}, Digests: map[string][]string{}, KernelVersions: map[string]string{}}
	var notes []string
	var vendor []*x509.Certificate
	for _, f := range files {
		if f.stage == bootimage.StageShim {
			vendor = append(vendor, f.img.VendorCerts...)
		}
	}
	for _, f := range files {
		signers, note := efiSigners(f, vendor)
		if len(signers) == 0 {
			return r, nil, fmt.Errorf("--efi %s: not signed: Secure Boot refuses it, and it has no signer to write", f.path)
		}
		if note != "" {
			notes = append(notes, note)
		}
		for _, s := range signers {
			if !slices.Contains(r.Signers[f.stage], s) {
				r.Signers[f.stage] = append(r.Signers[f.stage], s)
			}
		}
		if digests {
			r.Digests[f.stage] = append(r.Digests[f.stage], hex.EncodeToString(f.img.AuthenticodeSHA256))
		}
		if f.stage == bootimage.StageKernel && f.img.KernelVersion != "" {
			r.KernelVersions[hex.EncodeToString(f.img.AuthenticodeSHA256)] = f.img.KernelVersion
		}
		if f.stage == bootimage.StageShim && f.img.SBATLevelAutomatic != "" {
			_, gens, err := tpm.ParseSBATLevel([]byte(f.img.SBATLevelAutomatic))
			if err != nil {
				return r, nil, fmt.Errorf("--efi %s: the SbatLevel it applies: %w", f.path, err)
			}
			if r.MinimumSBAT == nil {
				r.MinimumSBAT = map[string]int{}
			}
			for c, g := range gens {
				r.MinimumSBAT[c] = max(r.MinimumSBAT[c], g)
			}
		}
	}
	return r, notes, nil
}

// efiSigners are the fingerprints of the certificates whose measurement
// as a Secure Boot authority may verify f: for GRUB or a kernel a shim
// vendor certificate (of vendor) issued its signer, that certificate (what
// the shim measures); otherwise each signature's signer and the
// certificates it carries (the db entry that verifies it is one of them,
// or a root they chain to: said in the note).
func efiSigners(f efiFile, vendor []*x509.Certificate) ([]string, string) {
	var out []string
	add := func(c *x509.Certificate) {
		sum := sha256.Sum256(c.Raw)
		if s := hex.EncodeToString(sum[:]); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	chained := false
	for _, s := range f.img.Signatures {
		issued := false
		for _, v := range vendor {
			if f.stage != bootimage.StageShim && s.Signer.CheckSignatureFrom(v) == nil {
				add(v)
				issued = true
			}
		}
		if issued {
			continue
		}
		chained = true
		add(s.Signer)
		for _, c := range s.Certificates {
			add(c)
		}
	}
	if chained && f.stage != bootimage.StageShim {
		return out, fmt.Sprintf("%s (%s): no shim vendor certificate among the files issued its signer: its signer and the certificates it carries are listed; if db or MokList holds a root they chain to, list that instead", f.stage, filepath.Base(f.path))
	}
	return out, ""
}

// writeEFIDraft writes what the files say as YAML comments.
func writeEFIDraft(w io.Writer, files []efiFile) {
	fmt.Fprintln(w, "# nodeproof policy learn --efi: reference values read from the boot files.")
	fmt.Fprintln(w, "# With --pool and --merge, each stage's signers go into the pool's")
	fmt.Fprintln(w, "# bootComponents signedBy and the shim's SbatLevel into minimumSBAT;")
	fmt.Fprintln(w, "# --digests adds the Authenticode digests to the allow lists.")
	fmt.Fprintln(w, "# A unified kernel image (uki) goes into tpm.uki (--uki-pool: a GRUB pool becomes a UKI pool).")
	var vendor []*x509.Certificate
	for _, f := range files {
		if f.stage == bootimage.StageShim {
			vendor = append(vendor, f.img.VendorCerts...)
		}
	}
	for _, f := range files {
		img := f.img
		fmt.Fprintf(w, "#\n# %s: %s (%s)\n", f.stage, filepath.Base(f.path), img.Kind)
		fmt.Fprintf(w, "#   authenticode sha256: %s\n", hex.EncodeToString(img.AuthenticodeSHA256))
		fmt.Fprintf(w, "#   file sha256 (what GRUB measures reading it): %s\n", hex.EncodeToString(img.FileSHA256))
		if img.KernelVersion != "" && img.UKI == nil {
			fmt.Fprintf(w, "#   kernel version: %s\n", safetext.Clean(img.KernelVersion))
		}
		if len(img.Signatures) == 0 {
			fmt.Fprintln(w, "#   not signed: Secure Boot refuses it")
		}
		for i, s := range img.Signatures {
			fmt.Fprintf(w, "#   signature %d (%v): signer %s\n", i+1, s.Hash, certLine(s.Signer))
			for _, c := range s.Certificates {
				if c.Equal(s.Signer) {
					continue
				}
				fmt.Fprintf(w, "#     carries %s\n", certLine(c))
			}
			for _, v := range vendor {
				if f.stage != bootimage.StageShim && s.Signer.CheckSignatureFrom(v) == nil {
					fmt.Fprintf(w, "#     issued by the shim's vendor certificate %s\n", certLine(v))
				}
			}
		}
		for _, v := range img.VendorCerts {
			fmt.Fprintf(w, "#   vendor certificate (verifies GRUB and the kernel): %s\n", certLine(v))
		}
		if img.VendorDBXEntries > 0 || len(img.VendorHashes) > 0 {
			fmt.Fprintf(w, "#   built-in db hashes %d, built-in dbx entries %d\n", len(img.VendorHashes), img.VendorDBXEntries)
		}
		for _, e := range img.SBAT {
			fmt.Fprintf(w, "#   sbat %s,%d (%s %s %s)\n", safetext.Clean(e.Component), e.Generation, safetext.Clean(e.Vendor), safetext.Clean(e.Package), safetext.Clean(e.Version))
		}
		if img.SBATLevelAutomatic != "" {
			fmt.Fprintf(w, "#   SbatLevel it applies: %s\n", oneLine(img.SBATLevelAutomatic))
			fmt.Fprintf(w, "#   SbatLevel latest it knows: %s\n", oneLine(img.SBATLevelLatest))
		}
		if img.UKI != nil {
			writeUKIDraft(w, img.UKI)
		}
	}
}

// writeUKIDraft writes what a unified kernel image holds: its os-release,
// its kernel's version and command line, and the sections systemd-stub
// measures into PCR 11 with the value they give.
func writeUKIDraft(w io.Writer, u *bootimage.UKI) {
	o := u.OSRelease
	fmt.Fprintf(w, "#   os-release: PRETTY_NAME %q, ID %q, VERSION_ID %q", safetext.Clean(o.PrettyName), safetext.Clean(o.ID), safetext.Clean(o.VersionID))
	if o.ImageID != "" || o.ImageVersion != "" {
		fmt.Fprintf(w, ", IMAGE_ID %q, IMAGE_VERSION %q", safetext.Clean(o.ImageID), safetext.Clean(o.ImageVersion))
	}
	fmt.Fprintln(w)
	kv := u.KernelVersion
	if kv == "" {
		kv = "(its .linux names none)"
	}
	fmt.Fprintf(w, "#   embedded kernel (.linux) version: %s\n", safetext.Clean(kv))
	if u.Section(".cmdline") != nil {
		fmt.Fprintf(w, "#   command line (.cmdline): %q\n", safetext.Clean(u.Cmdline))
	}
	fmt.Fprintln(w, "#   a signer rule on this file covers its kernel, initrd and command line: they are signed as one")
	fmt.Fprintf(w, "#   sections systemd-stub 252 measures into PCR %d, in its order (sha256 of each section's name with its NUL, then of its content):\n", uki.PCR)
	for _, s := range u.Sections {
		fmt.Fprintf(w, "#     %-8s %10d bytes sha256:%s\n", s.Name, s.Size, hex.EncodeToString(s.SHA256))
	}
	if u.PCRSig {
		fmt.Fprintln(w, "#     (.pcrsig present: systemd-measure's signature, not measured)")
	}
	for _, phase := range []string{"", "enter-initrd"} {
		v, err := uki.PCR11(u.Measured(), phase)
		if err != nil {
			fmt.Fprintf(w, "#   PCR %d: %s\n", uki.PCR, safetext.Clean(err.Error()))
			return
		}
		what := "after the stub"
		if phase != "" {
			what = "after the stub and a systemd initrd's " + phase
		}
		fmt.Fprintf(w, "#   PCR %d %s: %s\n", uki.PCR, what, hex.EncodeToString(v))
	}
}

// certLine names a certificate: its subject and SHA-256 fingerprint.
func certLine(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return fmt.Sprintf("%q sha256:%s", safetext.Clean(c.Subject.String()), hex.EncodeToString(sum[:]))
}

// oneLine is a SbatLevel's lines on one line (what a file says goes into
// comments: nothing in it may start a line of its own).
func oneLine(level string) string {
	return safetext.Clean(strings.Join(strings.Split(strings.TrimSpace(level), "\n"), "; "))
}
