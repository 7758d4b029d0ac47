// Package agentcli is the nodeproof-agent command: flags in, agent.Run
// out. cmd/nodeproof-agent is a thin main over Main. Like package agent it
// imports no client-go and no server code, so the binary fits an
// initramfs.
package agentcli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/fsutil"
)

// usage is the agent's usage; the evidence kinds come from
// agent.SourceTable (usageLine, evidenceHelp).
const usage = `usage: nodeproof-agent --server URL [--mode pointer|fetch|reattest] [--evidence auto|%s] [flags]
       nodeproof-agent --dump-evidence FILE [--event-log FILE]
       nodeproof-agent kubelet-bootstrap [flags]

Proves this machine to the nodeproof server (a TPM quote, or a cloud
instance identity), then: pointer mode (initramfs, before Ignition) writes a
pointer config with a single-use config token for Ignition; fetch mode
fetches the full config now and writes the first-boot files; reattest mode
proves an enrolled node again (every boot and on a timer); kubelet-bootstrap
(before the kubelet) gets the kubelet's first client certificate with the
bound key (nodeproof-agent kubelet-bootstrap -h). Exit status: 0 done, 1
error, 2 usage, 3 refused by the server (its reason on the console).
`

// Main runs the agent with args (without the program name) and returns
// the exit code: 0 done, 1 error, 2 usage, agent.ExitRefused when the
// server refused.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "kubelet-bootstrap" {
		return kubeletBootstrap(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("nodeproof-agent", flag.ContinueOnError)
	server := fs.String("server", "", "the Machine Config Server, e.g. https://api-int.example.com:22623 (required; https only: the agent speaks only TLS to its server and follows no redirect)")
	caFile := fs.String("ca-bundle", "/etc/nodeproof/mcs-ca-bundle.crt", "CA bundle (PEM) the server's certificate chains to")
	pool := fs.String("pool", "worker", "the pool whose config this machine wants")
	nodeName := fs.String("node-name", "", "node name to ask for (used only where the evidence names none and policy allows); --mode=reattest defaults to the host name, enrolment has no default (at first boot the host name is often not yet the node's: localhost on every machine)")
	evidence := fs.String("evidence", "auto", evidenceHelp())
	tpmPath := fs.String("tpm", "/dev/tpmrm0", "the TPM: /dev/tpmrm0, or tcp:HOST:PORT for swtpm's command port")
	ekKind := fs.String("ek", attest.EKKindRSA2048, "tpm evidence: the kind of endorsement key to attest with, the one the pool accepts (its tpm.ek): "+strings.Join(attest.EKKinds, ", "))
	eventLog := fs.String("event-log", "", "with tcp:…: the event log file to send (a real TPM's comes from securityfs)")
	keyPath := fs.String("kubelet-key", agent.DefaultKubeletKeyPath, "the kubelet's bootstrap key (made if missing)")
	boundKey := fs.String("bound-key", agent.DefaultBoundKeyPath, "the agent's own copy of the kubelet key it binds: written at enrolment (fetch, pointer), used by reattest in preference to --kubelet-key (which the kubelet removes); \"none\" keeps no copy")
	mode := fs.String("mode", string(agent.ModePointer), "pointer: write a pointer config for Ignition (initramfs, before ignition-fetch); fetch: fetch the full config now (first boot after Ignition); reattest: prove this enrolled node again (every boot and on a timer; nothing is fetched)")
	statePath := fs.String("state", agent.DefaultReattestState, "reattest mode: where the last success and the next due time are kept")
	akState := fs.String("ak-state", agent.DefaultAKState, "reattest mode, tpm evidence: where the TPM's attestation key and the server's ticket for it are kept between runs, so a re-attestation loads the key and quotes (no key generation; no credential activation while the ticket holds); \"none\" makes a new key each run")
	force := fs.Bool("force", false, "reattest mode: attest now even when not due")
	ignDir := fs.String("ignition-dir", agent.DefaultIgnitionDir, "pointer mode: Ignition's system config directory")
	root := fs.String("root", "/", "fetch mode: where the first-boot files are written")
	configOut := fs.String("config-out", "", "fetch mode: also write the whole full config here (mode 0600)")
	dump := fs.String("dump-evidence", "", "write this machine's event log (--event-log, else securityfs) to this file (for nodeproof policy learn --evidence, on a machine you trust), and exit")
	timeout := fs.Duration("timeout", 0, "give up after this long (0: retry while the server says not yet, until stopped)")
	if code, ok := parseFlags(fs, fmt.Sprintf(usage, kindList()), args, stdout, stderr); !ok {
		return code
	}
	if *dump != "" {
		if err := dumpEvidence(*dump, *eventLog); err != nil {
			fmt.Fprintf(stderr, "nodeproof-agent: --dump-evidence: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "nodeproof-agent: wrote %s\n", *dump)
		return 0
	}
	if *server == "" {
		fmt.Fprintln(stderr, "nodeproof-agent: --server is required")
		return 2
	}
	if err := agent.CheckServerURL(*server); err != nil {
		fmt.Fprintf(stderr, "nodeproof-agent: --server (NODEPROOF_SERVER in /etc/nodeproof/agent.env): %v; e.g. https://api-int.example.com:22623 — the agent speaks only TLS to its server, with the CA bundle of --ca-bundle\n", err)
		return 2
	}
	ca, err := os.ReadFile(*caFile)
	if err != nil {
		fmt.Fprintf(stderr, "nodeproof-agent: CA bundle: %v\n", err)
		return 1
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	if *evidence == "auto" {
		kind, found, err := agent.DetectEvidence(ctx, agent.DetectOptions{
			TPMPath: *tpmPath, GCEMetadataHost: os.Getenv("GCE_METADATA_HOST"), IMDSEndpoint: os.Getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT"),
		})
		if err != nil {
			fmt.Fprintf(stderr, "nodeproof-agent: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "nodeproof-agent: evidence %s (--evidence auto found %s)\n", kind, found)
		*evidence = string(kind)
	}
	start := time.Now()
	timing := new(agent.Timing)
	defer func() {
		fmt.Fprintf(stdout, "nodeproof-agent: took %.2fs: %s\n", time.Since(start).Seconds(), timing)
	}()
	if *evidence == string(attest.KindTPM) && *tpmPath == agent.DefaultTPMPath && *eventLog == "" {
		if msg := agent.MissingEventLog(tpm.SystemEventLog); msg != "" {
			fmt.Fprintf(stdout, "nodeproof-agent: %s\n", msg)
		}
	}
	source, ok := agent.Sources()[attest.Kind(*evidence)]
	if !ok {
		fmt.Fprintf(stderr, "nodeproof-agent: unknown --evidence %q\n", *evidence)
		return 2
	}
	kept := ""
	if agent.Mode(*mode) == agent.ModeReattest && *akState != "none" {
		kept = *akState
	}
	ev, closer, err := source(ctx, agent.SourceOptions{
		TPMPath: *tpmPath, EventLog: *eventLog, IMDSEndpoint: os.Getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT"), Timing: timing, EKKind: *ekKind,
		AKState: kept, Console: stdout,
	})
	if err != nil {
		fmt.Fprintf(stderr, "nodeproof-agent: %s: %v\n", evidenceLabel(*evidence), err)
		return 1
	}
	if closer != nil {
		defer closer.Close()
	}
	if agent.Mode(*mode) == agent.ModeReattest {
		if *nodeName == "" {
			// A node's name is its host name, lower-cased, as the kubelet
			// takes it.
			h, err := os.Hostname()
			if err != nil {
				fmt.Fprintf(stderr, "nodeproof-agent: --node-name: %v\n", err)
				return 2
			}
			*nodeName = strings.ToLower(h)
		}
		err = agent.Reattest(ctx, agent.ReattestConfig{
			Server: *server, CABundle: ca, Pool: *pool, NodeName: *nodeName, Evidence: ev,
			KubeletKeyPath: *keyPath, BoundKeyPath: keep(*boundKey), StatePath: *statePath, Force: *force, Console: stdout, Timing: timing,
		})
	} else {
		err = agent.Run(ctx, agent.Config{
			Server: *server, CABundle: ca, Pool: *pool, NodeName: *nodeName, Evidence: ev,
			KubeletKeyPath: *keyPath, BoundKeyPath: keep(*boundKey), Mode: agent.Mode(*mode), IgnitionDir: *ignDir, Root: *root,
			ConfigOut: *configOut, Console: stdout, Timing: timing,
		})
	}
	var refused *agent.Refused
	switch {
	case err == nil:
		return 0
	case errors.As(err, &refused):
		return agent.ExitRefused
	default:
		fmt.Fprintf(stderr, "nodeproof-agent: %v\n", err)
		return 1
	}
}

// keep is --bound-key's path, "" for none.
func keep(path string) string {
	if path == "none" {
		return ""
	}
	return path
}

// kindList is the evidence kinds the agent presents, as --evidence takes
// them: tpm|gcp|….
func kindList() string {
	var kinds []string
	for _, r := range agent.SourceTable() {
		kinds = append(kinds, string(r.Kind))
	}
	return strings.Join(kinds, "|")
}

// evidenceHelp is --evidence's help: auto, then each row of
// agent.SourceTable with its help, in the order auto tries them.
func evidenceHelp() string {
	help := "auto (the first found, in this order; the choice is printed)"
	for _, r := range agent.SourceTable() {
		help += "; " + string(r.Kind) + " (" + r.Help + "; auto: when " + r.Auto + ")"
	}
	return help
}

// evidenceLabel names a kind in the agent's messages.
func evidenceLabel(kind string) string {
	if kind == string(attest.KindTPM) {
		return "TPM"
	}
	return kind
}

// dumpEvidence writes the event log (from logPath, else securityfs) as a
// tpm.LogDump.
func dumpEvidence(out, logPath string) error {
	if logPath == "" {
		logPath = tpm.SystemEventLog
	}
	raw, err := os.ReadFile(logPath)
	if err != nil {
		return err
	}
	b, err := json.Marshal(tpm.LogDump{Kind: "tpm", EventLog: raw})
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(out, b, 0o644)
}
