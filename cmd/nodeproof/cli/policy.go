package cli

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
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
	"github.com/nodeproof/nodeproof/mcs/serve"
	"github.com/nodeproof/nodeproof/store"
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
	pos, err := in.exactly(1)
	if err != nil {
		return err
	}
	file := pos[0]
	pol, err := serve.LoadPolicy(file)
	if err != nil {
		return err // names the pool and the field
	}
	fmt.Fprintf(stdout, "%s: valid (%d pools)\n", file, len(pol.Pools))
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
	failing, unjudged := 0, 0
	for _, b := range bs {
		v := judge(pol, b, c.Clock())
		switch {
		case v.verdict == verdictNotJudged:
			unjudged++
		case strings.HasPrefix(v.verdict, "FAIL"):
			failing++
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
	if failing > 0 {
		return errFailed
	}
	return nil
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

// judge decides what pol makes of b's last recorded claims at now (the
// reference sets' dates): pass (with what rules in audit mode would have
// refused), FAIL with the reason, or not judged when nothing recorded can
// decide it; and what its digest and signer rules each make of them.
func judge(pol *policy.Policy, b *store.Binding, now time.Time) verdict {
	if len(b.Status.Claims) == 0 {
		return verdict{verdict: verdictNotJudged, why: "no claims recorded yet (enrolled, not re-attested since; the first re-attestation, at its first boot, records them)"}
	}
	var cl attest.Claims
	if err := json.Unmarshal(b.Status.Claims, &cl); err != nil {
		return verdict{verdict: verdictNotJudged, why: "its recorded claims do not decode"}
	}
	opts := policy.Options{Now: now, Reattestation: true}
	dg, sg := pol.ChainOutcomes(b.Pool, &cl, opts)
	v := verdict{digests: outcome(dg), signers: outcome(sg)}
	dec, err := pol.Decide(b.Pool, &cl, opts)
	if err == nil {
		v.verdict, v.why = verdictPass, "last claims from "+b.Status.LastAttempt.UTC().Format(time.RFC3339)
		if len(dec.Audits) > 0 {
			v.verdict = verdictPass + " (audit)"
			v.why += "; in audit mode: " + strings.ReplaceAll(policy.FormatAudits(dec.Audits, 1024), "\n", "; ")
		}
		return v
	}
	r, _ := attest.ReasonOf(err)
	if r == attest.ReasonPolicyDBX && withoutDBXContents(pol, b.Pool).EvaluateReattestation(b.Pool, &cl) == nil {
		// Only minimumDBX.contains failed: a status records the dbx's
		// entry count, not its entries.
		v.verdict, v.why = verdictNotJudged, "the dbx's entries are not recorded (only their count): "+err.Error()
		return v
	}
	v.verdict, v.why = "FAIL "+string(r), err.Error()
	return v
}

// withoutDBXContents is pol with pool's minimumDBX.contains dropped.
func withoutDBXContents(pol *policy.Policy, pool string) *policy.Policy {
	cp := *pol
	cp.Pools = maps.Clone(pol.Pools)
	pp := cp.Pools[pool]
	if m := pp.TPM.MinimumDBX; m != nil {
		mm := *m
		mm.Contains = nil
		pp.TPM.MinimumDBX = &mm
	}
	cp.Pools[pool] = pp
	return &cp
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
	fs.Var(&efi, "efi", "[STAGE=]FILE: a boot file (shim, GRUB, a kernel, a UKI; STAGE shim, bootloader or kernel when it does not say) whose signers, SBAT and Authenticode digest to write as reference values; repeat for each")
	digests := fs.Bool("digests", false, "pin digests as well as signers: with --efi, the files' Authenticode digests (to --pool in --merge); from a machine, its boot applications' digests")
	if _, err := in.exactly(0); err != nil {
		return err
	}
	if len(efi) > 0 {
		if *logFile != "" || *evidence != "" || *node != "" || *ekTrust != "" || *ekRoot != "" || *nodeNames != "" {
			return in.usageError("--efi reads boot files, not a machine: without --event-log, --evidence, --node, --ek-trust, --ek-root, --node-names")
		}
		return cmdPolicyLearnEFI(efi, *digests, *pool, *merge, *out, stdout, stderr)
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
		b, err := st.Binding(ctx, *node)
		if err != nil {
			return fmt.Errorf("node %s: %w", *node, err)
		}
		var cl attest.Claims
		if len(b.Status.Claims) == 0 || json.Unmarshal(b.Status.Claims, &cl) != nil || cl.TPM == nil {
			return fmt.Errorf("node %s has no recorded TPM claims (they are recorded at re-attestation): learn from its event log instead (--event-log, or --evidence from nodeproof-agent --dump-evidence)", *node)
		}
		if !b.Status.Passed {
			fmt.Fprintf(stderr, "note: node %s's last re-attestation failed (%s); learning from it anyway\n", *node, b.Status.Reason)
		}
		l.Bank, l.Boot = cl.TPM.PCRBank, cl.TPM.Boot
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
	}
	var doc []byte
	if *merge != "" {
		var err error
		if doc, err = os.ReadFile(*merge); err != nil {
			return err
		}
	}
	learned, notes, err := policy.Learn(doc, *pool, l)
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
