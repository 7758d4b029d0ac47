// Package cli is the nodeproof command: flags in, library calls out.
// cmd/nodeproof is a thin main over Run.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Version is set at build time with -ldflags "-X ...cli.Version=...".
var Version = "dev"

// commands is every nodeproof command: the one place their usage is built
// from (usage.go; docs/cli.md says how to add one).
func commands() []command {
	return []command{
		{name: "serve", aliases: []string{"bootstrap", "start"}, run: cmdServe,
			summary: "run the Machine Config Server",
			about: "Directory mode: --server-basedir (an MCO bootstrap directory) and --bootstrap-kubeconfig.\n" +
				"Cluster mode: --kubeconfig (or the in-cluster service account) and --apiserver-url.\n" +
				"The policy (--policy) says what each pool serves to whom: docs/policy.md."},
		{name: "approve", run: cmdApprove,
			summary: "run the CSR approver (kubelet CSRs approved with attestation evidence)"},
		{name: "release", args: "NODE", run: cmdRelease,
			summary: "free a node name from the machine that owns it, so another (or the same, reinstalled) may enrol; a ban stays (cluster: an operator's credentials, deploy/operator)"},
		{name: "revoke", args: "NODE | --identity ID", run: cmdRevoke,
			summary: "ban the machine: refused everything, under any name, until unban; its node is tainted NoExecute (cluster: an operator's credentials, deploy/operator)"},
		{name: "unban", args: "NODE | --identity ID", run: cmdUnban,
			summary: "lift a ban (cluster: an operator's credentials, deploy/operator; the server's account cannot)"},
		{name: "adopt", args: "NODE", run: cmdAdopt,
			summary: "let a pool with requested names bind the name of a Node that existed before nodeproof (cluster: an operator's credentials, deploy/operator)"},
		{name: "status", run: cmdStatus,
			summary: "what the running server judges by and serves: the policy version in force and a refused reload, certificate names and expiry, the leader, the store's health and counts (a view)"},
		{name: "inspect", args: "[NODE | pool NAME | secureboot-ca]", run: cmdInspect,
			summary: "list nodes (owner, last attestation, state), one node's whole story, what a pool serves before approval, or the fleet's move to Microsoft's 2023 Secure Boot CAs"},
		{name: "policy", summary: "check a policy, learn one from a machine you trust, or add published revocations to it", actions: []action{
			{name: "check", args: "FILE", run: cmdPolicyCheck,
				summary: "validate a policy; with --against-records, judge every node's last claims by it (exits 1 when any would fail)"},
			{name: "learn", run: cmdPolicyLearn,
				summary: "a pool policy from a trusted machine's event log (--event-log, --evidence) or an enrolled node's claims (--node); or reference values (digests, signers, SBAT) from the boot files themselves (--efi)"},
			{name: "revoke", args: "POLICY", run: cmdPolicyRevoke,
				summary: "add revocations as published to --pool's rules: a UEFI dbx update (--dbx-update: its hashes denied digests, its certificates denied signers; --require-dbx: the nodes' own dbx must hold it) and shim's SbatLevel (--sbat-level: minimumSBAT raised)"},
		}},
		{name: "enroll", run: cmdEnroll,
			summary: "--reset NODE: the same as release NODE (--reset KEY clears a single-use marker)"},
		{name: "ca", run: cmdCA, defaultAction: "show",
			summary: "the MCS CA and serving certificate: show them (a view: nothing changes), create them, or rotate them now",
			actions: []action{
				{name: "show", summary: "print where the CA bundle and serving certificate are, their names and until when they are valid; changes nothing"},
				{name: "create", summary: "make the CA and serving certificate for --hosts on first use, renew what is due; never changes the serving certificate's names (rotate --serving-only --hosts does)"},
				{name: "rotate", summary: "a new CA, cross-signed by the old one (kept in the bundle), as at 80% of its life; --serving-only: a new serving certificate, for --hosts or the names it had"},
			}},
		{name: "pointer", run: cmdPointer,
			summary: "write an Ignition pointer config for a pool"},
		{name: "token", run: cmdToken, defaultAction: "show",
			summary: "the provisioning token (the token tier)",
			actions: []action{
				{name: "show", summary: "print the current token"},
				{name: "rotate", summary: "make a new token and print it; the previous one stays valid for --grace"},
			}},
		{name: "keys", run: cmdKeys,
			summary: "the keyring that seals sessions and config tokens",
			actions: []action{
				{name: "rotate", summary: "add a new key (made with the keyring on first use) that seals from --activate-after on; older keys are kept --retain after they stopped sealing, and it prints what it kept and until when"},
			}},
		{name: "store", run: cmdStore,
			summary: "the embedded store (state.db): check it, back it up (also while the server runs), restore a backup",
			actions: []action{
				{name: "check", summary: "check the store whole (through the running server when one answers on its admin socket); --file: check a backup"},
				{name: "backup", summary: "write a consistent copy to --out (through the running server when one answers), checked before it is kept"},
				{name: "restore", summary: "with the server stopped: put the backup --from in place (checked first; the replaced file is kept) and reset the commit marker"},
			}},
		devTPMCommand(),
		{name: "version", run: cmdVersion, summary: "print the version"},
	}
}

// Run runs the command line args (without the program name) and returns
// the exit code: 0 done (and -h), 1 failed, 2 a command line that does
// not fit the usage.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 {
		topUsage(stderr, cmds)
		return 2
	}
	name, rest := args[0], args[1:]
	switch {
	case isHelp(name):
		if len(rest) == 0 {
			topUsage(stdout, cmds)
			return 0
		}
		// help CMD [ACTION]: CMD [ACTION] -h.
		name, rest = rest[0], append(rest[1:], "-h")
	}
	c := lookup(cmds, name)
	if len(rest) > 0 {
		// Two-word commands: dev tpm.
		if c2 := lookup(cmds, name+" "+rest[0]); c2 != nil {
			c, rest = c2, rest[1:]
		}
	}
	if c == nil {
		if group := groupOf(cmds, name); len(group) > 0 {
			w, code := stderr, 2
			if len(rest) > 0 && isHelp(rest[0]) {
				w, code = stdout, 0
			}
			fmt.Fprintf(w, "nodeproof %s: one of:\n", name)
			topUsage(w, group)
			return code
		}
		fmt.Fprintf(stderr, "nodeproof: unknown command %q\n\n", name)
		topUsage(stderr, cmds)
		return 2
	}
	err := runCommand(ctx, c, rest, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.Is(err, errFailed):
		return 1 // the command has said why
	}
	fmt.Fprintf(stderr, "nodeproof %v\n", err) // runCommand prefixed what ran
	return 1
}

// errFailed is a command's failure it has already reported (exit 1).
var errFailed = errors.New("failed")

func cmdVersion(_ context.Context, in *invocation) error {
	if _, err := in.exactly(0); err != nil {
		return err
	}
	fmt.Fprintln(in.stdout, "nodeproof", Version)
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, h := range strings.Split(s, ",") {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}
