// Package demo is `make demo`. Part one, in process: a machine with a
// software TPM (swtpm, with an EK certificate from a local manufacturer CA)
// boots from a real firmware event log, proves its identity and boot state
// to the verifier, and policy decides. Part two (server.go), as commands,
// each printed as it runs: a real kube-apiserver and etcd with nothing
// installed, then the cluster part of the operator's guide
// (docs/operations.md) with the real binaries — the kubernetes overlay and
// the example pools, a software TPM machine and a policy learned from it,
// `nodeproof serve` and `nodeproof approve`, the machine's enrolment and its
// kubelet's CSR approved — and the machine's life between its blocks: the
// public tier fetched by the real Ignition, its Node, a re-attestation, a
// refused one (Secure Boot off) and the approver's taint, a clean one, and
// after the guide's `inspect`, revocation and refusal, the NoExecute taint.
// Everything it starts stops, and its files are removed, when it ends.
package demo

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// Options configure a demo run.
type Options struct {
	// Dir holds the CA, TPM state and policy; a temporary one when empty.
	Dir string
	// Log names the firmware event log (firmware-testdata) to boot from.
	Log string
	// Out receives the narration.
	Out io.Writer
	// Clock tells the time.
	Clock func() time.Time
	// Root is the module root, whose docs/operations.md part two runs
	// (default: the working directory, the module root under make).
	Root string
	// Bin holds nodeproof and nodeproof-agent (make build's bin/); empty:
	// the demo builds them.
	Bin string
	// Examples is the deploy/examples directory make demo-boot serves
	// (default: relative to the working directory, the module root under
	// make).
	Examples string
}

// demoPolicy is the demo's policy: the worker pool takes TPM evidence
// from EKs certified by the swtpm manufacturer (roots), booted with
// Secure Boot; the "locked" pool additionally pins the kernel to one
// digest.
func demoPolicy(roots string) *policytest.Builder {
	return policytest.New().EKRoot("swtpm-localca", roots).
		Pool("worker", policytest.TPM("ca:swtpm-localca").SecureBoot().Cmdline("ro")).
		Pool("locked", policytest.TPM("ca:swtpm-localca").SecureBoot().Boot("", "", strings.Repeat("0", 64)))
}

// Run runs the demo.
func Run(ctx context.Context, o Options) error {
	if o.Log == "" {
		o.Log = "rhel8-uefi"
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	out := o.Out
	step := func(format string, args ...any) { fmt.Fprintf(out, "==> "+format+"\n", args...) }
	info := func(format string, args ...any) { fmt.Fprintf(out, "    "+format+"\n", args...) }

	if o.Dir == "" {
		d, err := os.MkdirTemp("", "nodeproof-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		o.Dir = d
	}

	step("A TPM manufacturer (swtpm's local CA) makes a TPM with an endorsement key certificate")
	man, err := swtpm.NewManufacturer(filepath.Join(o.Dir, "vendor"))
	if err != nil {
		return err
	}
	state := filepath.Join(o.Dir, "machine-1", "tpm")
	if err := man.Provision(ctx, state); err != nil {
		return err
	}
	roots, err := man.RootsDir()
	if err != nil {
		return err
	}
	info("vendor roots: %s", roots)

	step("The machine powers on: swtpm starts, and its firmware measures the boot (real %s event log)", o.Log)
	p, err := swtpm.Start(ctx, state)
	if err != nil {
		return err
	}
	defer p.Stop()
	log := firmwaretestdata.MustLog(o.Log)
	ch, err := tpm.DialSocket("tcp", p.Addr, log)
	if err != nil {
		return err
	}
	n, err := tpmtest.ExtendLog(ch, log)
	if err != nil {
		return err
	}
	info("swtpm on %s; %d measurements extended into the SHA-1 and SHA-256 PCR banks", p.Addr, n)

	step("Node: the agent makes the kubelet's key and an attestation key in the TPM")
	collector, err := tpm.NewCollector(ch)
	if err != nil {
		return err
	}
	defer collector.Close()
	kubelet, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKIXPublicKey(kubelet.Public())
	if err != nil {
		return err
	}
	keySHA, err := attest.KeySHA256(keyDER)
	if err != nil {
		return err
	}
	req, err := collector.Request()
	if err != nil {
		return err
	}
	info("kubelet key: ECDSA P-256, sha256 %s", hex.EncodeToString(keySHA))
	info("EK certificate: %d bytes; AK: ECDSA P-256, restricted signing key", len(req.EKCertificate))

	step("Server: checks the EK certificate chain and the AK, and seals a credential to the EK")
	pol, err := demoPolicy(roots).Policy()
	if err != nil {
		return err
	}
	set, err := tpm.LoadRootSet("swtpm-localca", pol.Trust.EKRoots[0].Dir)
	if err != nil {
		return err
	}
	v, err := tpm.NewVerifier(tpm.Options{Roots: []tpm.RootSet{set}, Clock: o.Clock})
	if err != nil {
		return err
	}
	challenge, sess, err := v.Challenge("worker", keySHA, req)
	if err != nil {
		return refused(out, err)
	}
	info("challenge: nonce %s…, credential %d bytes (only the TPM holding this EK and AK can open it)", hex.EncodeToString(challenge.Nonce[:8]), len(challenge.Credential))

	step("Node: activates the credential and quotes its PCRs over H(label ‖ nonce ‖ H(kubelet key))")
	ev, err := collector.Answer(challenge, keySHA)
	if err != nil {
		return err
	}
	info("quote of the %s bank, %d PCRs, event log %d bytes", ev.PCRs[0].Bank, len(ev.PCRs), len(ev.EventLog))

	step("Server: verifies activation, quote, binding, and replays the event log")
	claims, err := v.Verify(sess, ev)
	if err != nil {
		return refused(out, err)
	}
	printClaims(out, claims)

	step("Policy: may this machine have the worker pool?")
	if err := pol.Evaluate("worker", claims); err != nil {
		return refused(out, err)
	}
	info("ALLOWED: worker (Secure Boot on, EK from swtpm-localca, kernel command line has ro)")

	step("Policy: the locked pool pins another kernel")
	err = pol.Evaluate("locked", claims)
	reason, _ := attest.ReasonOf(err)
	info("REFUSED as expected: %s (%v)", reason, err)

	step("Attack: a captured quote replayed into a new session")
	ch2, sess2, err := v.Challenge("worker", keySHA, req)
	if err != nil {
		return err
	}
	ev2, err := collector.Answer(ch2, keySHA)
	if err != nil {
		return err
	}
	replayed := *ev
	replayed.ActivationSecret = ev2.ActivationSecret
	_, err = v.Verify(sess2, &replayed)
	reason, _ = attest.ReasonOf(err)
	info("REFUSED as expected: %s", reason)
	if reason != attest.ReasonQuoteBinding {
		return fmt.Errorf("replay was not refused for its binding: %v", err)
	}
	step("Part one done: verdict ALLOWED for worker, with the claims above")
	fmt.Fprintln(out)
	return runServer(ctx, o, step, info)
}

func refused(out io.Writer, err error) error {
	reason, _ := attest.ReasonOf(err)
	fmt.Fprintf(out, "    REFUSED: %s\n", reason)
	return err
}

func printClaims(out io.Writer, c *attest.Claims) {
	t := c.TPM
	b := t.Boot
	row := func(k, v string) { fmt.Fprintf(out, "    %-22s %s\n", k, v) }
	row("identity", c.Identity)
	row("EK trust", t.EKTrust)
	row("EK certificate", fmt.Sprintf("issuer %q serial %s", t.EKCertIssuer, t.EKCertSerial))
	row("AK name", t.AKName)
	row("PCR bank", t.PCRBank)
	row("replayed PCRs", fmt.Sprint(b.ReplayedPCRs)+fmt.Sprintf(" (%d events)", b.LogEvents))
	sb := "unknown"
	if b.SecureBootKnown {
		sb = map[bool]string{true: "on", false: "off"}[b.SecureBoot]
	}
	row("Secure Boot", sb)
	row("PK / KEK", short(b.PK)+" / "+short(b.KEK))
	row("db / dbx", short(b.DB)+" / "+short(b.DBX)+fmt.Sprintf(" (%d entries)", b.DBXEntries))
	stage := func(i int) string {
		if i < len(b.BootApplications) {
			return b.BootApplications[i]
		}
		return ""
	}
	row("shim", stage(attest.StageShim))
	row("boot loader", stage(attest.StageBootloader))
	row("kernel", stage(attest.StageKernel))
	row("kernel command line", strings.TrimSpace(b.KernelCmdline))
	for _, f := range b.GrubFiles {
		row("GRUB read", f.Path+" "+short(f.Digest))
	}
	row("bound kubelet key", hex.EncodeToString(c.KubeletKeySHA256))
}

func short(h string) string {
	if len(h) > 16 {
		return h[:16] + "…"
	}
	if h == "" {
		return "(not measured)"
	}
	return h
}
