package liveboot_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/inspect"
	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/systemtest"
)

const dracutNode = "live-dracut"

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
func TestLiveBootDracut(t *testing.T) {
	begin := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "liveboot-dracut %5.1fs: %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
	}
	ctx := context.Background()
	if err := liveboot.Check(); err != nil {
		t.Fatal(err)
	}
	if err := liveboot.CheckDracut(); err != nil {
		t.Fatal(err)
	}
	parts, err := liveboot.LoadParts(testenv.Cache())
	if err != nil {
		t.Fatal(err)
	}
	dg := authenticode(t, parts)
	cons := &consoles{dir: artifactDir(t)}
	bins := build(t, say)
	w := startWorld(t, bins, livePolicy(dg, false), say)

	kmoddir, err := liveboot.FetchModuleTree(ctx, testenv.Cache(), parts, say)
	if err != nil {
		t.Fatal(err)
	}
	ignition, err := testenv.IgnitionPath()
	if err != nil {
		t.Fatal(err)
	}
	ignitionModule, err := liveboot.IgnitionDracutModule(ctx, testenv.IgnitionVersion)
	if err != nil {
		t.Fatal(err)
	}
	work, err := os.MkdirTemp("", "np-liveboot-dracut-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	g := &liveboot.DracutGuest{Agent: bins.agent, Ignition: ignition, IgnitionModule: ignitionModule,
		NodeproofModule: "../../deploy/node/dracut/50nodeproof", CABundle: w.caBundle(t),
		Server: w.guestURL(), Pool: "worker", Evidence: "tpm"}
	initramfs := filepath.Join(work, "initrd.img")
	start := time.Now()
	if _, err := withProgress(say, "dracut", func() (struct{}, error) { return struct{}{}, g.BuildInitramfs(ctx, parts, kmoddir, initramfs) }); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(initramfs)
	if err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(work, "boot.img")
	if err := liveboot.BuildBootDiskWith(ctx, parts, initramfs, liveboot.GrubConfig(true, liveboot.DracutCmdline(dracutNode)), disk); err != nil {
		t.Fatal(err)
	}
	say("dracut initramfs (%d MB) and boot disk built in %.1fs", fi.Size()>>20, time.Since(start).Seconds())
	pointer := filepath.Join(work, "pointer.ign")
	if err := os.WriteFile(pointer, w.pointer(t), 0o644); err != nil {
		t.Fatal(err)
	}

	m, err := liveboot.NewMachine(ctx, w.man, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	boot := func(t *testing.T, name string) *liveboot.Result {
		t.Helper()
		say("boot %s", name)
		r, err := m.Boot(ctx, liveboot.Boot{Disk: disk, SecureBoot: true, Forward: []int{w.serverPort, w.apiPort},
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
	listEK(t, w, dg, ek, dracutNode)

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
		w.inspectUntil(t, dracutNode, 30*time.Second, func(s *inspect.Story) string {
			if s.Binding == nil || s.Binding.Status.Boots != 1 {
				return "the machine bound, this boot counted"
			}
			return ""
		})
		a, f := units["nodeproof-agent"], units["ignition-files"]
		say("first boot: agent %.1fs, Ignition fetch→files %.1fs, powered off at %.1fs", float64(a.exit-a.start)/1e6, float64(f.exit-units["ignition-fetch"].start)/1e6, r.Took.Seconds())
	})
}

// listEK writes an EK inventory naming the machine with EK SHA-256 ek
// node, puts it in the live policy (the pool trusting the inventory beside
// the vendor CA) and waits for the server to apply it.
func listEK(t *testing.T, w *world, dg digests, ek, node string) {
	t.Helper()
	dir := filepath.Dir(w.policyFile)
	inv := filepath.Join(dir, "ek-inventory.yaml")
	if err := os.WriteFile(inv, fmt.Appendf(nil, "entries:\n- ekSHA256: %s\n  nodeName: %s\n", ek, node), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := policytest.New().EKRoot(systemtest.VendorRoot, w.roots).EKInventory(inv).
		Pool("worker", policytest.TPM("ca:"+systemtest.VendorRoot, "inventory").SecureBoot().Boot(dg.shim, dg.grub, dg.kernel).Requested().Lifetime(30*time.Minute, 2*time.Hour)).
		YAML()
	if err != nil {
		t.Fatal(err)
	}
	reloads := strings.Count(w.server.out.String(), "policy reloaded")
	tmp := w.policyFile + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, w.policyFile); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); strings.Count(w.server.out.String(), "policy reloaded") == reloads; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server did not apply the policy within a minute\n%s", w.server.out.String())
		}
	}
}

// unitTime is what systemd recorded of one unit's run.
type unitTime struct {
	result      string
	start, exit int64 // CLOCK_MONOTONIC, µs
}

var unitLine = regexp.MustCompile(`nodeproof-liveboot: unit (\S+)\.service (.*) \[uptime`)

// unitTimes reads the report's unit lines.
func unitTimes(t *testing.T, r *liveboot.Result) map[string]unitTime {
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
