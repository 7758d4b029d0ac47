package liveboot_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/systemtest"
)

var updateLogs = flag.Bool("update-firmware-testdata", false, "write the live boots' event logs and their expectations into firmware-testdata (see its README)")

const node = "live-1"

// livePolicy admits exactly Debian's signed shim, GRUB and kernel by the
// Authenticode digests this test computes from the package files, on an
// EK from the swtpm manufacturer, with Secure Boot on; with audit, the
// kernel's digest rule is in audit mode (a rollout: another kernel is
// admitted and reported).
func livePolicy(dg digests, audit bool) func(*systemtest.World) *policytest.Builder {
	return func(w *systemtest.World) *policytest.Builder {
		return policytest.New().EKRoot(systemtest.VendorRoot, w.EKRoots).Pool("worker", livePool(dg, audit, "ca:"+systemtest.VendorRoot))
	}
}

// livePool is livePolicy's pool, its EKs trusted through trust.
func livePool(dg digests, audit bool, trust ...string) *policytest.Pool {
	pool := policytest.TPM(trust...).SecureBoot().Boot(dg.shim, dg.grub, dg.kernel).Requested().Lifetime(30*time.Minute, 2*time.Hour)
	if audit {
		pool = pool.Audit(policy.RuleBootComponents + ".kernel")
	}
	return pool
}

// digests are the PE Authenticode SHA-256 digests of the boot chain's
// files, as Debian's packages ship them.
type digests struct{ shim, grub, kernel string }

// authenticode computes them with attest/bootimage (saferwall/pe),
// independently of nodeproof's event log code.
func authenticode(t testing.TB, parts *liveboot.Parts) digests {
	t.Helper()
	one := func(name string) string {
		img, err := bootimage.ReadFile(parts.Path(name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return hex.EncodeToString(img.AuthenticodeSHA256)
	}
	return digests{shim: one(parts.Shim), grub: one(parts.Grub), kernel: one(parts.Kernel)}
}

// TestLiveBoot boots a real machine fifteen times (make test-boot; about
// 20-45 s a boot here, one VM at a time; the first run also enrols the
// test Secure Boot keys, a ~10 s firmware boot, cached after): OVMF with Secure Boot and
// Microsoft's keys, Debian's Microsoft-signed shim, its signed GRUB and
// kernel, measured into swtpm; the agent, Ignition and kubelet-csr in the
// initramfs; the guest's network restricted to the host's loopback
// servers (a real kube-apiserver, `nodeproof serve`, `nodeproof approve`).
//
//  1. Secure Boot on, first boot (its initramfs also holds the kubelet):
//     the agent enrols, the attested tier is released, Ignition's fetch
//     stage applies it, `nodeproof-agent kubelet-bootstrap` gets the
//     kubelet's first client certificate with the bootstrap kubeconfig it
//     carried and the key the agent bound (`nodeproof approve` approves
//     the CSR, kube-controller-manager signs it), and the real kubelet on
//     Debian's containerd, rotating its certificates, uses it, makes no
//     bootstrap CSR of its own, registers its Node, gets a serving
//     certificate for the addresses the EK inventory attests and renews
//     its client certificate (checkKubelet). The live event log replays to the
//     PCRs the guest's kernel shows, and its boot applications are the
//     Authenticode digests of the package files.
//  2. Reboot (a new swtpm process on the same state): fresh PCRs, the same
//     EK, a higher reset count; the agent re-attests at boot, the binding
//     counts the boot, the node stays attested.
//  3. A revocation as published (revocation): a dbx update revoking
//     Debian's Secure Boot CA goes into the policy (`policy revoke
//     --require-dbx`), the dry run says the node would be tainted, and
//     applied, the running node is tainted without a reboot (the fleet
//     re-judged); the machine's firmware dbx and its chain (GRUB and the
//     kernel signed by the replacement key) updated, it boots, re-attests
//     and is cleared.
//  4. Own Secure Boot keys (SignerLab: the test PK and KEK; db
//     Microsoft's and the test db CA; a real 186-entry dbx; the test MOK
//     CA in MokList; enrolled once by OVMF's shell and cached), the kernel
//     re-signed by the test db signer (the same code: the digest policy
//     admits it): re-attested, and the claims the server recorded name
//     Microsoft's UEFI CA for the shim, Debian's CA for GRUB, the kernel's
//     possible signers (Debian's CA and the test db CA: the shim used
//     both), the store's PK, KEK, db and dbx, and a MokList that holds
//     the MOK beside Debian's CA.
//  5. Kernel B (Debian's previous kernel: another image, the same
//     signing key), with the same store: the server's policy pins kernel
//     A's digest with the kernel's rule in audit mode, so it is admitted,
//     and the binding's status and a PolicyAuditRefusal Event say which
//     rule would have refused it. The logs already captured are then
//     judged offline (no boot): a policy learned from boot 1's log
//     (kernel A; signer rules by default) admits kernel B's boot and
//     refuses boot 4's (kernel C, signed by another key); the digest
//     policy without audit refuses kernel B.
//  6. The whole boot (wholeBoot): the policy `nodeproof policy learn`
//     writes from boot 5's log refuses a tampered initramfs, a changed
//     command line and a changed grub.cfg, each naming what differs; a
//     kernel update learned from its files alone is admitted, its
//     prediction what the machine measured; the floor raised, kernel B is
//     refused as a rollback (five boots).
//  7. Unified kernel images (ukiBoots; three boots): a UKI (systemd-stub
//     252, kernel A, the live initramfs and command line) signed by the
//     test db signer, learned from its file into the pool (`policy learn
//     --efi uki= --uki-pool`) and run by the firmware, is admitted, PCR 11
//     its sections; one with another initramfs and command line, signed
//     by the test MOK signer and run by the shim, is refused
//     BootSignerNotAllowed; one of kernel B signed by the db signer is
//     admitted with no policy change (make bench-boot times a UKI's boot
//     beside the GRUB chain's).
//  8. Secure Boot off (OVMF variables without keys, GRUB's linuxefi):
//     refused SecureBootDisabled, on the console and as the agent's report
//     Event, authenticated (the agent kept its copy of the bound key); the
//     node failed and tainted.
//  9. Secure Boot off with GRUB's plain linux (what update-grub writes):
//     the kernel has no event log; refused EventLogMissing, and the agent
//     says why.
//
// Each boot's serial console is kept in an artifact directory when the
// test fails.
func TestLiveBoot(t *testing.T) {
	begin := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "liveboot %5.1fs: %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
	}
	ctx := context.Background()
	if err := liveboot.Check(); err != nil {
		t.Fatal(err)
	}
	parts, err := liveboot.LoadParts(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	dg := authenticode(t, parts)
	say("boot chain %s: shim %s…, GRUB %s…, kernel %s… (Authenticode SHA-256 of the package files)", parts.ABI, dg.shim[:12], dg.grub[:12], dg.kernel[:12])
	artifacts := artifactDir(t)
	cons := &consoles{dir: artifacts}

	bins := build(t, say)
	w := startWorld(t, bins, livePolicy(dg, true), say)

	imgStart := time.Now()
	work, err := os.MkdirTemp("", "np-liveboot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	ignition, err := testenv.IgnitionPath()
	if err != nil {
		t.Fatal(err)
	}
	g := &liveboot.Guest{Agent: bins.agent, KubeletCSR: bins.kubeletCSR, Ignition: ignition, CABundle: w.caBundle(t),
		Pointer: w.pointer(t), Server: w.guestURL(), Pool: "worker", Node: node}
	initramfs := filepath.Join(work, "initrd.img")
	if _, err := withProgress(say, "building the initramfs", func() (struct{}, error) { return struct{}{}, g.BuildInitramfs(ctx, parts, initramfs) }); err != nil {
		t.Fatal(err)
	}
	// The first boot's initramfs holds the kubelet too, and the reboot
	// boots the same disk (PCR 5 measures its GPT); the other boots do not
	// run the kubelet and boot faster without it.
	kg := *g
	if kg.Kubelet, err = testenv.KubeletPath(); err != nil {
		t.Fatal(err)
	}
	rt, err := liveboot.LoadRuntime(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	kg.Containerd = rt.Path()
	kubeletInitramfs := filepath.Join(work, "initrd-kubelet.img")
	if _, err := withProgress(say, "building the initramfs with the kubelet", func() (struct{}, error) { return struct{}{}, kg.BuildInitramfs(ctx, parts, kubeletInitramfs) }); err != nil {
		t.Fatal(err)
	}
	efiDisk, plainDisk, kubeletDisk := filepath.Join(work, "boot-linuxefi.img"), filepath.Join(work, "boot-linux.img"), filepath.Join(work, "boot-kubelet.img")
	for _, d := range []struct {
		disk, initramfs string
		efi             bool
	}{{efiDisk, initramfs, true}, {plainDisk, initramfs, false}, {kubeletDisk, kubeletInitramfs, true}} {
		if err := liveboot.BuildBootDisk(ctx, parts, d.initramfs, d.efi, d.disk); err != nil {
			t.Fatal(err)
		}
	}
	fi, _ := os.Stat(initramfs)
	fk, _ := os.Stat(kubeletInitramfs)
	say("initramfs (%d MB: busybox, nodeproof-agent, Ignition and its libraries, kubelet-csr, %d modules; %d MB with the kubelet) and three boot disks built in %.1fs",
		fi.Size()>>20, len(parts.Modules), fk.Size()>>20, time.Since(imgStart).Seconds())

	m, err := liveboot.NewMachine(ctx, w.man, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	// The operator lists the machine's EK with the node's name and the
	// addresses its kubelet serves on (the serving CSR is judged against
	// them); the vendor CA still trusts the EKs of other machines.
	listInventory(t, w, livePool(dg, true, "ca:"+systemtest.VendorRoot, "inventory"), ekEntry{ek: ekSHA256(t, m), node: node, addresses: []string{node, liveboot.GuestIP}})
	n := 0
	bootWith := func(t *testing.T, name, disk string, secureBoot bool, vars string) *liveboot.Result {
		t.Helper()
		n++
		if n > 15 {
			t.Fatal("more than fifteen boots")
		}
		say("boot %d (%s): Secure Boot %s", n, name, map[bool]string{true: "on", false: "off"}[secureBoot])
		r, err := m.Boot(ctx, liveboot.Boot{Disk: disk, SecureBoot: secureBoot, Vars: vars, Forward: []int{w.serverPort, w.apiPort},
			FwCfg: map[string]string{"nodeproof/plan": "agent"}, Progress: say})
		path := cons.save(t, fmt.Sprintf("boot%d-%s", n, name), r)
		if err != nil {
			t.Fatalf("boot %d: %v (console: %s)\n%s", n, err, path, tail(r))
		}
		say("boot %d: powered off after %.1fs", n, r.Took.Seconds())
		return r
	}
	boot := func(t *testing.T, name, disk string, secureBoot bool) *liveboot.Result {
		t.Helper()
		return bootWith(t, name, disk, secureBoot, "")
	}

	var first, reboot *liveboot.Result
	var boots1, reset1 int64
	ok := t.Run("Secure Boot on: enrol, the attested tier, Ignition; the agent gets the kubelet its first certificate with the bound key, approved and signed; the rotating kubelet only renews", func(t *testing.T) {
		r := boot(t, "secureboot-enrol", kubeletDisk, true)
		first = r
		expectLines(t, r, "nodeproof-liveboot: secure-boot 1", "nodeproof-liveboot: agent pointer start", "nodeproof-liveboot: agent exit 0",
			"nodeproof-liveboot: ignition exit 0", "nodeproof-liveboot: agent kubelet-bootstrap start",
			"nodeproof-agent: submitted the kubelet's client CSR node-csr-", "Approved (NodeproofAttestedTPM); wrote /var/lib/kubelet/pki/kubelet-client-",
			"nodeproof-liveboot: agent kubelet-bootstrap exit 0",
			"kubelet-csr: client certificate CN=system:node:"+node+",O=system:nodes", "nodeproof-liveboot: kubelet start (rotate-certificates true, containerd)",
			"nodeproof-liveboot: containerd serving", "nodeproof-liveboot: kubelet: serving certificate written, client certificate renewed; stopping it",
			"nodeproof-liveboot: kubelet exit",
			`"Loading cert/key pair from a file" filePath="/var/lib/kubelet/pki/kubelet-client-current.pem"`, `"Rotating certificates"`,
			"kubelet-csr: client certificate CN=system:node:"+node+",O=system:nodes",
			"nodeproof-liveboot: kubelet bootstrap exit 0",
			"nodeproof-liveboot: agent reattest start (first boot)", fmt.Sprintf("node %s re-attested (tpm evidence, boot 1 seen by the server)", node),
			"nodeproof-liveboot: agent exit 0")
		checkKubelet(t, ctx, w, r)
		checkLiveLog(t, r, dg, true)
		s := w.inspectUntil(t, node, 30*time.Second, func(s *inspect.Story) string {
			if a, _, taint := nodeState(s); a != corev1.ConditionTrue || taint != "" {
				return "the Node attested and untainted"
			}
			if s.Binding == nil || s.Binding.Status.Boots != 1 {
				return "the binding counting this boot"
			}
			return ""
		})
		boots1, reset1 = s.Binding.Status.Boots, s.Binding.Status.ResetCount
		if *updateLogs {
			saveLiveLog(t, "debian-12-ovmf-secure-boot", r, parts, dg, true)
		}
	})
	if !ok {
		return
	}

	ok = t.Run("reboot: fresh PCRs, the same EK, a higher reset count; re-attested at boot, still attested", func(t *testing.T) {
		before := w.inspectUntil(t, node, time.Second, func(*inspect.Story) string { return "" })
		r := boot(t, "secureboot-reboot", kubeletDisk, true) // the first boot's disk: its GPT is in PCR 5
		reboot = r
		expectLines(t, r, "nodeproof-liveboot: secure-boot 1", "nodeproof-liveboot: agent reattest start", "nodeproof-liveboot: agent exit 0")
		if _, found := r.Find(fmt.Sprintf("node %s re-attested (tpm evidence, boot %d seen by the server)", node, boots1+1)); !found {
			t.Errorf("the agent does not say the server saw boot %d", boots1+1)
		}
		// The same boot chain into reset PCRs: the same values.
		p1, p2 := guestPCRs(t, first), guestPCRs(t, r)
		for _, i := range []int{0, 1, 2, 3, 4, 5, 6, 7} {
			if p1[i] != p2[i] {
				t.Errorf("PCR %d after the reboot %s, first boot %s: not reset?", i, p2[i], p1[i])
			}
		}
		s := w.inspectUntil(t, node, 30*time.Second, func(s *inspect.Story) string {
			switch a, _, taint := nodeState(s); {
			case s.Binding == nil || s.Binding.Status.Boots != boots1+1:
				return fmt.Sprintf("the binding counting boot %d", boots1+1)
			case a != corev1.ConditionTrue || taint != "":
				return "the Node attested and untainted"
			}
			return ""
		})
		if s.Binding.Identity != before.Binding.Identity {
			t.Errorf("identity %s after the reboot, %s before: not the same EK", s.Binding.Identity, before.Binding.Identity)
		}
		if s.Binding.Status.ResetCount <= reset1 {
			t.Errorf("TPM reset count %d after the reboot, %d before", s.Binding.Status.ResetCount, reset1)
		}
		say("reboot: boots %d -> %d, TPM reset count %d -> %d, identity %.24s…", boots1, s.Binding.Status.Boots, reset1, s.Binding.Status.ResetCount, s.Binding.Identity)
	})
	if !ok {
		return
	}

	ok = t.Run("a revocation as published: the running node tainted without a reboot; its firmware's dbx and a chain signed by the replacement key clear it", func(t *testing.T) {
		revocation(t, ctx, w, g, work, say, func(name, disk, vars string) *liveboot.Result { return bootWith(t, name, disk, true, vars) }, boots1+2)
	})
	if !ok {
		return
	}

	var testDB *liveboot.Result
	ok = t.Run("own Secure Boot keys, a real dbx, a MOK, the kernel re-signed by a test db key: re-attested; the claims name each signer", func(t *testing.T) {
		testDB = ownKeys(t, ctx, w, g, work, dg, say, func(name, disk, vars string) *liveboot.Result { return bootWith(t, name, disk, true, vars) }, boots1+3)
	})
	if !ok {
		return
	}

	var kernelB *liveboot.Result
	ok = t.Run("kernel B signed by the same key: admitted by the kernel rule in audit mode, said in the binding and an Event; signer rules learned from kernel A admit B and refuse kernel C, digest rules refuse B", func(t *testing.T) {
		kernelB = signerRules(t, ctx, w, g, work, dg, say, func(name, disk, vars string) *liveboot.Result { return bootWith(t, name, disk, true, vars) }, boots1+4, first, testDB)
	})
	if !ok {
		return
	}

	ok = t.Run("the whole boot, judged by the policy policy learn writes: a tampered initramfs, command line or grub.cfg refused; a kernel update learned from its files admitted; a rollback refused", func(t *testing.T) {
		wholeBoot(t, ctx, w, g, work, say, func(name, disk, vars string) *liveboot.Result { return bootWith(t, name, disk, true, vars) }, boots1+4, kernelB)
	})
	if !ok {
		return
	}

	ok = t.Run("unified kernel images (systemd-stub): one learned from its file and run by the firmware admitted; another initramfs and command line signed by another key refused; a new one signed by the key admitted with no policy change", func(t *testing.T) {
		ukiBoots(t, ctx, w, g, work, say, func(name, disk, vars string) *liveboot.Result { return bootWith(t, name, disk, true, vars) })
	})
	if !ok {
		return
	}

	ok = t.Run("Secure Boot off: refused SecureBootDisabled, on the console and as a report Event; the node failed and tainted", func(t *testing.T) {
		r := boot(t, "secureboot-off", efiDisk, false)
		expectLines(t, r, "nodeproof-liveboot: secure-boot 0", "nodeproof-liveboot: agent reattest start",
			"nodeproof-agent: REFUSED at re-attestation by the server (HTTP 403): "+string(attest.ReasonPolicySecureBootOff),
			"nodeproof-liveboot: agent exit 3")
		checkLiveLog(t, r, dg, false)
		w.inspectUntil(t, node, 30*time.Second, func(s *inspect.Story) string {
			switch a, reason, taint := nodeState(s); {
			case s.State != inspect.StateFailed || s.Reason != string(attest.ReasonPolicySecureBootOff):
				return "state Failed " + string(attest.ReasonPolicySecureBootOff) + ", not " + s.State + " " + s.Reason
			case a != corev1.ConditionFalse || reason != string(attest.ReasonAttestationFailed) || taint != corev1.TaintEffectNoSchedule:
				return "the Node's Attested condition False (AttestationFailed) and the NoSchedule taint"
			// Authenticated: the agent proves the key it bound (its own
			// copy, --bound-key), whatever the kubelet did with its key
			// files since the first boot (deploy/node/README.md).
			case !hasEvent(s.Cluster.Events, "NodeBinding/"+node, string(attest.ReasonNodeReport), string(attest.ReasonPolicySecureBootOff)):
				return "the agent's report Event (NodeReportedFailure: SecureBootDisabled)"
			case !hasEvent(s.Cluster.Events, "NodeBinding/"+node, string(attest.ReasonAttestationFailed), ""):
				return "the server's AttestationFailed Event"
			}
			return ""
		})
		if *updateLogs {
			saveLiveLog(t, "debian-12-ovmf-no-secure-boot", r, parts, dg, false)
		}
	})
	if !ok {
		return
	}

	t.Run("Secure Boot off, GRUB's plain linux: no event log; refused EventLogMissing, and the agent says why", func(t *testing.T) {
		r := boot(t, "no-event-log", plainDisk, false)
		expectLines(t, r, "nodeproof-liveboot: secure-boot 0", "nodeproof-liveboot: event-log missing",
			"nodeproof-agent: the firmware's event log is missing",
			"nodeproof-agent: REFUSED at re-attestation by the server (HTTP 403): "+string(attest.ReasonEventLogMissing),
			"nodeproof-liveboot: agent exit 3")
		if _, ok := r.Files["var/lib/liveboot/eventlog.bin"]; ok {
			t.Error("the guest found an event log")
		}
		w.inspectUntil(t, node, 30*time.Second, func(s *inspect.Story) string {
			if a, _, taint := nodeState(s); s.State != inspect.StateFailed || s.Reason != string(attest.ReasonEventLogMissing) || a != corev1.ConditionFalse || taint != corev1.TaintEffectNoSchedule {
				return "state Failed EventLogMissing, tainted, not " + s.State + " " + s.Reason
			}
			return ""
		})
	})
	if !t.Failed() {
		os.RemoveAll(artifacts)
	}
	bootTimes := []string{}
	for _, r := range []*liveboot.Result{first, reboot} {
		if r != nil {
			bootTimes = append(bootTimes, fmt.Sprintf("%.1fs", r.Took.Seconds()))
		}
	}
	say("done in %.0fs; Secure Boot boots took %s", time.Since(begin).Seconds(), strings.Join(bootTimes, ", "))
}

// checkKubelet checks the kubelet's two certificates from the first boot
// (the guest left them on its data disk) against the API server's CSRs:
// the bootstrap certificate, which `nodeproof-agent kubelet-bootstrap`
// got before the kubelet started, has the only CSR made with the
// bootstrap token (the kubelet, rotating, made none of its own), approved
// for the attestation (the approver approves a first client CSR only for
// the key the evidence bound); its certificate has the node's client
// subject, chains to the API server's client CA, and its public key is
// the one the guest's kubelet-csr found equal to the agent's key; the
// renewal was requested by the kubelet with that certificate, approved,
// and holds another key.
func checkKubelet(t *testing.T, ctx context.Context, w *world, r *liveboot.Result) {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(w.signerCA) {
		t.Fatal("the signer's CA does not parse")
	}
	leaf := func(file string, usage x509.ExtKeyUsage) *x509.Certificate {
		t.Helper()
		b, ok := r.Files[file]
		if !ok {
			t.Fatalf("the guest left no %s", file)
		}
		block, _ := pem.Decode(b)
		if block == nil || block.Type != "CERTIFICATE" {
			t.Fatalf("%s: no certificate first", file)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if c.Subject.CommonName != "system:node:"+node || !slices.Equal(c.Subject.Organization, []string{"system:nodes"}) {
			t.Errorf("%s: subject %s", file, c.Subject)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: c.NotAfter.Add(-time.Second), KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("%s does not chain to the signer's CA for %v: %v", file, usage, err)
		}
		return c
	}
	boot, renewed := leaf("var/lib/liveboot/kubelet-client-bootstrap.pem", x509.ExtKeyUsageClientAuth), leaf("var/lib/liveboot/kubelet-client-renewed.pem", x509.ExtKeyUsageClientAuth)
	serving := leaf("var/lib/liveboot/kubelet-server.pem", x509.ExtKeyUsageServerAuth)
	if !slices.Equal(serving.DNSNames, []string{node}) || len(serving.IPAddresses) != 1 || !serving.IPAddresses[0].Equal(net.ParseIP(liveboot.GuestIP)) {
		t.Errorf("the serving certificate names %q and %v; want the node's name and %s, its Node's addresses", serving.DNSNames, serving.IPAddresses, liveboot.GuestIP)
	}
	if bytes.Equal(boot.RawSubjectPublicKeyInfo, renewed.RawSubjectPublicKeyInfo) || boot.SerialNumber.Cmp(renewed.SerialNumber) == 0 {
		t.Errorf("the renewed certificate (serial %x) has the bootstrap certificate's key or serial (%x)", renewed.SerialNumber, boot.SerialNumber)
	}
	if got := boot.NotAfter.Sub(boot.NotBefore); got != SigningDuration+5*time.Minute {
		t.Errorf("the bootstrap certificate lives %s; kube-controller-manager signs for %s, backdated 5 minutes", got, SigningDuration)
	}
	lines := []string{}
	for _, l := range r.Lines {
		if strings.Contains(l.Text, "kubelet-csr: client certificate ") {
			lines = append(lines, l.Text)
		}
	}
	if len(lines) != 2 || !strings.Contains(lines[0], "public key the agent's bound key") || !strings.Contains(lines[1], "public key another key than the agent's") {
		t.Fatalf("the guest's kubelet-csr lines %q; want the bootstrap certificate with the agent's bound key, then a renewal with another", lines)
	}
	csrs, err := w.kc.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	csrOf := func(c *x509.Certificate) *certv1.CertificateSigningRequest {
		t.Helper()
		for i := range csrs.Items {
			if b, _ := pem.Decode(csrs.Items[i].Status.Certificate); b != nil && bytes.Equal(b.Bytes, c.Raw) {
				return &csrs.Items[i]
			}
		}
		t.Fatalf("no CSR on the API server issued the certificate with serial %x", c.SerialNumber)
		return nil
	}
	first, renewal, servingCSR := csrOf(boot), csrOf(renewed), csrOf(serving)
	var byToken []string
	for _, c := range csrs.Items {
		if strings.HasPrefix(c.Spec.Username, "system:bootstrap:") {
			byToken = append(byToken, c.Name)
		}
	}
	if len(byToken) != 1 || byToken[0] != first.Name {
		t.Errorf("CSRs made with the bootstrap token: %q; want only the agent's %s (the kubelet made a bootstrap CSR of its own?)", byToken, first.Name)
	}
	if _, found := r.Find("nodeproof-liveboot: agent kubelet-bootstrap exit 0"); !found {
		t.Errorf("the agent's kubelet-bootstrap did not finish")
	}
	if !strings.HasPrefix(first.Spec.Username, "system:bootstrap:") || !approvedBy(first, "NodeproofAttestedTPM") || first.Spec.SignerName != certv1.KubeAPIServerClientKubeletSignerName {
		t.Errorf("the bootstrap CSR %s by %q for %s: %+v; want approved NodeproofAttestedTPM, requested with a bootstrap token", first.Name, first.Spec.Username, first.Spec.SignerName, first.Status.Conditions)
	}
	if renewal.Spec.Username != "system:node:"+node || !approvedBy(renewal, "NodeproofAttestedTPM") {
		t.Errorf("the renewal CSR %s by %q: %+v; want approved NodeproofAttestedTPM, requested by the node", renewal.Name, renewal.Spec.Username, renewal.Status.Conditions)
	}
	if servingCSR.Spec.Username != "system:node:"+node || servingCSR.Spec.SignerName != certv1.KubeletServingSignerName || !approvedBy(servingCSR, "NodeproofAttestedTPM") ||
		!slices.ContainsFunc(servingCSR.Status.Conditions, func(c certv1.CertificateSigningRequestCondition) bool {
			return strings.Contains(c.Message, "serving SANs attested by tpm evidence")
		}) {
		t.Errorf("the serving CSR %s by %q for %s: %+v; want approved NodeproofAttestedTPM for the attested SANs, requested by the node", servingCSR.Name, servingCSR.Spec.Username, servingCSR.Spec.SignerName, servingCSR.Status.Conditions)
	}
	// The kubelet registered its Node itself (the Node authorizer and
	// NodeRestriction run), with the addresses the serving CSR named.
	n, err := w.kc.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the kubelet registered no Node: %v", err)
	}
	if len(n.ManagedFields) == 0 || n.ManagedFields[0].Manager != "kubelet" || n.ManagedFields[0].Operation != metav1.ManagedFieldsOperationUpdate {
		t.Errorf("the Node %s was not created by the kubelet: managed fields %+v", node, n.ManagedFields)
	}
	want := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: liveboot.GuestIP}, {Type: corev1.NodeHostName, Address: node}}
	if !slices.Equal(n.Status.Addresses, want) {
		t.Errorf("the Node's addresses %v; want %v", n.Status.Addresses, want)
	}
	start, _ := r.Find("nodeproof-liveboot: kubelet start")
	done, _ := r.Find("nodeproof-liveboot: kubelet: serving certificate written")
	t.Logf("kubelet: bootstrap CSR %s (%s), renewal CSR %s (%s) and serving CSR %s (%v %v) approved and signed; certificates %x, %x and %x; containerd and the kubelet from their start to both certificates %.1fs of the %.1fs boot",
		first.Name, first.Spec.Username, renewal.Name, renewal.Spec.Username, servingCSR.Name, serving.DNSNames, serving.IPAddresses, boot.SerialNumber, renewed.SerialNumber, serving.SerialNumber,
		(done.At - start.At).Seconds(), r.Took.Seconds())
}

// artifactDir is where the boots' consoles go ($NODEPROOF_ARTIFACTS, else
// a new directory under the system's temporary one); kept when the test
// fails.
func artifactDir(t *testing.T) string {
	t.Helper()
	parent := os.Getenv("NODEPROOF_ARTIFACTS")
	if parent != "" {
		if err := os.MkdirAll(parent, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := os.MkdirTemp(parent, "liveboot-consoles-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the boots' serial consoles are kept in %s", dir)
		}
	})
	return dir
}

func tail(r *liveboot.Result) string {
	if r == nil {
		return ""
	}
	c := r.Console()
	if len(c) > 6000 {
		c = "…" + c[len(c)-6000:]
	}
	return c
}

// expectLines fails unless the console holds each line, in this order.
func expectLines(t *testing.T, r *liveboot.Result, want ...string) {
	t.Helper()
	i := 0
	for _, l := range r.Lines {
		if i < len(want) && strings.Contains(l.Text, want[i]) {
			i++
		}
	}
	if i < len(want) {
		t.Fatalf("the console lacks %q (after %q)\n%s", want[i], want[:i], tail(r))
	}
}

func approvedBy(csr *certv1.CertificateSigningRequest, reason string) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certv1.CertificateApproved && c.Reason == reason {
			return true
		}
	}
	return false
}

// guestPCRs are the SHA-256 PCRs the guest's kernel showed
// (/sys/class/tpm/tpm0/pcr-sha256/N), lower-case hex by index.
func guestPCRs(t *testing.T, r *liveboot.Result) map[int]string {
	t.Helper()
	b, ok := r.Files["var/lib/liveboot/pcr-sha256"]
	if !ok {
		t.Fatal("the guest left no PCR values")
	}
	out := map[int]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("PCR line %q", line)
		}
		i, err := strconv.Atoi(f[0])
		if err != nil || len(f[1]) != 64 {
			t.Fatalf("PCR line %q", line)
		}
		out[i] = strings.ToLower(f[1])
	}
	if len(out) != 24 {
		t.Fatalf("%d PCRs from the guest", len(out))
	}
	return out
}

// liveLog is what checkLiveLog read from a live boot's log.
type liveLog struct {
	raw      []byte
	pcrs     map[int]string
	replayed []int // PCRs 0-16 with events, all replaying
	apps     []string
	dbx      int
}

// checkLiveLog checks a live boot's event log with go-eventlog, against
// expectations that do not come from nodeproof: it replays to the PCRs
// the guest's kernel showed, and its PCR 4 boot applications are the
// Authenticode digests of the package files (shim, GRUB, then with Secure
// Boot the kernel, loaded through the shim; without, GRUB loads the
// kernel itself and measures it into PCR 9 only).
func checkLiveLog(t *testing.T, r *liveboot.Result, dg digests, secureBoot bool) *liveLog {
	t.Helper()
	raw, ok := r.Files["var/lib/liveboot/eventlog.bin"]
	if !ok {
		t.Fatal("the guest found no event log")
	}
	l := &liveLog{raw: raw, pcrs: guestPCRs(t, r)}
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		t.Fatalf("go-eventlog cannot parse the live log: %v", err)
	}
	var mrs []register.MR
	for i := 0; i < 24; i++ {
		d, err := hex.DecodeString(l.pcrs[i])
		if err != nil {
			t.Fatal(err)
		}
		mrs = append(mrs, register.PCR{Index: i, Digest: d, DigestAlg: crypto.SHA256})
	}
	events, err := el.Verify(mrs)
	if err != nil {
		t.Fatalf("the live log does not replay to the guest's PCRs: %v", err)
	}
	seen := map[int]bool{}
	for _, e := range events {
		if e.Index <= 16 {
			seen[e.Index] = true
		}
		if e.Index == 4 && e.Type == tcg.EFIBootServicesApplication {
			l.apps = append(l.apps, hex.EncodeToString(e.Digest))
		}
	}
	for i := 0; i <= 16; i++ {
		if seen[i] {
			l.replayed = append(l.replayed, i)
		}
	}
	want := []string{dg.shim, dg.grub}
	if secureBoot {
		want = append(want, dg.kernel)
	}
	if got := slices.Compact(slices.Clone(l.apps)); !slices.Equal(got, want) {
		t.Errorf("PCR 4 boot applications %v; want the package files' Authenticode digests %v", l.apps, want)
	}
	return l
}

// saveLiveLog writes a live boot's event log into firmware-testdata with
// its expectation, each field from this test's own sources (see
// firmware-testdata/README.md, "Live boots"): the replayed PCRs and their
// values from the guest's kernel, Secure Boot from how the boot was made,
// the dbx entries counted by hand, the boot applications from the package
// files' Authenticode digests (checkLiveLog), the command line from the
// grub.cfg this package wrote.
func saveLiveLog(t *testing.T, name string, r *liveboot.Result, parts *liveboot.Parts, dg digests, secureBoot bool) {
	t.Helper()
	l := checkLiveLog(t, r, dg, secureBoot)
	exp := firmwaretestdata.Expected{
		Parses: true, SHA256: true, SwTPMReplay: true, ReplayPCRs: l.replayed, SecureBoot: "off",
		DBXEntries: dbxEntries(t, l.raw), BootApplications: l.apps, KernelCmdline: liveboot.ESPKernel + " " + liveboot.KernelCmdline,
		PCRs: map[string]string{},
		Note: fmt.Sprintf("made by internal/liveboot's TestLiveBoot (-update-firmware-testdata): OVMF (Debian 12 ovmf) %s, Debian's shim-signed %s, grub-efi-amd64-signed %s (linuxefi), linux-image-%s %s, swtpm",
			map[bool]string{true: "with Microsoft's keys", false: "without keys (setup mode)"}[secureBoot],
			parts.Packages[liveboot.ShimPackage], parts.Packages[liveboot.GrubPackage], parts.ABI, parts.Packages["linux-image-"+parts.ABI]),
	}
	if secureBoot {
		exp.SecureBoot = "on"
	}
	for _, i := range l.replayed {
		exp.PCRs[strconv.Itoa(i)] = l.pcrs[i]
	}
	if err := exp.ReadSecureBoot(l.raw); err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(exp, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	dir := "../../firmware-testdata"
	if err := os.WriteFile(filepath.Join(dir, "logs", name+".bin"), l.raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "expected", name+".json"), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote firmware-testdata/logs/%s.bin and its expectation", name)
}

// dbxEntries counts the entries of the measured dbx (EFI_SIGNATURE_LISTs:
// (ListSize - 28 - HeaderSize) / SignatureSize each), read by hand from
// the PCR 7 variable event, as firmware-testdata's README describes.
func dbxEntries(t *testing.T, raw []byte) int {
	t.Helper()
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range el.Events(register.HashSHA256) {
		if e.Index != 7 || e.Type != tcg.EFIVariableDriverConfig {
			continue
		}
		v, err := tcg.ParseUEFIVariableData(bytes.NewReader(e.Data))
		if err != nil {
			t.Fatal(err)
		}
		if string(utf16.Decode(v.UnicodeName)) != "dbx" {
			continue
		}
		n, data := 0, v.VariableData
		for len(data) >= 28 {
			size := int(le32(data[16:]))
			hdr := int(le32(data[20:]))
			sig := int(le32(data[24:]))
			if size < 28+hdr || size > len(data) || sig == 0 {
				t.Fatalf("dbx signature list of size %d", size)
			}
			n += (size - 28 - hdr) / sig
			data = data[size:]
		}
		return n
	}
	return -1
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
