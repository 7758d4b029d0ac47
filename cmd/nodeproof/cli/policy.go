package cli

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/mcs/rejudge"
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/safetext"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/operate"
)

// cmdPolicyCheck is `nodeproof policy check FILE [--against-records]`:
// the policy must load; with --against-records every enrolled node's last
// recorded claims are judged by it. A node whose claims are not recorded
// (enrolled, not re-attested since) or cannot be judged is listed as not
// judged; the command fails (exit 1) when any node would fail.
func cmdPolicyCheck(ctx context.Context, in *invocation) error {
	stdout := in.stdout
	fs := in.flags()
	var c serve.Config
	storeFlags(fs, &c)
	against := fs.Bool("against-records", false, "judge every enrolled node's last recorded claims by this policy: which would fail, and why (exit 1 when any would)")
	pool := fs.String("pool", "", "with --event-log: the pool whose boot rules judge the log")
	logFile := fs.String("event-log", "", "judge one machine's TCG event log (binary_bios_measurements) offline by --pool's boot rules, as a quote of the log's own PCR values: exit 0 admitted, 1 refused with every reason")
	bank := fs.String("bank", "sha256", "with --event-log: the PCR bank to read the log in (sha256, sha1, sha384)")
	noTrust := fs.Bool("document-only", false, "check the document only, not the trust files it points to (EK root directories, inventory): a policy written here for a machine where they are")
	pos, err := in.exactly(1)
	if err != nil {
		return err
	}
	file := pos[0]
	pol, err := serve.LoadPolicy(file)
	if err != nil {
		return err // names the pool and the field
	}
	trust := "its trust files load as serve loads them"
	if *noTrust {
		trust = "the document only: its trust files not checked"
	} else if err := serve.CheckTrust(pol, time.Now); err != nil {
		return fmt.Errorf("%s: the document is valid, but serve would refuse it: %w (--document-only checks the document alone)", file, err)
	}
	fmt.Fprintf(stdout, "%s: valid (%d pools; %s)\n", file, len(pol.Pools), trust)
	for _, w := range pol.OpenRules() {
		fmt.Fprintln(in.stderr, "warning:", w)
	}
	if (*pool == "") != (*logFile == "") {
		return in.usageError("--pool and --event-log go together")
	}
	if *logFile != "" {
		if *against {
			return in.usageError("--event-log judges one log; --against-records the enrolled nodes: one at a time")
		}
		return checkEventLog(pol, *pool, *logFile, *bank, stdout)
	}
	if !*against {
		return nil
	}
	c.Clock = time.Now
	st, err := openOperatorStore(ctx, c)
	if err != nil {
		return err
	}
	defer st.Close()
	bs, err := st.Bindings(ctx)
	if err != nil {
		return err
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].NodeName < bs[j].NodeName })
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tPOOL\tKIND\tUNDER THIS POLICY\tDIGEST RULES\tSIGNER RULES\tWHY")
	failing, unjudged, tainted, cleared := 0, 0, 0, 0
	now := c.Clock()
	for _, b := range bs {
		d := rejudge.Decide(pol, b, now)
		v := verdictOf(pol, b, d.Verdict, now)
		switch d.Verdict.Outcome {
		case rejudge.NotJudged:
			unjudged++
		case rejudge.Fail:
			failing++
		}
		switch d.Change {
		case rejudge.Failed:
			tainted++
		case rejudge.Cleared:
			cleared++
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", b.NodeName, b.Pool, b.Kind, v.verdict, orDash(v.digests), orDash(v.signers), v.why)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d of %d nodes would fail at their next re-attestation", failing, len(bs))
	if unjudged > 0 {
		fmt.Fprintf(stdout, "; %d could not be judged (see WHY: they pass or fail at their next re-attestation)", unjudged)
	}
	fmt.Fprintln(stdout)
	// What serve's re-judge would write when this policy is applied
	// (mcs/rejudge.Run: the same Decide).
	fmt.Fprintf(stdout, "applied, it would taint %d nodes now (passing today, failing under it)", tainted)
	if cleared > 0 {
		fmt.Fprintf(stdout, " and clear %d (failed by an earlier policy change, passing under it)", cleared)
	}
	fmt.Fprintln(stdout)
	if failing > 0 {
		return errFailed
	}
	return nil
}

// checkEventLog is policy check --event-log: the log read by itself (the
// PCRs its own events imply, as a quote of them would hold), judged by
// pool's boot rules, every refusal said; what the log establishes after
// the boot loader printed for the operator to compare.
func checkEventLog(pol *policy.Policy, pool, file, bank string, stdout io.Writer) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	h, err := bankHash(bank)
	if err != nil {
		return err
	}
	bs, err := tpm.LogBootState(raw, h)
	if err != nil {
		fmt.Fprintf(stdout, "%s: refused: %v\n", file, err)
		return errFailed
	}
	pcrs, err := tpm.LogPCRs(raw, h)
	if err != nil {
		return err
	}
	writeBootSummary(stdout, bs)
	d, err := pol.JudgeBoot(pool, &attest.TPMClaims{PCRBank: bank, PCRs: pcrs, Boot: bs}, policy.Options{Now: time.Now()})
	if err != nil {
		fmt.Fprintf(stdout, "%s: refused by pools.%s:\n", file, pool)
		refusals := []policy.Audit{}
		if d != nil {
			refusals = d.Refusals
		}
		if len(refusals) == 0 {
			r, _ := attest.ReasonOf(err)
			refusals = append(refusals, policy.Audit{Reason: r, Message: err.Error()})
		}
		for _, a := range refusals {
			fmt.Fprintf(stdout, "  %s\t%s\n", a.Reason, safetext.Clean(a.Message))
		}
		return errFailed
	}
	fmt.Fprintf(stdout, "%s: admitted by pools.%s\n", file, pool)
	for _, a := range d.Audits {
		fmt.Fprintf(stdout, "  in audit mode: %s\n", safetext.Clean(a.String()))
	}
	return nil
}

// writeBootSummary prints what a log establishes of the boot chain and
// what ran after it.
func writeBootSummary(w io.Writer, bs attest.BootState) {
	sb := "unknown"
	if bs.SecureBootKnown {
		sb = map[bool]string{true: "on", false: "off"}[bs.SecureBoot]
	}
	fmt.Fprintf(w, "secure boot: %s\n", sb)
	for i, a := range bs.BootApplications {
		fmt.Fprintf(w, "boot application %d (%s): %s\n", i, bs.StageOf(i), a)
	}
	if bs.KernelCmdlineKnown {
		fmt.Fprintf(w, "kernel command line: %s\n", safetext.Clean(bs.KernelCmdline))
	} else {
		fmt.Fprintln(w, "kernel command line: not established")
	}
	for _, f := range bs.GrubFiles {
		fmt.Fprintf(w, "GRUB read: %s %s\n", f.Digest, safetext.Clean(f.Path))
	}
	fmt.Fprintf(w, "GRUB commands: %d measured\n", len(bs.GrubCommands))
	if bs.UKISectionsKnown {
		for _, s := range bs.UKISections {
			fmt.Fprintf(w, "UKI section (PCR 11): %s %s\n", s.Digest, s.Path)
		}
	}
}

// Verdicts of policy check --against-records.
const (
	verdictPass      = "pass"
	verdictNotJudged = "NOT JUDGED"
)

// verdict is one node's line of policy check --against-records: the
// policy's verdict, and what the pool's digest rules alone and its signer
// rules alone make of the boot chain ("" when the pool has none).
type verdict struct{ verdict, digests, signers, why string }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// outcome is a ChainOutcome in a word: "", pass, FAIL Reason.
func outcome(o policy.ChainOutcome) string {
	switch {
	case !o.Present:
		return ""
	case o.Err == nil:
		return verdictPass
	}
	r, _ := attest.ReasonOf(o.Err)
	return "FAIL " + string(r)
}

// verdictOf is v (rejudge.Judge's verdict on b's last verified claims at
// now) as a line: pass (with what rules in audit mode would have
// refused), FAIL with the reason, or not judged and why; and what pol's
// digest and signer rules each make of the claims.
func verdictOf(pol *policy.Policy, b *store.Binding, v rejudge.Verdict, now time.Time) verdict {
	switch v.Outcome {
	case rejudge.NotJudged:
		out := verdict{verdict: verdictNotJudged, why: v.Why}
		if v.Claims != nil {
			out.digests, out.signers = chainOutcomes(pol, b, v, now)
		}
		return out
	case rejudge.Fail:
		out := verdict{verdict: "FAIL " + string(v.Reason()), why: v.Err.Error()}
		out.digests, out.signers = chainOutcomes(pol, b, v, now)
		return out
	}
	out := verdict{verdict: verdictPass, why: "last claims from " + b.Status.LastAttempt.UTC().Format(time.RFC3339)}
	out.digests, out.signers = chainOutcomes(pol, b, v, now)
	if len(v.Audits) > 0 {
		out.verdict = verdictPass + " (audit)"
		out.why += "; in audit mode: " + strings.ReplaceAll(policy.FormatAudits(v.Audits, 1024), "\n", "; ")
	}
	return out
}

func chainOutcomes(pol *policy.Policy, b *store.Binding, v rejudge.Verdict, now time.Time) (string, string) {
	dg, sg := pol.ChainOutcomes(b.Pool, v.Claims, policy.Options{Now: now, Reattestation: true})
	return outcome(dg), outcome(sg)
}

// cmdPolicyLearn is `nodeproof policy learn`: a pool policy from a machine
// the operator trusts — its event log (a file, or `nodeproof-agent
// --dump-evidence`'s), or the claims its last re-attestation recorded —
// written new or merged into an existing policy (policy.Learn).
func cmdPolicyLearn(ctx context.Context, in *invocation) error {
	stderr, stdout := in.stderr, in.stdout
	fs := in.flags()
	var c serve.Config
	storeFlags(fs, &c)
	pool := fs.String("pool", "", "the pool to write (required)")
	logFile := fs.String("event-log", "", "the trusted machine's TCG event log (its /sys/kernel/security/tpm0/binary_bios_measurements)")
	evidence := fs.String("evidence", "", "the file nodeproof-agent --dump-evidence wrote on the trusted machine")
	node := fs.String("node", "", "an enrolled node whose last re-attestation's claims to learn from (store flags)")
	ekTrust := fs.String("ek-trust", "", "what vouches for the machine's EK: ca:NAME or inventory (default: ca:NAME of --ek-root; from --node, what vouched for it)")
	ekRoot := fs.String("ek-root", "", "NAME=DIR: the trust.ekRoots entry to add (a new policy needs the one --ek-trust names)")
	merge := fs.String("merge", "", "an existing policy to add the machine to (its comments are not kept)")
	nodeNames := fs.String("node-names", "", "how the pool's machines get their node names (serve.nodeNames): requested (the name the agent asks for; needed for an EK trusted through a vendor CA, which names no node) or evidence (an EK inventory entry's nodeName); default: the merged pool's, and asked for when that cannot name the machine")
	out := fs.String("o", "", "write the policy here (default: standard output)")
	var efi efiFlag
	fs.Var(&efi, "efi", "[STAGE=]FILE: a boot file (shim, GRUB, a kernel, a UKI; STAGE shim, bootloader, kernel or uki when it does not say) whose signers, SBAT and Authenticode digest to write as reference values; repeat for each")
	digests := fs.Bool("digests", false, "pin digests as well as signers: with --efi, the files' Authenticode digests (to --pool in --merge); from a machine, its boot applications' digests")
	var af afterFiles
	fs.StringVar(&af.initrd, "initrd", "", "with --grub-cfg: the initramfs grub.cfg's initrd command loads (its digest, as GRUB will measure it)")
	fs.StringVar(&af.grubCfg, "grub-cfg", "", "a grub.cfg: predict what GRUB will run and read for it (after GRUB's built-in configuration, which the pool learned from a booted machine): grub.files, grub.commands, kernelCmdline")
	fs.Var(&af.files, "grub-file", "GRUBPATH=FILE: another file grub.cfg reads at GRUBPATH (repeat)")
	fs.StringVar(&af.cmdline, "kernel-cmdline", "", "the kernel command line (the kernel's path, then the arguments, as GRUB measures it): kernelCmdline.exact; with --grub-cfg it must be grub.cfg's")
	fs.StringVar(&af.bank, "bank", "sha256", "the PCR bank the pool's machines quote: the predicted files' digests are in its hash (sha256, sha384, sha1)")
	refSet := fs.String("reference-set", "", "with --efi: write the files' rules into this reference set of the pool (made from the pool's stage rules if absent): a rollout's new release, beside the old")
	notAfter := fs.String("not-after", "", "with --reference-set: the set's notAfter (RFC 3339, or a date)")
	minKernel := fs.String("minimum-kernel", "", "with --efi: minimumKernel.version, the oldest kernel the pool accepts (raised, never lowered; each --efi kernel's version is recorded under its digest)")
	ukiPool := fs.Bool("uki-pool", false, "with --efi uki=FILE: make --pool, which judges GRUB's boot chain, judge unified kernel images (tpm.uki) instead: its boot loader and kernel stages, kernelCmdline, grub, referenceSets and minimumKernel are removed")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	if len(efi) > 0 || af.given() || *refSet != "" || *minKernel != "" || *ukiPool {
		if *logFile != "" || *evidence != "" || *node != "" || *ekTrust != "" || *ekRoot != "" || *nodeNames != "" {
			return in.usageError("--efi, --initrd, --grub-cfg, --grub-file, --kernel-cmdline, --reference-set and --minimum-kernel read boot files, not a machine: without --event-log, --evidence, --node, --ek-trust, --ek-root, --node-names")
		}
		return cmdPolicyLearnEFI(efiLearn{files: efi, digests: *digests, pool: *pool, merge: *merge, out: *out, after: af,
			referenceSet: *refSet, notAfter: *notAfter, minimumKernel: *minKernel, ukiPool: *ukiPool}, stdout, stderr)
	}
	sources := 0
	for _, s := range []string{*logFile, *evidence, *node} {
		if s != "" {
			sources++
		}
	}
	if *pool == "" || sources != 1 {
		return in.usageError("--pool and exactly one of --event-log, --evidence, --node are required")
	}
	l := policy.Learned{EKTrust: *ekTrust, Bank: "sha256", NodeNames: *nodeNames, Digests: *digests}
	if *ekRoot != "" {
		name, dir, ok := strings.Cut(*ekRoot, "=")
		if !ok || name == "" || dir == "" {
			return fmt.Errorf("--ek-root %q: want NAME=DIR", *ekRoot)
		}
		// The server resolves a relative dir: against the policy file's
		// directory (policy.Load); the operator wrote it against theirs.
		rel, err := ekRootDir(dir, *out)
		if err != nil {
			return err
		}
		l.Root = &policy.EKRoot{Name: name, Dir: rel}
		if l.EKTrust == "" {
			l.EKTrust = "ca:" + name
		}
	}
	switch {
	case *node != "":
		c.Clock = time.Now
		st, err := openOperatorStore(ctx, c)
		if err != nil {
			return err
		}
		defer st.Close()
		nc, err := operate.ClaimsOf(ctx, st, *node)
		if err != nil && !errors.Is(err, operate.ErrNoClaims) {
			return err
		}
		if err != nil || nc.Claims.TPM == nil {
			return fmt.Errorf("node %s has no recorded TPM claims (they are recorded at re-attestation): learn from its event log instead (--event-log, or --evidence from nodeproof-agent --dump-evidence)", *node)
		}
		b, cl := nc.Binding, nc.Claims
		if !b.Status.Passed {
			fmt.Fprintf(stderr, "note: node %s's last re-attestation failed (%s); learning from it anyway\n", *node, b.Status.Reason)
		}
		l.Bank, l.Boot, l.PCRs = cl.TPM.PCRBank, cl.TPM.Boot, cl.TPM.PCRs
		if *ekTrust == "" {
			l.EKTrust = cl.TPM.EKTrust
		}
	default:
		raw, err := readLog(*logFile, *evidence)
		if err != nil {
			return err
		}
		if l.Boot, err = tpm.LogBootState(raw, crypto.SHA256); err != nil {
			return fmt.Errorf("the event log: %w", err)
		}
		if l.PCRs, err = tpm.LogPCRs(raw, crypto.SHA256); err != nil {
			return fmt.Errorf("the event log: %w", err)
		}
	}
	var doc []byte
	if *merge != "" {
		var err error
		if doc, err = os.ReadFile(*merge); err != nil {
			return err
		}
	}
	learned, notes, err := policy.Learn(doc, *pool, l)
	if err == nil && *ekRoot != "" {
		// As serve will load it: say now when it does not load here.
		name, dir, _ := strings.Cut(*ekRoot, "=")
		if _, lerr := tpm.LoadRootSet(name, dir); lerr != nil {
			notes = append(notes, fmt.Sprintf("--ek-root %s does not load here (%v): serve and policy check refuse the policy until it does where they run", *ekRoot, lerr))
		}
	}
	if errors.Is(err, policy.ErrNodeNamesUnset) {
		return fmt.Errorf("%w\nsay how: --node-names requested, or --ek-trust inventory with the machine's EK and node in trust.ekInventory", err)
	}
	if err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(stderr, "note:", n)
	}
	if *out == "" {
		_, err = stdout.Write(learned)
		return err
	}
	if err := fsutil.WriteFileAtomic(*out, learned, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s (pool %s); check it with: nodeproof policy check %s --against-records\n", *out, *pool, *out)
	return nil
}

// ekRootDir is --ek-root's DIR (relative to the working directory, as
// the operator typed it) as the written policy must say it for
// policy.Load, which resolves a relative dir against the policy file's
// directory: relative to -o's directory, or absolute when the policy goes
// to standard output (where it will be saved is not known). An absolute
// DIR stays as it is.
func ekRootDir(dir, out string) (string, error) {
	if filepath.IsAbs(dir) {
		return dir, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("--ek-root: %w", err)
	}
	if out == "" {
		return abs, nil
	}
	base, err := filepath.Abs(filepath.Dir(out))
	if err != nil {
		return "", fmt.Errorf("-o: %w", err)
	}
	rel, err := filepath.Rel(base, abs)
	if err != nil {
		return abs, nil
	}
	return rel, nil
}

// readLog is an event log from a file, or from a --dump-evidence file.
func readLog(logFile, evidence string) ([]byte, error) {
	if logFile != "" {
		return os.ReadFile(logFile)
	}
	b, err := os.ReadFile(evidence)
	if err != nil {
		return nil, err
	}
	var d tpm.LogDump
	if err := json.Unmarshal(b, &d); err != nil || d.Kind != "tpm" || len(d.EventLog) == 0 {
		return nil, fmt.Errorf("%s: not a nodeproof-agent --dump-evidence file with a TPM event log", evidence)
	}
	return d.EventLog, nil
}
