package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/fsutil"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// Evidence is one kind of evidence the agent can present.
type Evidence interface {
	Kind() attest.Kind
	// Attest runs challenge → verify with the server for pool, binding
	// the kubelet key, and returns the server's answer.
	Attest(ctx context.Context, c *Client, pool, nodeName string, kubeletPKIX []byte) (*api.VerifyResponse, error)
}

// TPMEvidence is evidence from a TPM (the machine's, or swtpm in tests).
type TPMEvidence struct {
	Collector TPM
	// Ticket is the server's AK ticket for the collector's kept AK, sent
	// with the challenge ("" none).
	Ticket string
	// Keep, when set, is called after the server accepted an attestation,
	// with the ticket it returned ("" none new): it keeps the AK and its
	// ticket for the next run (openTPM's, with SourceOptions.AKState).
	Keep func(ticket string) error
}

// Kind implements Evidence.
func (TPMEvidence) Kind() attest.Kind { return attest.KindTPM }

// Attest implements Evidence. A kept AK that cannot be written is said on
// the console, not an error: the attestation passed, and the next run
// makes a new AK.
func (e TPMEvidence) Attest(ctx context.Context, c *Client, pool, nodeName string, kubeletPKIX []byte) (*api.VerifyResponse, error) {
	vr, err := c.AttestTPMTicketed(ctx, pool, nodeName, e.Collector, kubeletPKIX, e.Ticket)
	if err == nil && e.Keep != nil {
		if kerr := e.Keep(vr.Ticket); kerr != nil && c.Progress != nil {
			c.Progress("could not keep the TPM's attestation key for the next run (it will make a new one): %v", kerr)
		}
	}
	return vr, err
}

// Mode is how the agent delivers the full config.
type Mode string

// Modes.
const (
	// ModePointer (before Ignition, in the initramfs): fetch this node's
	// full config with the config token — attesting again for a new token
	// when a delivery was cut, which spends the token — and write it into
	// Ignition's system config directory as its user config; Ignition's
	// fetch stage then applies it without asking the server. (Handing
	// Ignition a pointer with the token instead would leave a machine whose
	// delivery was cut with a spent token and a failed boot: Ignition
	// cannot attest again.)
	ModePointer Mode = "pointer"
	// ModeFetch (two stages, on first boot after Ignition applied the
	// public tier): fetch the full config now and write the first-boot
	// files (api.FirstBootFiles) where the first-boot step expects them.
	ModeFetch Mode = "fetch"
)

// Config is one run of the agent.
type Config struct {
	Server   string // https://api-int.example.com:22623
	CABundle []byte // PEM: the CAs the server's certificate chains to
	Pool     string
	// NodeName is the name to ask for; the server uses it only when the
	// evidence names none and the pool's policy takes requested names.
	NodeName string
	Evidence Evidence
	// KubeletKeyPath is the kubelet's bootstrap key (DefaultKubeletKeyPath).
	KubeletKeyPath string
	// BoundKeyPath, when set, receives the agent's own copy of the key
	// it binds (DefaultBoundKeyPath), for its later re-attestations.
	BoundKeyPath string
	Mode         Mode
	// IgnitionDir is Ignition's system config directory (ModePointer).
	IgnitionDir string
	// Root is where first-boot files are written (ModeFetch; "/" on a node).
	Root string
	// ConfigOut, if set, also receives the whole full config (ModeFetch),
	// mode 0600: it holds secrets.
	ConfigOut string
	// Console gets progress and, on refusal, the server's reason.
	Console io.Writer
	// Timing, when set, counts the network's and the server's time (wrap
	// the evidence's TPM with Timing.TPM for the TPM's).
	Timing *Timing
}

// ExitRefused is the exit code of a run the server refused (4xx).
const ExitRefused = 3

// Run attests and delivers the full config. A refusal (4xx) is a *Refused
// whose reason the console has already shown; 5xx answers are retried
// until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	out := cfg.Console
	if out == nil {
		out = io.Discard
	}
	say := console(out)
	switch {
	case cfg.Server == "" || cfg.Pool == "" || cfg.Evidence == nil:
		return errors.New("agent: Server, Pool and Evidence are required")
	case cfg.Mode != ModePointer && cfg.Mode != ModeFetch:
		return fmt.Errorf("agent: unknown mode %q (pointer or fetch)", cfg.Mode)
	}
	if cfg.KubeletKeyPath == "" {
		cfg.KubeletKeyPath = DefaultKubeletKeyPath
	}
	c, err := NewClient(cfg.Server, cfg.CABundle)
	if err != nil {
		return err
	}
	c.Progress = func(format string, args ...any) { say(format, args...) }
	key, pub, err := LoadKubeletKey(cfg.KubeletKeyPath)
	if cfg.Timing != nil {
		c.HTTP.Transport = cfg.Timing.Transport(c.HTTP.Transport)
	}
	if err != nil {
		return err
	}
	if cfg.BoundKeyPath != "" {
		if err := KeepKey(cfg.BoundKeyPath, key); err != nil {
			return err
		}
	}
	c.KubeletKey = key
	say("kubelet key %s ready; attesting to %s for pool %s with %s evidence", cfg.KubeletKeyPath, cfg.Server, cfg.Pool, cfg.Evidence.Kind())
	attested := func(vr *api.VerifyResponse) {
		say("attested: node %s, pool %s, NodeAttestation %s; config token valid until %s", vr.NodeName, vr.Pool, vr.Record, vr.Expires.UTC().Format("15:04:05Z"))
	}
	vr, full, err := c.AttestAndFetch(ctx, cfg.Evidence, cfg.Pool, cfg.NodeName, pub)
	switch {
	case vr == nil:
		err = refusal(say, "attestation", err)
		report(ctx, c, say, cfg.Pool, cfg.NodeName, "attestation", err)
		return err
	case err != nil:
		attested(vr)
		err = refusal(say, "config fetch", err)
		report(ctx, c, say, vr.Pool, vr.NodeName, "config fetch", err)
		return err
	}
	attested(vr)
	if cfg.Mode == ModePointer {
		dir := cfg.IgnitionDir
		if dir == "" {
			dir = DefaultIgnitionDir
		}
		path, err := WriteUserConfig(dir, full)
		if err != nil {
			return err
		}
		say("fetched the full config of pool %s (%d bytes); wrote %s: Ignition applies it", vr.Pool, len(full), path)
		return nil
	}
	if cfg.ConfigOut != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.ConfigOut), 0o700); err != nil {
			return err
		}
		if err := fsutil.WriteFileAtomic(cfg.ConfigOut, full, 0o600); err != nil {
			return err
		}
	}
	root := cfg.Root
	if root == "" {
		root = "/"
	}
	wrote, err := WriteFirstBootFiles(root, full)
	if err != nil {
		return err
	}
	say("fetched the full config (%d bytes); wrote %s under %s", len(full), strings.Join(wrote, ", "), root)
	return nil
}

// refusal shows a refusal plainly on the console: failed provisioning is
// hard to debug when the reason is only in a server log.
func refusal(say func(string, ...any), step string, err error) error {
	var r *Refused
	if errors.As(err, &r) {
		say("REFUSED at %s by the server (HTTP %d): %s", step, r.Status, r.Refusal.Reason)
		if r.Refusal.Detail != "" {
			say("  reason: %s", r.Refusal.Detail)
		}
		say("  this node will not get its config until the cause is fixed; the agent stops here")
		return err
	}
	say("%s failed: %v", step, err)
	return err
}

// report tells the server why step failed (Client.Report: authenticated
// by the failed attempt's session when there was one) and says on the
// console whether it could, so that an operator sees why the machine is
// stuck without its console. A node name the agent was not given is its
// host name, as the kubelet takes it.
func report(ctx context.Context, c *Client, say func(string, ...any), pool, node, step string, err error) {
	if node == "" {
		h, herr := os.Hostname()
		if herr != nil {
			say("not reported to the server: no node name (%v)", herr)
			return
		}
		node = strings.ToLower(h)
	}
	reason := attest.ReasonAgentError
	var r *Refused
	switch {
	case errors.As(err, &r):
		reason = r.Refusal.Reason
	case errors.Is(err, context.DeadlineExceeded):
		reason = attest.ReasonAgentTimeout
	}
	auth, rerr := c.Report(ctx, api.ReportRequest{Pool: pool, NodeName: node, Stage: step, Reason: string(reason), Detail: err.Error()})
	if rerr != nil {
		say("could not report this failure to the server: %v", rerr)
		return
	}
	say("reported this failure to the server as node %s (authenticated: %s): kubectl get events, or nodeproof inspect %s", node, auth, node)
}
