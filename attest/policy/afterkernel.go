package policy

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
)

// What runs after the boot loader hands over: the kernel command line,
// GRUB's commands and the files GRUB read. A signer rule on the kernel
// says nothing of them — the initramfs is not signed in a shim → GRUB →
// kernel chain, and grub.cfg and the command line are plain text — so a
// pool that takes TPM evidence says what it accepts of each, or any: true
// explicitly (a policy without them does not load).

// KernelCmdline judges the kernel command line as GRUB measured it (the
// kernel's path, then its arguments; attest.BootState.KernelCmdline).
// Words are compared split at spaces with GRUB's quotes taken out (where
// GRUB puts them is not what it measured for the linux command), so a
// quote can neither hide a word nor join two.
type KernelCmdline struct {
	// Exact lists whole command lines: the measured one must be one of
	// them word for word, in order, but for the words Variable allows.
	Exact []string `yaml:"exact"`
	// Variable are patterns (path.Match, on a whole word: "ip=*",
	// "nodeproof.*") of words that may differ from Exact: present, absent
	// or of another value. Only with exact.
	Variable []string `yaml:"variable"`
	// Require lists words the command line must hold, and Forbid words
	// it must not. Alone they judge only the words they list
	// (`policy check` warns): rd.break=pre-mount passes a forbid list of
	// init=/bin/sh.
	Require []string `yaml:"require"`
	Forbid  []string `yaml:"forbid"`
	// Any accepts any command line, or none measured (explicit; logged at
	// start).
	Any bool `yaml:"any"`
}

// GrubRules judge what GRUB ran and read, each as the exact sequence of a
// known boot.
type GrubRules struct {
	// Files are the files GRUB read (PCR 9), in the order it read them:
	// each the digest of its contents (in the quoted bank) and its path (a
	// name for messages: the path is not measured). The machine must have
	// read exactly these.
	Files []GrubFile `yaml:"files"`
	// Commands are GRUB's commands (PCR 8) as it measured them, in order.
	// The machine must have run exactly these, but for the kernel command
	// line (the linux command's arguments, and the command line GRUB
	// measures for the kernel), which kernelCmdline judges.
	Commands []string `yaml:"commands"`
	// Any accepts whatever GRUB ran and read (explicit; logged at start).
	Any bool `yaml:"any"`
}

// GrubFile is one file GRUB read.
type GrubFile struct {
	Path   string `yaml:"path"`
	Digest string `yaml:"digest"`
}

// kernelCmdlineList and grubList are the two rules as allow-lists with
// their explicit any: a pool that takes TPM evidence must say something
// of each.
func (t TPMPolicy) kernelCmdlineList() AllowList {
	k := t.KernelCmdline
	if k == nil {
		k = &KernelCmdline{}
	}
	return AllowList{Field: "tpm.kernelCmdline", AnyField: "tpm.kernelCmdline.any",
		What: "kernel command lines (exact, or words in require and forbid)", Items: slices.Concat(k.Exact, k.Require, k.Forbid), Any: k.Any,
		Open: "tpm.kernelCmdline.any: any kernel command line (init=/bin/sh included)"}
}

func (t TPMPolicy) grubList() AllowList {
	g := t.Grub
	if g == nil {
		g = &GrubRules{}
	}
	items := slices.Clone(g.Commands)
	for _, f := range g.Files {
		items = append(items, f.Digest)
	}
	return AllowList{Field: "tpm.grub", AnyField: "tpm.grub.any",
		What: "files GRUB read (files) and commands it ran (commands)", Items: items, Any: g.Any,
		Open: "tpm.grub.any: any grub.cfg and initramfs"}
}

// checkKernelCmdline judges the command line by k (at: its setting).
func checkKernelCmdline(at string, k *KernelCmdline, b *attest.BootState) error {
	if k == nil {
		return attest.DenySetting(attest.ReasonPolicyKernelCmdline, at, "%s is not set: list the command lines it accepts (exact), or set %s.any: true", at, at)
	}
	if k.Any {
		return nil
	}
	if len(k.Exact) == 0 && len(k.Require) == 0 && len(k.Forbid) == 0 {
		return attest.DenySetting(attest.ReasonPolicyKernelCmdline, at, "%s lists nothing: it accepts no command line (any: true accepts any)", at)
	}
	if !b.KernelCmdlineKnown {
		return attest.DenySetting(attest.ReasonPolicyKernelCmdline, at, "the event log does not establish the kernel command line (GRUB measured none, several linux commands, or a text that does not hash to its digest), which %s needs", at)
	}
	args := cmdlineWords(b.KernelCmdline)
	for _, r := range k.Require {
		if !slices.Contains(args, r) {
			return attest.DenySetting(attest.ReasonPolicyKernelCmdline, at+".require", "kernel command line lacks %q, which %s.require requires", r, at)
		}
	}
	for _, f := range k.Forbid {
		if slices.Contains(args, f) {
			return attest.DenySetting(attest.ReasonPolicyKernelCmdline, at+".forbid", "kernel command line has %q, which %s.forbid forbids", f, at)
		}
	}
	if len(k.Exact) == 0 {
		return nil
	}
	got := fixedWords(args, k.Variable)
	for _, e := range k.Exact {
		if slices.Equal(got, fixedWords(cmdlineWords(e), k.Variable)) {
			return nil
		}
	}
	return attest.DenySetting(attest.ReasonPolicyKernelCmdline, at+".exact", "kernel command line %q is not one %s.exact lists: %s", truncateText(b.KernelCmdline, 200), at, wordDiff(got, fixedWords(cmdlineWords(k.Exact[0]), k.Variable), "exact[0]"))
}

// cmdlineWords are a command line's words: split at spaces, GRUB's
// quotes taken out.
func cmdlineWords(s string) []string { return strings.Fields(strings.ReplaceAll(s, `"`, "")) }

// fixedWords are words without those a variable pattern matches.
func fixedWords(words, variable []string) []string {
	out := make([]string, 0, len(words))
	for _, w := range words {
		if !slices.ContainsFunc(variable, func(p string) bool { ok, _ := path.Match(p, w); return ok }) {
			out = append(out, w)
		}
	}
	return out
}

// wordDiff says how got differs from want: the words it has that want
// lacks, those it lacks, or that the order differs.
func wordDiff(got, want []string, name string) string {
	var extra, missing []string
	for _, w := range got {
		if !slices.Contains(want, w) {
			extra = append(extra, w)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			missing = append(missing, w)
		}
	}
	var parts []string
	if len(extra) > 0 {
		parts = append(parts, fmt.Sprintf("it has %s, which %s does not", quoteAll(extra), name))
	}
	if len(missing) > 0 {
		parts = append(parts, fmt.Sprintf("it lacks %s, which %s has", quoteAll(missing), name))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("its words are %s's in another order or number", name)
	}
	return strings.Join(parts, "; ")
}

func quoteAll(words []string) string {
	const most = 8
	q := make([]string, 0, min(len(words), most))
	for i, w := range words {
		if i == most {
			q = append(q, fmt.Sprintf("and %d more", len(words)-most))
			break
		}
		q = append(q, fmt.Sprintf("%q", truncateText(w, 80)))
	}
	return strings.Join(q, ", ")
}

func truncateText(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// checkGrubFiles judges the files GRUB read (PCR 9) by g (at: the grub
// setting).
func checkGrubFiles(at string, g *GrubRules, b *attest.BootState) error {
	if g == nil {
		return attest.DenySetting(attest.ReasonPolicyGrubFile, at, "%s is not set: list the files GRUB reads (files) and its commands, or set %s.any: true", at, at)
	}
	if g.Any {
		return nil
	}
	if len(g.Files) == 0 && len(g.Commands) == 0 {
		return attest.DenySetting(attest.ReasonPolicyGrubFile, at, "%s lists nothing: it accepts no boot (any: true accepts any)", at)
	}
	if len(g.Files) == 0 {
		return nil
	}
	at += ".files"
	got := b.GrubFiles
	for i, f := range g.Files {
		if i >= len(got) {
			return attest.DenySetting(attest.ReasonPolicyGrubFile, at, "GRUB did not read %s, which %s[%d] lists: it read %d files", fileName(f.Path), at, i, len(got))
		}
		if !strings.EqualFold(got[i].Digest, f.Digest) {
			return attest.DenySetting(attest.ReasonPolicyGrubFile, at, "GRUB read %s with digest %s where %s[%d] is %s with %s: the file differs", fileName(got[i].Path), got[i].Digest, at, i, fileName(f.Path), f.Digest)
		}
	}
	if len(got) > len(g.Files) {
		x := got[len(g.Files)]
		return attest.DenySetting(attest.ReasonPolicyGrubFile, at, "GRUB read %s (digest %s) after the %d files %s lists", fileName(x.Path), x.Digest, len(g.Files), at)
	}
	return nil
}

func fileName(p string) string {
	if p == "" {
		return "a file the log does not name"
	}
	return fmt.Sprintf("%q", truncateText(p, 120))
}

// checkGrubCommands judges GRUB's commands (PCR 8) by g, the kernel
// command line aside (at: the grub setting).
func checkGrubCommands(at string, g *GrubRules, b *attest.BootState) error {
	if g == nil || g.Any || len(g.Commands) == 0 {
		return nil // checkGrubFiles refused a missing rule
	}
	at += ".commands"
	if !b.GrubCommandsKnown {
		return attest.DenySetting(attest.ReasonPolicyGrubCommand, at, "the event log does not establish GRUB's commands (no PCR 8 events, or one whose text does not hash to its digest), which %s needs", at)
	}
	want, wantArgs := g.Commands, listedLinuxArgs(g.Commands)
	got, gotArgs := b.GrubCommands, listedLinuxArgs(b.GrubCommands)
	for i, w := range want {
		if i >= len(got) {
			return attest.DenySetting(attest.ReasonPolicyGrubCommand, at, "GRUB did not run %q, which %s[%d] lists: it ran %d commands", truncateText(w, 120), at, i, len(got))
		}
		if sameCommand(w, got[i], wantArgs, gotArgs) {
			continue
		}
		return attest.DenySetting(attest.ReasonPolicyGrubCommand, at, "GRUB ran %q where %s[%d] is %q", truncateText(got[i], 160), at, i, truncateText(w, 160))
	}
	if len(got) > len(want) {
		return attest.DenySetting(attest.ReasonPolicyGrubCommand, at, "GRUB ran %q after the %d commands %s lists", truncateText(got[len(want)], 160), len(want), at)
	}
	return nil
}

// listedLinuxArgs are the arguments of the one linux command of a
// sequence ("" when there is none or several).
func listedLinuxArgs(cmds []string) string {
	var args []string
	for _, c := range cmds {
		if a, ok := attest.LinuxCommandArgs(c); ok {
			args = append(args, a)
		}
	}
	if len(args) != 1 {
		return ""
	}
	return args[0]
}

// sameCommand compares a listed command with a measured one: equal, or
// both the linux command with the same command word (its arguments are
// the kernel command line's), or both the command line GRUB measures for
// the kernel (the linux command's arguments, GRUB's quotes aside).
func sameCommand(want, got, wantArgs, gotArgs string) bool {
	if want == got {
		return true
	}
	if _, ok := attest.LinuxCommandArgs(want); ok {
		w, _, _ := strings.Cut(want, " ")
		g, _, _ := strings.Cut(got, " ")
		_, isLinux := attest.LinuxCommandArgs(got)
		return isLinux && w == g
	}
	unquote := func(s string) string { return strings.ReplaceAll(s, `"`, "") }
	return wantArgs != "" && gotArgs != "" && unquote(want) == wantArgs && unquote(got) == gotArgs
}

// Predicted is what GRUB will measure for a boot made of files, not yet
// booted (attest/grubcfg with the files' digests): its commands, the
// files it reads and the kernel command line, as GrubRules and
// KernelCmdline.Exact write them.
type Predicted struct {
	Commands      []string
	Files         []GrubFile
	KernelCmdline string
}

// Prefix is what learned GRUB rules say GRUB runs and reads before its
// grub.cfg — its built-in configuration, which comes with the GRUB image
// and the disk, not with a kernel or initramfs update: the commands up to
// and including the first that reads a configuration file (source,
// configfile), the files read before that file, and the file's path as
// GRUB named it. An error when the rules show no such command.
func (g *GrubRules) Prefix() (cmds []string, files []GrubFile, cfgPath string, err error) {
	if g == nil || g.Any || len(g.Commands) == 0 {
		return nil, nil, "", fmt.Errorf("no GRUB commands learned from a booted machine: what GRUB runs before grub.cfg (its built-in configuration) is not known; learn the pool from a machine first (policy learn --event-log)")
	}
	for i, c := range g.Commands {
		for _, verb := range []string{"source ", "configfile "} {
			if p, ok := strings.CutPrefix(c, verb); ok {
				cfgPath = strings.TrimSpace(p)
				for j, f := range g.Files {
					if f.Path == cfgPath {
						return slices.Clone(g.Commands[:i+1]), slices.Clone(g.Files[:j]), cfgPath, nil
					}
				}
				return nil, nil, "", fmt.Errorf("GRUB's learned command %q reads %s, but no file GRUB read has that path", truncateText(c, 120), cfgPath)
			}
		}
	}
	return nil, nil, "", fmt.Errorf("none of the %d GRUB commands learned reads a configuration file (source, configfile): where grub.cfg begins is not known", len(g.Commands))
}
