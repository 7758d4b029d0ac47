package liveboot_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/internal/liveboot"
)

const cloudNode, cloudNode2, cloudNode3 = "live-cloud", "live-cloud-2", "live-cloud-3"

// TestLiveBootCloud boots the cloud path (issue 40 item 2): an image whose
// initramfs cannot be changed (installer-provisioned GCP and AWS
// clusters). The initramfs is stock — Debian's dracut 059 and systemd 252
// with Ignition v2.24.0's own 30ignition and no nodeproof module — and the
// machine's user data (the qemu platform's fw_cfg config) is the pool's
// pointer config (its merge of the public tier) plus the agent binary from
// an HTTP server with its SHA-512, deploy/node's
// nodeproof-agent-firstboot.service enabled (with a drop-in running the
// agent from /usr/local/bin), agent.env and the CA bundle. Ignition writes
// them into the real root (an ext4 disk with systemd, made from the stock
// initramfs's tree), the initramfs switches root, and the real root's
// systemd runs the agent in fetch mode on its first boot (machine-id
// "uninitialized": Ignition's preset enables the unit), before the kubelet and
// the MCD's first boot (stand-ins that say on the console they started).
//
//  1. A listed machine (its EK in trust.ekInventory): after switch-root
//     the unit attests with the TPM, writes the full config's first-boot
//     files (the bootstrap kubeconfig, the kubelet key the server bound)
//     and the stamp; then the kubelet stand-in starts.
//  2. An unlisted machine: the unit is refused NodeNameNotEstablished and
//     says so on the console, the stamp is not written, and the kubelet
//     and the MCD's first boot never start (their dependency failed).
//  3. The server unreachable at first (another listed machine, its agent
//     through a relay that drops the first connections): the unit retries
//     with backoff on the console, then attests as in 1.
func TestLiveBootCloud(t *testing.T) {
	begin := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "liveboot-cloud %5.1fs: %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
	}
	ctx := context.Background()
	env := newDracutEnv(t, ctx, say)
	cons := &consoles{dir: artifactDir(t)}
	work, err := os.MkdirTemp("", "np-liveboot-cloud-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	start := time.Now()
	g := &liveboot.DracutGuest{Ignition: env.ignition, IgnitionModule: env.ignitionModule, Stock: true, Install: liveboot.CloudRootTools, Drivers: liveboot.CloudRootDrivers}
	initramfs := filepath.Join(work, "initrd.img")
	if _, err := withProgress(say, "dracut", func() (struct{}, error) { return struct{}{}, g.BuildInitramfs(ctx, env.parts, env.kmoddir, initramfs) }); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(work, "root.img")
	if err := (&liveboot.CloudRoot{Initramfs: initramfs}).BuildCloudRoot(ctx, root); err != nil {
		t.Fatal(err)
	}
	disks := map[string]string{}
	for _, node := range []string{cloudNode, cloudNode2, cloudNode3} {
		disks[node] = filepath.Join(work, node+".img")
		if err := liveboot.BuildBootDiskWith(ctx, env.parts, initramfs, liveboot.GrubConfig(true, liveboot.CloudCmdline(node)), disks[node]); err != nil {
			t.Fatal(err)
		}
	}
	fi, _ := os.Stat(initramfs)
	ri, _ := os.Stat(root)
	say("stock initramfs (%d MB), real root (%d MB ext4) and boot disks built in %.1fs", fi.Size()>>20, ri.Size()>>20, time.Since(start).Seconds())

	// The agent binary, served over plain HTTP on loopback (the user
	// data's hash is what makes that safe).
	agent, err := os.ReadFile(env.bins.agent)
	if err != nil {
		t.Fatal(err)
	}
	agentSum := sha256.Sum256(agent)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var fetched atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/nodeproof-agent" {
			http.NotFound(rw, r)
			return
		}
		fetched.Add(1)
		rw.Header().Set("Content-Length", strconv.Itoa(len(agent)))
		_, _ = rw.Write(agent)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	httpPort := ln.Addr().(*net.TCPAddr).Port
	unit, err := os.ReadFile("../../deploy/node/nodeproof-agent-firstboot.service")
	if err != nil {
		t.Fatal(err)
	}
	bootstrap, err := os.ReadFile("../../deploy/node/nodeproof-kubelet-bootstrap.service")
	if err != nil {
		t.Fatal(err)
	}
	reattest, err := os.ReadFile("../../deploy/node/nodeproof-reattest.service")
	if err != nil {
		t.Fatal(err)
	}
	ud := &liveboot.CloudUserData{Pointer: env.w.pointer(t), Agent: env.bins.agent,
		AgentURL: fmt.Sprintf("http://%s:%d/nodeproof-agent", liveboot.GuestHost, httpPort), Unit: unit, Bootstrap: bootstrap, Reattest: reattest,
		CABundle: env.w.caBundle(t), Server: env.w.guestURL(), Pool: "worker", Evidence: "tpm"}
	cfg, err := ud.Config()
	if err != nil {
		t.Fatal(err)
	}
	userData := filepath.Join(work, "user-data.ign")
	if err := os.WriteFile(userData, cfg, 0o644); err != nil {
		t.Fatal(err)
	}

	m, err := liveboot.NewMachine(ctx, env.w.man, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	m2, err := liveboot.NewMachine(ctx, env.w.man, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Close() })
	m3, err := liveboot.NewMachine(ctx, env.w.man, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m3.Close() })
	listEKs(t, env.w, env.dg, map[string]string{ekSHA256(t, m): cloudNode, ekSHA256(t, m3): cloudNode3})
	// The third machine's agent reaches the server through a relay that
	// drops its first connections (Ignition's fetch of the public tier
	// goes to the server directly).
	rl := startRelay(t, env.w.serverPort, 4)
	ud3 := *ud
	ud3.Server = fmt.Sprintf("https://%s:%d", liveboot.GuestHost, rl.port)
	cfg3, err := ud3.Config()
	if err != nil {
		t.Fatal(err)
	}
	userData3 := filepath.Join(work, "user-data-3.ign")
	if err := os.WriteFile(userData3, cfg3, 0o644); err != nil {
		t.Fatal(err)
	}

	boot := func(t *testing.T, m *liveboot.Machine, node, name string) *liveboot.Result {
		t.Helper()
		say("boot %s", name)
		ud := userData
		if node == cloudNode3 {
			ud = userData3
		}
		r, err := m.Boot(ctx, liveboot.Boot{Disk: disks[node], Disks: []string{root}, SecureBoot: true, Forward: []int{env.w.serverPort, env.w.apiPort, httpPort, rl.port},
			FwCfgFiles: map[string]string{liveboot.IgnitionConfigFwCfg: ud}, Progress: say, Limit: 3 * time.Minute})
		p := cons.save(t, "cloud-"+name, r)
		if err != nil {
			t.Fatalf("boot %s: %v (console: %s)\n%s", name, err, p, tail(r))
		}
		say("boot %s: powered off after %.1fs", name, r.Took.Seconds())
		// Common to both: Ignition ran in the stock initramfs, the real
		// root's systemd ran its report, and the agent binary came from the
		// user data, hash-checked.
		expectLines(t, r, "Ignition (files)", "Starting initrd-switch-root.service", "Welcome to nodeproof live boot root", "nodeproof-cloudroot: real root up", "nodeproof-cloudroot: poweroff")
		if l, _ := r.Find("nodeproof-cloudroot: real root up"); !strings.Contains(l.Text, "not an initramfs: yes") {
			t.Errorf("the report ran in an initramfs: %q", l.Text)
		}
		if l, ok := r.Find("nodeproof-cloudroot: file " + liveboot.CloudAgentPath + " "); !ok || !strings.Contains(l.Text, " mode 755 ") || !strings.Contains(l.Text, hex.EncodeToString(agentSum[:])) {
			t.Errorf("the agent from the user data: %q; want mode 755 sha256 %x", l.Text, agentSum)
		}
		return r
	}

	t.Run("listed: after switch-root the first-boot unit attests, writes the first-boot files and its stamp, then the kubelet starts", func(t *testing.T) {
		r := boot(t, m, cloudNode, "listed")
		expectLines(t, r, "Welcome to nodeproof live boot root", "nodeproof-agent: kubelet key", "nodeproof-agent: attested", "nodeproof-agent: fetched the full config",
			"Finished nodeproof-agent-f", "nodeproof-cloudroot: kubelet stand-in started", "nodeproof-cloudroot: unit nodeproof-agent-firstboot.service")
		units := cloudUnits(t, r)
		fb, kl := units["nodeproof-agent-firstboot"], units["kubelet"]
		if fb["Result"] != "success" || fb["ActiveState"] != "active" {
			t.Errorf("nodeproof-agent-firstboot.service: %v; want active, success", fb)
		}
		if fbExit, klStart := num(fb["ExecMainExitTimestampMonotonic"]), num(kl["InactiveExitTimestampMonotonic"]); fbExit == 0 || klStart < fbExit {
			t.Errorf("the kubelet started at %d µs, before the first-boot unit exited (%d µs)", klStart, fbExit)
		}
		if !strings.Contains(string(r.Files["etc/kubernetes/kubeconfig"]), "token:") {
			t.Errorf("no bootstrap kubeconfig from the agent; files: %v", keys(r.Files))
		}
		if _, ok := r.Files["etc/nodeproof/.fetched"]; !ok {
			t.Errorf("no stamp /etc/nodeproof/.fetched; files: %v", keys(r.Files))
		}
		if l, ok := r.Find("nodeproof-cloudroot: file /var/lib/kubelet/pki/kubelet-client.key.tmp "); !ok || !strings.Contains(l.Text, " mode 600 ") {
			t.Errorf("the kubelet key's line: %q; want mode 600", l.Text)
		}
		checkBound(t, env.w, cloudNode, r.Files["var/lib/kubelet/pki/kubelet-client.key.tmp"])
		// The node's re-attestation (its timer's unit, started by the
		// report as the timer would 30 s after boot) runs the agent the
		// user data brought, with its settings.
		if ra := units["nodeproof-reattest"]; ra["Result"] != "success" || num(ra["ExecMainStartTimestampMonotonic"]) == 0 {
			t.Errorf("nodeproof-reattest.service: %v; want it run with success", ra)
		}
		expectLines(t, r, fmt.Sprintf("nodeproof-cloudroot: reattest journal: nodeproof-agent: node %s re-attested", cloudNode))
		say("listed: the first-boot unit %.1fs, powered off at %.1fs", float64(num(fb["ExecMainExitTimestampMonotonic"])-num(fb["ExecMainStartTimestampMonotonic"]))/1e6, r.Took.Seconds())
	})

	t.Run("unlisted: the first-boot unit is refused on the console, no stamp, the kubelet and the MCD's first boot never start", func(t *testing.T) {
		r := boot(t, m2, cloudNode2, "unlisted")
		expectLines(t, r, "Welcome to nodeproof live boot root", "nodeproof-agent: REFUSED", "Failed to start nodeproof-", "nodeproof-cloudroot: unit nodeproof-agent-firstboot.service")
		if l, _ := r.Find("nodeproof-agent: REFUSED"); !strings.Contains(l.Text, string(attest.ReasonPolicyNodeNameMissing)) {
			t.Errorf("the agent's refusal does not say %s: %q", attest.ReasonPolicyNodeNameMissing, l.Text)
		}
		dep := 0
		for _, l := range r.Lines {
			if strings.Contains(l.Text, "Dependency failed for") && (strings.Contains(l.Text, "Kubelet") || strings.Contains(l.Text, "Machine Config Daemon")) {
				dep++
			}
		}
		if dep == 0 {
			t.Error("the console does not say the kubelet's or the MCD's first boot failed for its dependency")
		}
		if l, ok := r.Find("stand-in started"); ok {
			t.Errorf("a unit ordered after the refused agent started: %q", l.Text)
		}
		units := cloudUnits(t, r)
		if fb := units["nodeproof-agent-firstboot"]; fb["Result"] != "exit-code" || fb["ExecMainStatus"] != "3" {
			t.Errorf("nodeproof-agent-firstboot.service: %v; want failed with exit code 3 (refused)", fb)
		}
		for _, u := range []string{"kubelet", "machine-config-daemon-firstboot"} {
			if s := units[u]; s["ActiveState"] == "active" || num(s["InactiveExitTimestampMonotonic"]) != 0 {
				t.Errorf("%s.service: %v; want never started", u, s)
			}
		}
		// The kubelet key stays (the agent makes it before attesting; a
		// later run uses it): nothing of the full config is written.
		for _, f := range []string{"etc/nodeproof/.fetched", "etc/kubernetes/kubeconfig", "etc/kubernetes/kubelet-ca.crt", "var/lib/kubelet/config.json"} {
			if _, ok := r.Files[f]; ok {
				t.Errorf("the refused machine has /%s", f)
			}
		}
	})
	t.Run("the server unreachable at first: the first-boot unit retries, then attests and writes the first-boot files", func(t *testing.T) {
		r := boot(t, m3, cloudNode3, "unreachable")
		if rl.dropped.Load() < int32(rl.drop) {
			t.Errorf("the relay dropped %d connections; want %d: the guest never met the unreachable server", rl.dropped.Load(), rl.drop)
		}
		expectLines(t, r, "Welcome to nodeproof live boot root", "retrying in", "nodeproof-agent: attested", "nodeproof-cloudroot: kubelet stand-in started")
		if fb := cloudUnits(t, r)["nodeproof-agent-firstboot"]; fb["Result"] != "success" {
			t.Errorf("nodeproof-agent-firstboot.service: %v; want success", fb)
		}
		if _, ok := r.Files["etc/nodeproof/.fetched"]; !ok {
			t.Errorf("no stamp; files: %v", keys(r.Files))
		}
		checkBound(t, env.w, cloudNode3, r.Files["var/lib/kubelet/pki/kubelet-client.key.tmp"])
	})
	say("the agent binary was fetched %d times", fetched.Load())
}

var cloudUnitLine = regexp.MustCompile(`nodeproof-cloudroot: unit (\S+)\.service (.*) \[uptime`)

// cloudUnits reads the real root's report: each unit's systemctl show
// properties.
func cloudUnits(t *testing.T, r *liveboot.Result) map[string]map[string]string {
	t.Helper()
	units := map[string]map[string]string{}
	for _, l := range r.Lines {
		m := cloudUnitLine.FindStringSubmatch(l.Text)
		if m == nil {
			continue
		}
		props := map[string]string{}
		for _, kv := range strings.Fields(m[2]) {
			k, v, _ := strings.Cut(kv, "=")
			props[k] = v
		}
		units[m[1]] = props
	}
	if len(units) == 0 {
		t.Fatalf("the console has no unit lines\n%s", tail(r))
	}
	return units
}

func num(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
