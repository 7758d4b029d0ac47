package liveboot_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/bootimage"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/systemtest"
)

const dracutNode, dracutNode2, dracutNode3 = "live-dracut", "live-dracut-2", "live-dracut-uki"

// TestLiveBootDracut boots the node's real first-boot path (issue 40 item
// 1): a dracut + systemd initramfs built by Debian's dracut 059 from this
// machine's systemd, with Ignition's own dracut module (30ignition of the
// pinned Ignition), deploy/node/dracut/50nodeproof and the agent, in the
// OVMF Secure Boot VM (Debian's signed shim, GRUB and kernel, swtpm). The
// pointer config comes as the qemu platform's config (fw_cfg), as an
// RHCOS image's platform would hand it over.
//
//  1. An unlisted machine (its EK chains to the vendor CA, but nothing
//     names it a node: the pool's policy has no inventory yet): the agent
//     runs after ignition-fetch-offline found the pointer needs the
//     network, is refused NodeNameNotEstablished and says so and the EK
//     to list on the console; ignition-fetch's dependency fails (its
//     drop-in's Requires=), Ignition Complete is never reached, the boot
//     stops (emergency, powered off) and Ignition writes nothing.
//  2. The operator lists the EK (trust.ekInventory, node live-dracut);
//     the same machine boots again: nodeproof-agent.service runs after
//     fetch-offline and before ignition-fetch (systemd's own timestamps
//     say so), attests with the TPM and writes the full config as
//     Ignition's user.ign; Ignition's fetch, disks, mount and files stages
//     apply it (the bootstrap kubeconfig lands in /sysroot);
//     nodeproof-kubelet-key.service puts the attested kubelet key beside
//     it (0600); the server has bound the machine as live-dracut.
//  3. The server unreachable for a while (another listed machine, its
//     server through a relay that drops the first connections): the agent
//     retries with backoff and says so on the console, then attests;
//     Ignition applies the config as in 2.
//  4. A unified kernel image of the same initramfs (with dracut's
//     systemd-pcrphase module) and the node's command line, made with
//     Debian's systemd-stub and signed by the signer lab's db key, run by
//     Debian's shim (as distributions ship UKIs; the shim verifies it
//     against db) on the lab's store: the pool learned from the UKI's
//     file (`policy learn --efi uki= --uki-pool`); systemd measures
//     enter-initrd into PCR 11 before the agent runs (unit timestamps),
//     and the server reads PCR 11 through it: admitted, the record naming
//     the UKI and the phase.
//
// The initramfs's /sysroot is an empty tmpfs (root=tmpfs) holding only the
// accounts an RHCOS image has; the boot ends in the initramfs after
// ignition-complete.target (dracut/99nodeproof-liveboot says what Ignition
// wrote, saves /sysroot to the data disk and powers off): there is no
// installed system to switch to.
func TestLiveBootDracut(t *testing.T) {
	begin := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "liveboot-dracut %5.1fs: %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
	}
	ctx := context.Background()
	env := newDracutEnv(t, ctx, say)
	cons := &consoles{dir: artifactDir(t)}
	work, err := os.MkdirTemp("", "np-liveboot-dracut-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	g := &liveboot.DracutGuest{Agent: env.bins.agent, Ignition: env.ignition, IgnitionModule: env.ignitionModule,
		NodeproofModule: "../../deploy/node/dracut/50nodeproof", CABundle: env.w.caBundle(t),
		Server: env.w.guestURL(), Pool: "worker", Evidence: "tpm"}
	initramfs := filepath.Join(work, "initrd.img")
	start := time.Now()
	if _, err := withProgress(say, "dracut", func() (struct{}, error) { return struct{}{}, g.BuildInitramfs(ctx, env.parts, env.kmoddir, initramfs) }); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(initramfs)
	if err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(work, "boot.img")
	if err := liveboot.BuildBootDiskWith(ctx, env.parts, initramfs, liveboot.GrubConfig(true, liveboot.DracutCmdline(dracutNode)), disk); err != nil {
		t.Fatal(err)
	}
	say("dracut initramfs (%d MB) and boot disk built in %.1fs", fi.Size()>>20, time.Since(start).Seconds())
	pointer := filepath.Join(work, "pointer.ign")
	if err := os.WriteFile(pointer, env.w.pointer(t), 0o644); err != nil {
		t.Fatal(err)
	}

	m, err := liveboot.NewMachine(ctx, env.w.man, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	boot := func(t *testing.T, name string) *liveboot.Result {
		t.Helper()
		say("boot %s", name)
		r, err := m.Boot(ctx, liveboot.Boot{Disk: disk, SecureBoot: true, Forward: []int{env.w.serverPort, env.w.apiPort},
			FwCfgFiles: map[string]string{liveboot.IgnitionConfigFwCfg: pointer}, Progress: say, Limit: 10 * time.Minute})
		p := cons.save(t, "dracut-"+name, r)
		if err != nil {
			t.Fatalf("boot %s: %v (console: %s)\n%s", name, err, p, tail(r))
		}
		say("boot %s: powered off after %.1fs", name, r.Took.Seconds())
		return r
	}

	var ek string
	ok := t.Run("an unlisted machine: refused NodeNameNotEstablished on the console, Ignition never fetches, the boot stops", func(t *testing.T) {
		r := boot(t, "unlisted")
		expectLines(t, r, "Finished ignition-fetch-of", "Starting nodeproof-agent", "nodeproof-agent: REFUSED", "Power down")
		l, _ := r.Find("nodeproof-agent: REFUSED")
		if !strings.Contains(l.Text, string(attest.ReasonPolicyNodeNameMissing)) {
			t.Errorf("the agent's refusal does not say %s: %q", attest.ReasonPolicyNodeNameMissing, l.Text)
		}
		failed := false
		for _, l := range r.Lines {
			failed = failed || strings.Contains(l.Text, "Dependency failed for") && strings.Contains(l.Text, "Ignition (fetch)")
		}
		if !failed {
			t.Error("the console does not say Ignition (fetch) failed for its dependency")
		}
		if l, found := r.Find("nodeproof-liveboot: ignition complete"); found {
			t.Errorf("the console says %q after a refusal", l.Text)
		}
		if len(r.Files) != 0 {
			t.Errorf("the refused boot left files: %v", keys(r.Files))
		}
		m := regexp.MustCompile(`tpm-ek:([0-9a-f]{64})`).FindStringSubmatch(r.Console())
		if m == nil {
			t.Fatalf("the console names no EK to list\n%s", tail(r))
		}
		ek = m[1]
	})
	if !ok {
		return
	}
	// The machine of the unreachable server's boot, listed too (its EK
	// read from its TPM here, as `nodeproof dev tpm init` prints it).
	m2, err := liveboot.NewMachine(ctx, env.w.man, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Close() })
	// The machine of the UKI boot, listed too.
	m3, err := liveboot.NewMachine(ctx, env.w.man, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m3.Close() })
	listEKs(t, env.w, env.dg, map[string]string{ek: dracutNode, ekSHA256(t, m2): dracutNode2, ekSHA256(t, m3): dracutNode3})

	t.Run("listed: the agent between fetch-offline and fetch, Ignition applies the attested config, the kubelet key kept", func(t *testing.T) {
		r := boot(t, "listed")
		expectLines(t, r, "nodeproof-liveboot: ignition complete", "nodeproof-liveboot: poweroff")
		units := unitTimes(t, r)
		for _, u := range []string{"ignition-fetch-offline", "nodeproof-agent", "ignition-fetch", "ignition-disks", "ignition-mount", "ignition-files", "nodeproof-kubelet-key"} {
			if units[u].result != "success" || units[u].start == 0 {
				t.Errorf("%s.service: result %q, started at %d µs; want it run with success", u, units[u].result, units[u].start)
			}
		}
		for _, o := range [][2]string{{"ignition-fetch-offline", "nodeproof-agent"}, {"nodeproof-agent", "ignition-fetch"},
			{"ignition-fetch", "ignition-disks"}, {"ignition-mount", "ignition-files"}, {"ignition-files", "nodeproof-kubelet-key"}} {
			if a, b := units[o[0]], units[o[1]]; a.exit == 0 || b.start < a.exit {
				t.Errorf("%s.service started at %d µs, before %s.service exited (%d µs)", o[1], b.start, o[0], a.exit)
			}
		}
		kc := r.Files["etc/kubernetes/kubeconfig"]
		if !strings.Contains(string(kc), "token:") {
			t.Errorf("Ignition's files stage wrote no bootstrap kubeconfig in /sysroot (%d bytes); files: %v", len(kc), keys(r.Files))
		}
		if len(r.Files["var/lib/kubelet/pki/kubelet-client.key.tmp"]) == 0 {
			t.Errorf("no attested kubelet key in /sysroot; files: %v", keys(r.Files))
		}
		if l, found := r.Find("nodeproof-liveboot: sysroot /var/lib/kubelet/pki/kubelet-client.key.tmp mode"); !found || !strings.Contains(l.Text, " mode 600 ") {
			t.Errorf("the kubelet key's line: %q; want mode 600", l.Text)
		}
		checkBound(t, env.w, dracutNode, r.Files["var/lib/kubelet/pki/kubelet-client.key.tmp"])
		a, f := units["nodeproof-agent"], units["ignition-files"]
		say("first boot: agent %.1fs, Ignition fetch→files %.1fs, powered off at %.1fs", float64(a.exit-a.start)/1e6, float64(f.exit-units["ignition-fetch"].start)/1e6, r.Took.Seconds())
	})

	t.Run("the server unreachable for a while: the agent retries, then attests; Ignition applies the config", func(t *testing.T) {
		relay := startRelay(t, env.w.serverPort, 4)
		url := fmt.Sprintf("https://%s:%d", liveboot.GuestHost, relay.port)
		g2 := *g
		g2.Server = url
		initramfs2, disk2, pointer2 := filepath.Join(work, "initrd2.img"), filepath.Join(work, "boot2.img"), filepath.Join(work, "pointer2.ign")
		if err := g2.BuildInitramfs(ctx, env.parts, env.kmoddir, initramfs2); err != nil {
			t.Fatal(err)
		}
		if err := liveboot.BuildBootDiskWith(ctx, env.parts, initramfs2, liveboot.GrubConfig(true, liveboot.DracutCmdline(dracutNode2)), disk2); err != nil {
			t.Fatal(err)
		}
		if b, err := exec.Command(env.w.bins.nodeproof, "pointer", "--state-dir", env.w.stateDir, "--url", url, "--pool", "worker",
			"--http-total", "60s", "-o", pointer2).CombinedOutput(); err != nil {
			t.Fatalf("nodeproof pointer: %v\n%s", err, b)
		}
		say("boot unreachable (the relay drops the first %d connections)", relay.drop)
		r, err := m2.Boot(ctx, liveboot.Boot{Disk: disk2, SecureBoot: true, Forward: []int{relay.port, env.w.apiPort},
			FwCfgFiles: map[string]string{liveboot.IgnitionConfigFwCfg: pointer2}, Progress: say, Limit: 10 * time.Minute})
		p := cons.save(t, "dracut-unreachable", r)
		if err != nil {
			t.Fatalf("boot: %v (console: %s)\n%s", err, p, tail(r))
		}
		say("boot unreachable: powered off after %.1fs; the relay dropped %d connections", r.Took.Seconds(), relay.dropped.Load())
		if relay.dropped.Load() < int32(relay.drop) {
			t.Errorf("the relay dropped %d connections; want %d: the guest never met the unreachable server", relay.dropped.Load(), relay.drop)
		}
		expectLines(t, r, "Starting nodeproof-agent", "retrying in", "nodeproof-liveboot: ignition complete", "nodeproof-liveboot: poweroff")
		units := unitTimes(t, r)
		for _, u := range []string{"nodeproof-agent", "ignition-fetch", "ignition-files", "nodeproof-kubelet-key"} {
			if units[u].result != "success" {
				t.Errorf("%s.service: result %q; want success", u, units[u].result)
			}
		}
		if !strings.Contains(string(r.Files["etc/kubernetes/kubeconfig"]), "token:") {
			t.Errorf("no bootstrap kubeconfig in /sysroot; files: %v", keys(r.Files))
		}
		checkBound(t, env.w, dracutNode2, r.Files["var/lib/kubelet/pki/kubelet-client.key.tmp"])
	})

	t.Run("a unified kernel image of the dracut initramfs, run by Debian's shim: systemd measures enter-initrd into PCR 11 after the stub; the quote is read through it, admitted", func(t *testing.T) {
		lab, err := liveboot.LoadSignerLab(ctx, testenv.Cache(), say)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(work, "uki")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		g3 := *g
		g3.Modules = []string{"systemd-pcrphase"}
		initrd := filepath.Join(dir, "initrd.img")
		if _, err := withProgress(say, "dracut (with systemd-pcrphase)", func() (struct{}, error) { return struct{}{}, g3.BuildInitramfs(ctx, env.parts, env.kmoddir, initrd) }); err != nil {
			t.Fatal(err)
		}
		image, disk, _ := signedUKI(t, ctx, lab, dir, env.parts, initrd, liveboot.DracutCmdline(dracutNode3), lab.Keys.DBSigner, lab.Keys.DBCA, true)
		pool := filepath.Join(dir, "uki-pool.yaml")
		env.w.policyCmd(t, "policy", "learn", "--efi", "uki="+image, "--uki-pool", "--pool", "worker", "--merge", env.w.policyFile, "-o", pool)
		applyPolicy(t, env.w, pool)
		say("boot uki (the pool learned from the UKI's file)")
		r, err := m3.Boot(ctx, liveboot.Boot{Disk: disk, SecureBoot: true, Vars: lab.Vars.Path, Forward: []int{env.w.serverPort, env.w.apiPort},
			FwCfgFiles: map[string]string{liveboot.IgnitionConfigFwCfg: pointer}, Progress: say, Limit: 10 * time.Minute})
		p := cons.save(t, "dracut-uki", r)
		if err != nil {
			t.Fatalf("boot: %v (console: %s)\n%s", err, p, tail(r))
		}
		say("boot uki: powered off after %.1fs", r.Took.Seconds())
		expectLines(t, r, "nodeproof-liveboot: ignition complete", "nodeproof-liveboot: poweroff")
		units := unitTimes(t, r)
		if ph, a := units["systemd-pcrphase-initrd"], units["nodeproof-agent"]; ph.result != "success" || ph.start == 0 || a.start < ph.exit || a.result != "success" {
			t.Errorf("systemd-pcrphase-initrd.service %+v, nodeproof-agent.service %+v; want the phase measured, then the agent run", ph, a)
		}
		checkBound(t, env.w, dracutNode3, r.Files["var/lib/kubelet/pki/kubelet-client.key.tmp"])
		// The enrolment's record (a first boot records the summary of its
		// claims: the UKI, and the phases read from PCR 11).
		img, err := bootimage.ReadFile(image)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("uki=%.16s phases=enter-initrd", hex.EncodeToString(img.AuthenticodeSHA256))
		env.w.inspectUntil(t, dracutNode3, 30*time.Second, func(s *inspect.Story) string {
			if s.Binding == nil || !strings.HasSuffix(s.Evidence, want) {
				return "the binding, its evidence ending " + want
			}
			return ""
		})
		say("boot uki: admitted, PCR 11 read through enter-initrd (%s)", want)
	})
}

// listEKs writes an EK inventory naming each machine (EK SHA-256 → node
// name), puts it in the live policy (the pool trusting the inventory beside
// the vendor CA) and waits for the server to apply it.
func listEKs(t testing.TB, w *world, dg digests, eks map[string]string) {
	t.Helper()
	var entries []ekEntry
	for ek, node := range eks {
		entries = append(entries, ekEntry{ek: ek, node: node})
	}
	listInventory(t, w, livePool(dg, false, "ca:"+systemtest.VendorRoot, "inventory"), entries...)
}

// checkBound checks that the server bound node (Attested, named by the EK
// inventory) to the kubelet key the guest left in /sysroot (keyPEM): the
// key nodeproof-kubelet-key.service kept is the one the evidence bound.
func checkBound(t *testing.T, w *world, node string, keyPEM []byte) {
	t.Helper()
	blk, _ := pem.Decode(keyPEM)
	if blk == nil {
		t.Fatalf("the kubelet key in /sysroot is not PEM (%d bytes)", len(keyPEM))
	}
	var key any
	var err error
	if key, err = x509.ParsePKCS8PrivateKey(blk.Bytes); err != nil {
		if key, err = x509.ParseECPrivateKey(blk.Bytes); err != nil {
			t.Fatalf("the kubelet key in /sysroot (%s): %v", blk.Type, err)
		}
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		t.Fatalf("the kubelet key in /sysroot is a %T", key)
	}
	der, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(der)
	w.inspectUntil(t, node, 30*time.Second, func(s *inspect.Story) string {
		switch {
		case s.State != inspect.StateAttested || s.Binding == nil || s.Binding.NodeName != node:
			return "the machine enrolled and attested as " + node
		case !bytes.Equal(s.Binding.KubeletKeySHA256, sum[:]):
			return "the binding naming the kubelet key the guest kept in /sysroot"
		}
		return ""
	})
}

// ekSHA256 is the SHA-256 of m's EK (PKIX DER), as EK inventories list
// it, read from its TPM.
func ekSHA256(t testing.TB, m *liveboot.Machine) string {
	t.Helper()
	tp, err := swtpm.Start(context.Background(), m.TPMState)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Stop()
	ch, err := tpm.DialSocket("tcp", tp.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tpm.NewCollector(ch)
	if err != nil {
		ch.Close()
		t.Fatal(err)
	}
	defer c.Close()
	req, err := c.Request()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(req.EKPublic)
	return hex.EncodeToString(sum[:])
}

// relay is a TCP relay to a loopback port that drops its first drop
// connections (accepted and closed at once: the server unreachable), then
// relays.
type relay struct {
	port    int
	drop    int
	dropped atomic.Int32
}

func startRelay(t *testing.T, target, drop int) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	r := &relay{port: ln.Addr().(*net.TCPAddr).Port, drop: drop}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if int(r.dropped.Load()) < r.drop {
				r.dropped.Add(1)
				c.Close()
				continue
			}
			go func() {
				defer c.Close()
				s, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", target), 5*time.Second)
				if err != nil {
					return
				}
				defer s.Close()
				go func() { _, _ = io.Copy(s, c); s.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, s)
			}()
		}
	}()
	return r
}

// unitTime is what systemd recorded of one unit's run.
type unitTime struct {
	result      string
	start, exit int64 // CLOCK_MONOTONIC, µs
}

var unitLine = regexp.MustCompile(`nodeproof-liveboot: unit (\S+)\.service (.*) \[uptime`)

// unitTimes reads the report's unit lines.
func unitTimes(t testing.TB, r *liveboot.Result) map[string]unitTime {
	t.Helper()
	units := map[string]unitTime{}
	for _, l := range r.Lines {
		m := unitLine.FindStringSubmatch(l.Text)
		if m == nil {
			continue
		}
		var u unitTime
		for _, kv := range strings.Fields(m[2]) {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "Result":
				u.result = v
			case "ExecMainStartTimestampMonotonic":
				u.start = n
			case "ExecMainExitTimestampMonotonic":
				u.exit = n
			}
		}
		units[m[1]] = u
	}
	if len(units) == 0 {
		t.Fatalf("the console has no unit lines\n%s", tail(r))
	}
	return units
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// dracutEnv is what a dracut boot stands on: the boot chain's parts and
// their digests, the programs, the world (the live policy in force), the
// guest kernel's module tree, Ignition and its dracut module.
type dracutEnv struct {
	parts                             *liveboot.Parts
	dg                                digests
	bins                              binaries
	w                                 *world
	kmoddir, ignition, ignitionModule string
}

// newDracutEnv checks the machine can boot a dracut initramfs and makes
// its environment.
func newDracutEnv(tb testing.TB, ctx context.Context, say func(string, ...any)) *dracutEnv {
	tb.Helper()
	if err := liveboot.Check(); err != nil {
		tb.Fatal(err)
	}
	if err := liveboot.CheckDracut(); err != nil {
		tb.Fatal(err)
	}
	parts, err := liveboot.LoadParts(testenv.Cache())
	if err != nil {
		tb.Fatal(err)
	}
	e := &dracutEnv{parts: parts, dg: authenticode(tb, parts)}
	e.bins = build(tb, say)
	e.w = startWorld(tb, e.bins, livePolicy(e.dg, false), say)
	if e.kmoddir, err = liveboot.FetchModuleTree(ctx, testenv.Cache(), parts, say); err != nil {
		tb.Fatal(err)
	}
	if e.ignition, err = testenv.IgnitionPath(); err != nil {
		tb.Fatal(err)
	}
	if e.ignitionModule, err = liveboot.IgnitionDracutModule(ctx, testenv.IgnitionVersion); err != nil {
		tb.Fatal(err)
	}
	return e
}
