package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeproof/nodeproof/approver"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/pointer"
	"github.com/nodeproof/nodeproof/systemtest"
)

// bootPolicy is the live boot's: the worker pool takes TPM evidence from
// the swtpm manufacturer's EKs, booted with Secure Boot.
func bootPolicy(w *systemtest.World) *policytest.Builder {
	return policytest.New().EKRoot(systemtest.VendorRoot, w.EKRoots).
		Pool("worker", policytest.TPM("ca:"+systemtest.VendorRoot).SecureBoot().Requested().Lifetime(30*time.Minute, 2*time.Hour))
}

// bootNode is the live machine's node name.
const bootNode = "worker-live"

// RunBoot is `make demo-boot`: make demo's story on a live VM. A real
// machine (QEMU, OVMF with Secure Boot and Microsoft's keys, Debian's
// signed shim, GRUB and kernel, measured into swtpm) boots with the agent,
// Ignition and kubelet-csr in its initramfs (guestBin holds the static
// nodeproof-agent and kubelet-csr) against a real API server, `nodeproof
// serve` and `nodeproof approve`: it enrols and its kubelet CSR is
// approved; it reboots and re-attests; it boots with Secure Boot off and
// is refused, tainted. The console's nodeproof lines are shown as they
// come.
func RunBoot(ctx context.Context, o Options, guestBin string) error {
	if o.Clock == nil {
		o.Clock = time.Now
	}
	out := o.Out
	step := func(format string, args ...any) { fmt.Fprintf(out, "==> "+format+"\n", args...) }
	info := func(format string, args ...any) { fmt.Fprintf(out, "    "+format+"\n", args...) }
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "nodeproof-demo-boot-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		o.Dir = d
	}
	examples := o.Examples
	if examples == "" {
		examples = Examples
	}
	if err := liveboot.Check(); err != nil {
		return err
	}
	parts, err := liveboot.LoadParts(testenv.Cache())
	if err != nil {
		return err
	}
	ignition, err := testenv.IgnitionPath()
	if err != nil {
		return err
	}
	agentBin, csrBin := filepath.Join(guestBin, "nodeproof-agent"), filepath.Join(guestBin, "kubeletcsr")
	for _, b := range []string{agentBin, csrBin} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("the guest's programs: %w (make demo-boot builds them)", err)
		}
	}

	step("The boot chain, from Debian's packages (downloaded and unpacked by `make tools`, never installed)")
	info("shim-signed %s (Microsoft-signed shim), grub-efi-amd64-signed %s, linux-image-%s %s",
		parts.Packages[liveboot.ShimPackage], parts.Packages[liveboot.GrubPackage], parts.ABI, parts.Packages["linux-image-"+parts.ABI])
	info("firmware: OVMF with Secure Boot (Debian's PK, Microsoft's KEK and db); a TPM 2.0 from swtpm with a vendor EK certificate")

	guest := net.ParseIP(liveboot.GuestHost)
	pl, err := startPlane(ctx, o, filepath.Dir(filepath.Dir(examples)), bootPolicy, planeOptions{
		ServingIPs:   []net.IP{guest},
		APIServerURL: func(port int) string { return fmt.Sprintf("https://%s:%d", liveboot.GuestHost, port) },
	}, step, info)
	if err != nil {
		return err
	}
	defer pl.stop()
	apiPort, err := portOf(pl.cfg.Host)
	if err != nil {
		return err
	}
	guestURL := fmt.Sprintf("https://%s:%d", liveboot.GuestHost, pl.port)
	info("the VM reaches them at %s (server) and %s:%d (API server) through QEMU's guestfwd, and nothing else", guestURL, liveboot.GuestHost, apiPort)

	step("The machine's disk: a GPT disk with one EFI system partition; its initramfs holds busybox, nodeproof-agent, Ignition and kubelet-csr")
	ptr, err := pointer.Build(pointer.Options{URL: guestURL + "/config/worker", CABundle: pl.bundle, HTTPTotal: 60 * time.Second})
	if err != nil {
		return err
	}
	g := &liveboot.Guest{Agent: agentBin, KubeletCSR: csrBin, Ignition: ignition, CABundle: pl.bundle, Pointer: ptr,
		Server: guestURL, Pool: "worker", Node: bootNode}
	work := mkdir(o.Dir, "machine")
	initramfs, disk := filepath.Join(work, "initrd.img"), filepath.Join(work, "boot.img")
	if err := g.BuildInitramfs(ctx, parts, initramfs); err != nil {
		return err
	}
	if err := liveboot.BuildBootDisk(ctx, parts, initramfs, true, disk); err != nil {
		return err
	}
	fi, err := os.Stat(initramfs)
	if err != nil {
		return err
	}
	info("initramfs %d MB (zstd); grub.cfg: %s", fi.Size()>>20, strings.TrimSpace(strings.Split(string(liveboot.GrubConfig(true, liveboot.KernelCmdline)), "\n")[1]))
	m, err := liveboot.NewMachine(ctx, pl.sys.Manufacturer, "")
	if err != nil {
		return err
	}
	defer m.Close()

	boot := func(secureBoot bool) (*liveboot.Result, error) {
		nar := &narrator{out: out}
		r, err := m.Boot(ctx, liveboot.Boot{Disk: disk, SecureBoot: secureBoot, Forward: []int{pl.port, apiPort},
			FwCfg: map[string]string{"nodeproof/plan": "agent"}, Console: nar,
			Progress: func(format string, args ...any) { info("("+format+")", args...) }})
		if err != nil {
			return r, err
		}
		info("powered off after %.1fs", r.Took.Seconds())
		return r, nil
	}

	step("Power on with Secure Boot: firmware → shim → GRUB → kernel → the agent (under TCG emulation: 20-60 s)")
	r, err := boot(true)
	if err != nil {
		return err
	}
	if _, ok := r.Find(" Approved NodeproofAttestedTPM:"); !ok {
		return errors.New("the live machine's kubelet CSR was not approved")
	}
	if err := printRecord(ctx, pl.cfg, bootNode, info); err != nil {
		return err
	}

	step("Its kubelet joins: the Node registers, and the approver's node controller marks it attested")
	if _, err := pl.kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: bootNode}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := waitNode(ctx, pl.kc, bootNode, corev1.ConditionTrue, info); err != nil {
		return err
	}

	step("Reboot (a new swtpm process on the same state: fresh PCRs, the same EK): the agent re-attests at boot")
	if _, err := boot(true); err != nil {
		return err
	}
	if err := printBinding(ctx, pl.cfg, bootNode, info); err != nil {
		return err
	}

	step("Someone turns Secure Boot off (OVMF's variables without keys) and boots it again")
	r, err = boot(false)
	if err != nil {
		return err
	}
	if _, ok := r.Find("REFUSED at re-attestation by the server (HTTP 403): SecureBootDisabled"); !ok {
		return errors.New("the Secure Boot off boot was not refused SecureBootDisabled")
	}
	if err := waitNode(ctx, pl.kc, bootNode, corev1.ConditionFalse, info); err != nil {
		return err
	}
	if err := printBinding(ctx, pl.cfg, bootNode, info); err != nil {
		return err
	}
	evs, err := pl.kc.CoreV1().Events("nodeproof").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == bootNode {
			info("Event %s/%s %s: %.160s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	step("Done: the live machine got its config and its kubelet certificate only while it booted with Secure Boot; off, it is refused and tainted")
	return nil
}

// narrator shows the console lines a person watching wants: the firmware
// handing over, the shim and GRUB, the kernel's Secure Boot state, and
// every line of the node's programs.
type narrator struct {
	mu  sync.Mutex
	out io.Writer
	buf bytes.Buffer
}

var narrated = []string{"BdsDxe: starting", "Welcome to GRUB", "EFI stub:", "Secure boot", "Kernel is locked down",
	"nodeproof-liveboot:", "nodeproof-agent:", "kubelet-csr:", "Ignition finished", "fetch: fetch"}

func (n *narrator) Write(p []byte) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.buf.Write(p)
	for {
		line, err := n.buf.ReadString('\n')
		if err != nil {
			n.buf.WriteString(line)
			return len(p), nil
		}
		for _, s := range narrated {
			if strings.Contains(line, s) {
				fmt.Fprintf(n.out, "    console| %s", line)
				break
			}
		}
	}
}

// waitNode waits until the Node's Attested condition is want.
func waitNode(ctx context.Context, kc kubernetes.Interface, node string, want corev1.ConditionStatus, info func(string, ...any)) error {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		n, err := kc.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == approver.ConditionAttested && c.Status == want {
				taints := []string{}
				for _, t := range n.Spec.Taints {
					taints = append(taints, t.Key+":"+string(t.Effect))
				}
				info("Node %s: Attested=%s (%s); taints %v", node, c.Status, c.Reason, taints)
				return nil
			}
		}
	}
	return fmt.Errorf("node %s did not become Attested=%s within a minute", node, want)
}

// printBinding shows the node's binding as re-attestation left it.
func printBinding(ctx context.Context, cfg *rest.Config, node string, info func(string, ...any)) error {
	st, err := storeOf(cfg)
	if err != nil {
		return err
	}
	b, err := st.Binding(ctx, node)
	if err != nil {
		return err
	}
	verdict := "passed"
	if !b.Status.Passed {
		verdict = "FAILED: " + b.Status.Reason
	}
	info("NodeBinding %s: identity %.32s…, last re-attestation %s; %d boots seen, TPM reset count %d", node, b.Identity, verdict, b.Status.Boots, b.Status.ResetCount)
	return nil
}

func portOf(u string) (int, error) {
	_, p, err := net.SplitHostPort(strings.TrimSuffix(strings.TrimPrefix(u, "https://"), "/"))
	if err != nil {
		return 0, err
	}
	var port int
	_, err = fmt.Sscan(p, &port)
	return port, err
}
