package liveboot_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/internal/liveboot"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// agentShare is what one boot's console says of the agent's run: the
// guest's uptime when it started and ended, and the agent's own split.
type agentShare struct {
	total, tpm, network, server time.Duration
	// added is from the agent's start to the guest's poweroff: all the
	// boot spent on nodeproof's steps (with Ignition and kubelet-csr, and
	// the first boot's re-attestation, when they run).
	added time.Duration
}

var (
	markRE = regexp.MustCompile(`^nodeproof-liveboot: (agent (?:pointer|reattest) start|agent exit \d+) \[uptime ([0-9.]+)\]$`)
	offRE  = regexp.MustCompile(`^nodeproof-liveboot: poweroff \[uptime ([0-9.]+)\]$`)
	tookRE = regexp.MustCompile(`^nodeproof-agent: took ([0-9.]+)s: TPM ([0-9.]+)s, network ([0-9.]+)s, server ([0-9.]+)s`)
)

// firstAgentRun reads the boot's first agent run from its console: from
// the guest's uptime marks around it (the boot's share), split by the
// agent's own line.
func firstAgentRun(tb testing.TB, r *liveboot.Result) agentShare {
	tb.Helper()
	var a agentShare
	var start float64
	seen := 0
	for _, l := range r.Lines {
		if m := markRE.FindStringSubmatch(l.Text); m != nil && seen < 2 {
			up, _ := strconv.ParseFloat(m[2], 64)
			if seen == 0 {
				start = up
			} else {
				a.total = time.Duration((up - start) * float64(time.Second))
			}
			seen++
		}
		if m := offRE.FindStringSubmatch(l.Text); m != nil && seen > 0 {
			up, _ := strconv.ParseFloat(m[1], 64)
			a.added = time.Duration((up - start) * float64(time.Second))
		}
		if m := tookRE.FindStringSubmatch(l.Text); m != nil && a.tpm == 0 {
			sec := func(s string) time.Duration {
				f, _ := strconv.ParseFloat(s, 64)
				return time.Duration(f * float64(time.Second))
			}
			a.tpm, a.network, a.server = sec(m[2]), sec(m[3]), sec(m[4])
		}
	}
	if seen < 2 || a.tpm == 0 || a.added == 0 {
		tb.Fatalf("the console does not show the agent's run\n%s", tail(r))
	}
	return a
}

// BenchmarkLiveBoot is `make bench-boot`: one machine boots five times,
// one VM at a time — without the agent (the baseline: firmware, shim,
// GRUB, kernel, init), enrolling (the agent attests and fetches, then
// Ignition and the kubelet CSR), rebooting (the agent re-attests), then
// from a unified kernel image the firmware runs (no shim, no GRUB: the
// same kernel, initramfs and command line), without the agent and
// re-attesting — and reports seconds per boot and the agent's share of
// each boot, split into the TPM's work, the network and the server, as
// ratios to the boot.
// The machine is shared and TCG is slow: the figures are one run's,
// every ratio against a boot of the same run.
func BenchmarkLiveBoot(b *testing.B) {
	ctx := context.Background()
	say := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "bench-boot: "+format+"\n", args...) }
	if err := liveboot.Check(); err != nil {
		b.Fatal(err)
	}
	parts, err := liveboot.LoadParts(testenv.Cache())
	if err != nil {
		b.Fatal(err)
	}
	tb := testing.TB(b)
	dg := authenticode(tb, parts)
	bins := build(tb, say)
	w := startWorld(tb, bins, livePolicy(dg, false), say)
	work := b.TempDir()
	ignition, err := testenv.IgnitionPath()
	if err != nil {
		b.Fatal(err)
	}
	g := &liveboot.Guest{Agent: bins.agent, KubeletCSR: bins.kubeletCSR, Ignition: ignition, CABundle: w.caBundle(tb),
		Pointer: w.pointer(tb), Server: w.guestURL(), Pool: "worker", Node: node}
	initramfs, disk := filepath.Join(work, "initrd.img"), filepath.Join(work, "boot.img")
	if err := g.BuildInitramfs(ctx, parts, initramfs); err != nil {
		b.Fatal(err)
	}
	if err := liveboot.BuildBootDisk(ctx, parts, initramfs, true, disk); err != nil {
		b.Fatal(err)
	}
	if b.N != 1 {
		b.Fatalf("b.N = %d: the machine enrols once (its node name is in its initramfs); run with -benchtime 1x", b.N)
	}
	m, err := liveboot.NewMachine(ctx, w.man, "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	// The UKI's boots: the live boot's UKI (kernel A, the same initramfs
	// and command line) signed by the signer lab's db key, run by the
	// firmware of the lab's store, the pool made a UKI pool from its file.
	lab, err := liveboot.LoadSignerLab(ctx, testenv.Cache(), say)
	if err != nil {
		b.Fatal(err)
	}
	ukiImage, ukiDisk, _ := buildUKI(tb, ctx, lab, filepath.Join(work, "uki"), parts, g, liveboot.KernelCmdline, lab.Keys.DBSigner, lab.Keys.DBCA, false)
	ukiPool := filepath.Join(work, "uki-pool.yaml")
	w.policyCmd(tb, "policy", "learn", "--efi", "uki="+ukiImage, "--uki-pool", "--pool", "worker", "--merge", w.policyFile, "-o", ukiPool)
	bootOn := func(name, plan, disk, vars string) *liveboot.Result {
		say("boot %s", name)
		r, err := m.Boot(ctx, liveboot.Boot{Disk: disk, SecureBoot: true, Vars: vars, Forward: []int{w.serverPort, w.apiPort},
			FwCfg: map[string]string{"nodeproof/plan": plan}, Progress: say})
		if err != nil {
			b.Fatalf("%s: %v\n%s", name, err, tail(r))
		}
		say("boot %s: %.1fs", name, r.Took.Seconds())
		return r
	}
	boot := func(name, plan string) *liveboot.Result { return bootOn(name, plan, disk, "") }
	b.ResetTimer()
	none := boot("without the agent", "none")
	enrol := boot("enrolling", "agent")
	reattest := boot("re-attesting", "agent")
	b.StopTimer()
	applyPolicy(tb, w, ukiPool)
	b.StartTimer()
	ukiNone := bootOn("UKI without the agent", "none", ukiDisk, lab.Vars.Path)
	ukiReattest := bootOn("UKI re-attesting", "agent", ukiDisk, lab.Vars.Path)
	b.StopTimer()
	if _, ok := ukiReattest.Find(fmt.Sprintf("node %s re-attested", node)); !ok {
		b.Fatalf("the UKI's re-attestation was not admitted\n%s", tail(ukiReattest))
	}
	b.ReportMetric(ukiNone.Took.Seconds(), "s/uki-boot-without-agent")
	b.ReportMetric(ukiNone.Took.Seconds()/none.Took.Seconds(), "uki-boot-without-agent/boot-without-agent")
	say("UKI without the agent: %.1fs, %.2fx the GRUB chain's boot without the agent", ukiNone.Took.Seconds(), ukiNone.Took.Seconds()/none.Took.Seconds())
	if _, ok := enrol.Find("kubelet-csr: CSR "); !ok {
		b.Fatalf("the enrolling boot made no kubelet CSR\n%s", tail(enrol))
	}
	base := none.Took.Seconds()
	b.ReportMetric(base, "s/boot-without-agent")
	for _, c := range []struct {
		name string
		r    *liveboot.Result
	}{{"enrol", enrol}, {"reattest", reattest}, {"uki-reattest", ukiReattest}} {
		a := firstAgentRun(tb, c.r)
		took := c.r.Took.Seconds()
		b.ReportMetric(took, "s/boot-"+c.name)
		b.ReportMetric(took/base, c.name+"-boot/boot-without-agent")
		b.ReportMetric(a.total.Seconds()/took, c.name+"-agent/boot")
		b.ReportMetric(a.added.Seconds()/took, c.name+"-nodeproof-steps/boot")
		b.ReportMetric(a.tpm.Seconds()/took, c.name+"-tpm/boot")
		b.ReportMetric(a.network.Seconds()/took, c.name+"-network/boot")
		b.ReportMetric(a.server.Seconds()/took, c.name+"-server/boot")
		say("%s: boot %.1fs (%.2fx the boot without the agent); nodeproof's steps %.2fs = %.3f of the boot; the agent %.2fs = %.3f: TPM %.2fs (%.3f), network %.2fs (%.3f), server %.2fs (%.3f)",
			c.name, took, took/base, a.added.Seconds(), a.added.Seconds()/took, a.total.Seconds(), a.total.Seconds()/took, a.tpm.Seconds(), a.tpm.Seconds()/took,
			a.network.Seconds(), a.network.Seconds()/took, a.server.Seconds(), a.server.Seconds()/took)
	}
}

// BenchmarkLiveBootDracut is the dracut initramfs's part of `make
// bench-boot`: in one run, a machine boots the live boot's busybox
// initramfs without the agent (the baseline) and another machine, its EK
// listed, boots a dracut + systemd initramfs with Ignition's own units and
// deploy/node's 50nodeproof for its first boot (the agent attests, then
// Ignition fetches and writes the attested config); it reports seconds
// per boot, the dracut boot against the baseline, and the agent's and
// Ignition's shares of the dracut boot (systemd's own unit timestamps).
func BenchmarkLiveBootDracut(b *testing.B) {
	ctx := context.Background()
	say := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "bench-boot-dracut: "+format+"\n", args...) }
	if b.N != 1 {
		b.Fatalf("b.N = %d: each machine boots once; run with -benchtime 1x", b.N)
	}
	tb := testing.TB(b)
	env := newDracutEnv(tb, ctx, say)
	work := b.TempDir()
	busybox := &liveboot.Guest{Agent: env.bins.agent, KubeletCSR: env.bins.kubeletCSR, Ignition: env.ignition, CABundle: env.w.caBundle(tb),
		Pointer: env.w.pointer(tb), Server: env.w.guestURL(), Pool: "worker", Node: node}
	bbInitrd, bbDisk := filepath.Join(work, "busybox.img"), filepath.Join(work, "busybox-boot.img")
	if err := busybox.BuildInitramfs(ctx, env.parts, bbInitrd); err != nil {
		b.Fatal(err)
	}
	if err := liveboot.BuildBootDisk(ctx, env.parts, bbInitrd, true, bbDisk); err != nil {
		b.Fatal(err)
	}
	dg2 := &liveboot.DracutGuest{Agent: env.bins.agent, Ignition: env.ignition, IgnitionModule: env.ignitionModule,
		NodeproofModule: "../../deploy/node/dracut/50nodeproof", CABundle: env.w.caBundle(tb),
		Server: env.w.guestURL(), Pool: "worker", Evidence: "tpm"}
	drInitrd, drDisk := filepath.Join(work, "dracut.img"), filepath.Join(work, "dracut-boot.img")
	if err := dg2.BuildInitramfs(ctx, env.parts, env.kmoddir, drInitrd); err != nil {
		b.Fatal(err)
	}
	if err := liveboot.BuildBootDiskWith(ctx, env.parts, drInitrd, liveboot.GrubConfig(true, liveboot.DracutCmdline(dracutNode)), drDisk); err != nil {
		b.Fatal(err)
	}
	pointer := filepath.Join(work, "pointer.ign")
	if err := os.WriteFile(pointer, env.w.pointer(tb), 0o644); err != nil {
		b.Fatal(err)
	}
	m1, err := liveboot.NewMachine(ctx, env.w.man, "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m1.Close() })
	m2, err := liveboot.NewMachine(ctx, env.w.man, "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m2.Close() })
	listEKs(tb, env.w, env.dg, map[string]string{ekSHA256(tb, m2): dracutNode})
	b.ResetTimer()
	say("boot busybox, without the agent")
	base, err := m1.Boot(ctx, liveboot.Boot{Disk: bbDisk, SecureBoot: true, Forward: []int{env.w.serverPort, env.w.apiPort},
		FwCfg: map[string]string{"nodeproof/plan": "none"}, Progress: say})
	if err != nil {
		b.Fatalf("the busybox boot: %v\n%s", err, tail(base))
	}
	say("boot dracut, first boot")
	dr, err := m2.Boot(ctx, liveboot.Boot{Disk: drDisk, SecureBoot: true, Forward: []int{env.w.serverPort, env.w.apiPort},
		FwCfgFiles: map[string]string{liveboot.IgnitionConfigFwCfg: pointer}, Progress: say, Limit: 10 * time.Minute})
	if err != nil {
		b.Fatalf("the dracut boot: %v\n%s", err, tail(dr))
	}
	b.StopTimer()
	if _, ok := dr.Find("nodeproof-liveboot: ignition complete"); !ok {
		b.Fatalf("the dracut boot did not complete Ignition\n%s", tail(dr))
	}
	units := unitTimes(tb, dr)
	agent := time.Duration(units["nodeproof-agent"].exit-units["nodeproof-agent"].start) * time.Microsecond
	ign := time.Duration(units["ignition-files"].exit-units["ignition-fetch"].start) * time.Microsecond
	took, baseTook := dr.Took.Seconds(), base.Took.Seconds()
	b.ReportMetric(baseTook, "s/busybox-boot-without-agent")
	b.ReportMetric(took, "s/dracut-first-boot")
	b.ReportMetric(took/baseTook, "dracut-first-boot/busybox-boot-without-agent")
	b.ReportMetric(agent.Seconds()/took, "dracut-agent/boot")
	b.ReportMetric(ign.Seconds()/took, "dracut-ignition-fetch-to-files/boot")
	say("busybox without the agent %.1fs; dracut first boot %.1fs (%.2fx): the agent %.2fs (%.3f of the boot), Ignition fetch→files %.2fs (%.3f)",
		baseTook, took, took/baseTook, agent.Seconds(), agent.Seconds()/took, ign.Seconds(), ign.Seconds()/took)
}
