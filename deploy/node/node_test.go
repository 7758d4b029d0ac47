// Package node_test checks the node agent's systemd units and dracut module
// as far as a machine without an initramfs boot can: syntax, the ordering
// against the real Ignition dracut units, what module-setup.sh installs, the
// key-copy helper, and that every agent flag the units pass exists.
package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/cmd/nodeproof-agent/agentcli"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/kubeletboot"
)

const (
	moduleDir     = "dracut/50nodeproof"
	agentUnit     = moduleDir + "/nodeproof-agent.service"
	keyUnit       = moduleDir + "/nodeproof-kubelet-key.service"
	fetchDropIn   = moduleDir + "/ignition-fetch-nodeproof.conf"
	firstbootUnit = "nodeproof-agent-firstboot.service"
	reattestUnit  = "nodeproof-reattest.service"
	kubeletUnit   = "nodeproof-kubelet-bootstrap.service"
	reattestTimer = "nodeproof-reattest.timer"
	moduleSetup   = moduleDir + "/module-setup.sh"
	keyHelper     = moduleDir + "/nodeproof-persist-kubelet-key.sh"
)

// unit is a parsed systemd unit file: section -> key -> values, in order
// (repeated keys accumulate, as systemd's list settings do).
type unit map[string]map[string][]string

// parseUnit is a small reader of systemd's unit file syntax: [Section]
// headers, Key=Value lines, # and ; comments, backslash continuations. It
// refuses what systemd would ignore with a warning (a line outside a
// section, a line without "=", an empty key), so that a typo fails here.
func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{}
	var section string
	sc := bufio.NewScanner(bytes.NewReader(b))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		for strings.HasSuffix(line, `\`) && sc.Scan() {
			n++
			line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(sc.Text())
		}
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
			continue
		case line[0] == '[':
			if !strings.HasSuffix(line, "]") {
				t.Fatalf("%s:%d: bad section header %q", path, n, line)
			}
			section = line[1 : len(line)-1]
			if _, dup := u[section]; dup {
				t.Fatalf("%s:%d: section [%s] twice", path, n, section)
			}
			u[section] = map[string][]string{}
			continue
		}
		if section == "" {
			t.Fatalf("%s:%d: %q outside a section", path, n, line)
		}
		k, v, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			t.Fatalf("%s:%d: not Key=Value: %q", path, n, line)
		}
		u[section][k] = append(u[section][k], strings.TrimSpace(v))
	}
	return u
}

// all returns every value of key, list values split on spaces.
func (u unit) all(section, key string) []string {
	var out []string
	for _, v := range u[section][key] {
		out = append(out, strings.Fields(v)...)
	}
	return out
}

// one returns the single value of key.
func (u unit) one(t *testing.T, section, key string) string {
	t.Helper()
	vs := u[section][key]
	if len(vs) != 1 {
		t.Fatalf("[%s] %s: want one value, have %q", section, key, vs)
	}
	return vs[0]
}

func wantHas(t *testing.T, what string, have []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(have, w) {
			t.Errorf("%s: want %s among %q", what, w, have)
		}
	}
}

func wantOne(t *testing.T, u unit, file, section, key, want string) {
	t.Helper()
	if got := u.one(t, section, key); got != want {
		t.Errorf("%s [%s] %s=%s, want %s", file, section, key, got, want)
	}
}

// knownKeys are the keys these units may use; anything else is a typo
// systemd would ignore with a warning.
var knownKeys = map[string][]string{
	"Unit": {"Description", "Documentation", "ConditionPathExists", "ConditionKernelCommandLine",
		"DefaultDependencies", "After", "Before", "Wants", "Requires", "OnFailure", "OnFailureJobMode"},
	"Service": {"Type", "RemainAfterExit", "EnvironmentFile", "ExecStart", "ExecStartPost",
		"StandardOutput", "StandardError"},
	"Install": {"WantedBy", "RequiredBy"},
}

func checkKeys(t *testing.T, file string, u unit) {
	t.Helper()
	for section, kv := range u {
		known, ok := knownKeys[section]
		if !ok {
			t.Errorf("%s: unknown section [%s]", file, section)
			continue
		}
		for k := range kv {
			if !slices.Contains(known, k) {
				t.Errorf("%s: [%s] %s is not a key this test knows (typo?)", file, section, k)
			}
		}
	}
}

func TestUnits(t *testing.T) {
	agent := parseUnit(t, agentUnit)
	key := parseUnit(t, keyUnit)
	dropIn := parseUnit(t, fetchDropIn)
	fb := parseUnit(t, firstbootUnit)
	for f, u := range map[string]unit{agentUnit: agent, keyUnit: key, fetchDropIn: dropIn, firstbootUnit: fb} {
		checkKeys(t, f, u)
	}

	t.Run("pointer", func(t *testing.T) {
		f := agentUnit
		wantOne(t, agent, f, "Unit", "DefaultDependencies", "false")
		wantOne(t, agent, f, "Unit", "ConditionKernelCommandLine", "ignition.firstboot")
		wantHas(t, f+" ConditionPathExists", agent.all("Unit", "ConditionPathExists"),
			"/etc/initrd-release", "/run/ignition/neednet", "!/run/ignition.json")
		wantHas(t, f+" Before", agent.all("Unit", "Before"), "ignition-fetch.service", "ignition-complete.target")
		wantHas(t, f+" After", agent.all("Unit", "After"),
			"network-online.target", "ignition-fetch-offline.service", "ignition-setup-user.service")
		wantHas(t, f+" Wants", agent.all("Unit", "Wants"), "network-online.target")
		wantOne(t, agent, f, "Unit", "OnFailure", "emergency.target")
		wantOne(t, agent, f, "Unit", "OnFailureJobMode", "isolate")
		wantOne(t, agent, f, "Service", "Type", "oneshot")
		wantOne(t, agent, f, "Service", "RemainAfterExit", "yes")
		wantOne(t, agent, f, "Service", "StandardOutput", "journal+console")
		wantOne(t, agent, f, "Service", "EnvironmentFile", "/etc/nodeproof/agent.env")
		args := execArgs(t, agent.one(t, "Service", "ExecStart"))
		if args[0] != "/usr/bin/nodeproof-agent" {
			t.Errorf("%s runs %s", f, args[0])
		}
		wantHas(t, f+" ExecStart", args, "--mode=pointer", "--ignition-dir=/usr/lib/ignition",
			"--ca-bundle=/etc/nodeproof/mcs-ca-bundle.crt")

		// Ignition's fetch needs this unit, so a failure stops it.
		wantHas(t, fetchDropIn+" Requires", dropIn.all("Unit", "Requires"), "nodeproof-agent.service")
		wantHas(t, fetchDropIn+" After", dropIn.all("Unit", "After"), "nodeproof-agent.service")

		// The key the agent makes is the one the copy unit copies.
		keyArg := flagValue(args, "kubelet-key")
		if keyArg == "" || !strings.HasPrefix(keyArg, "/run/") {
			t.Errorf("%s: --kubelet-key=%q, want a file under /run (it must outlive the initramfs)", f, keyArg)
		}
		wantHas(t, keyUnit+" ConditionPathExists", key.all("Unit", "ConditionPathExists"), "/etc/initrd-release", keyArg)
		wantHas(t, keyUnit+" After", key.all("Unit", "After"), "ignition-files.service")
		wantHas(t, keyUnit+" Before", key.all("Unit", "Before"), "ignition-complete.target")
		wantOne(t, key, keyUnit, "Unit", "DefaultDependencies", "false")
		wantOne(t, key, keyUnit, "Unit", "OnFailure", "emergency.target")
		kargs := execArgs(t, key.one(t, "Service", "ExecStart"))
		if !slices.Equal(kargs, []string{"/usr/libexec/nodeproof-persist-kubelet-key", keyArg, "/sysroot"}) {
			t.Errorf("%s ExecStart = %q", keyUnit, kargs)
		}
	})

	t.Run("fetch", func(t *testing.T) {
		f := firstbootUnit
		// Once; and never where Ignition already delivered the full
		// config (the kubeconfig, which the public tier never holds).
		wantHas(t, f+" ConditionPathExists", fb.all("Unit", "ConditionPathExists"), "!/etc/nodeproof/.fetched", "!/etc/kubernetes/kubeconfig")
		wantHas(t, f+" Before", fb.all("Unit", "Before"),
			"machine-config-daemon-firstboot.service", "machine-config-daemon-pull.service", "kubelet.service", "crio.service")
		wantHas(t, f+" After", fb.all("Unit", "After"), "network-online.target")
		wantHas(t, f+" Wants", fb.all("Unit", "Wants"), "network-online.target")
		wantHas(t, f+" RequiredBy", fb.all("Install", "RequiredBy"), "machine-config-daemon-firstboot.service", "kubelet.service")
		wantHas(t, f+" WantedBy", fb.all("Install", "WantedBy"), "multi-user.target")
		if _, ok := fb["Unit"]["DefaultDependencies"]; ok {
			t.Errorf("%s: runs on the installed system, keep the default dependencies", f)
		}
		wantOne(t, fb, f, "Service", "Type", "oneshot")
		wantOne(t, fb, f, "Service", "RemainAfterExit", "yes")
		wantOne(t, fb, f, "Service", "StandardOutput", "journal+console")
		wantOne(t, fb, f, "Service", "EnvironmentFile", "/etc/nodeproof/agent.env")
		args := execArgs(t, fb.one(t, "Service", "ExecStart"))
		if args[0] != "/usr/bin/nodeproof-agent" {
			t.Errorf("%s runs %s; the agent is in the OS image, /usr/bin/nodeproof-agent", f, args[0])
		}
		wantHas(t, f+" ExecStart", args, "--mode=fetch", "--root=/", "--ca-bundle=/etc/nodeproof/mcs-ca-bundle.crt")
		if flagValue(args, "kubelet-key") != "" {
			t.Errorf("%s: fetch mode runs on the installed system: the kubelet's own key path is the default", f)
		}
		// The stamp is written after success, and is what skips the unit.
		if post := execArgs(t, fb.one(t, "Service", "ExecStartPost")); !slices.Equal(post, []string{"/usr/bin/touch", "/etc/nodeproof/.fetched"}) {
			t.Errorf("%s ExecStartPost = %q, want touch of the stamp", f, post)
		}
	})
}

// execArgs splits an ExecStart= value (no quoting in these units) and drops
// systemd's executable prefixes.
func execArgs(t *testing.T, v string) []string {
	t.Helper()
	if strings.ContainsAny(v, `"'`) {
		t.Fatalf("ExecStart with quotes: the test's splitter does not handle them: %s", v)
	}
	f := strings.Fields(v)
	f[0] = strings.TrimLeft(f[0], "-@:+!")
	return f
}

func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// ignitionDracutDir is Ignition's dracut/30ignition of the version the tools
// build, from the Go module cache (the main module requires it).
func ignitionDracutDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/coreos/ignition/v2@"+testenv.IgnitionVersion).Output()
	if err != nil {
		t.Fatalf("go mod download github.com/coreos/ignition/v2@%s: %v", testenv.IgnitionVersion, err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download: %v: %s", err, out)
	}
	return filepath.Join(m.Dir, "dracut", "30ignition")
}

// TestOrderWithIgnition puts the units in one ordering graph with the real
// Ignition v2.24 dracut units and checks that it is acyclic and orders the
// stages as the README says.
// TestReattestUnits: the re-attestation service runs the agent in reattest
// mode only on a node that enrolled, after the first-boot unit, and the
// timer runs it soon after every boot and then often (the agent decides
// whether it is due).
func TestReattestUnits(t *testing.T) {
	svc, timer := parseUnit(t, reattestUnit), parseUnit(t, reattestTimer)
	args := execArgs(t, svc.one(t, "Service", "ExecStart"))
	if !slices.Contains(args, "--mode=reattest") {
		t.Errorf("%s runs %v, not reattest mode", reattestUnit, args)
	}
	if got := svc.one(t, "Service", "Type"); got != "oneshot" {
		t.Errorf("Type=%s, want oneshot", got)
	}
	if conds := svc["Unit"]["ConditionPathExists"]; !slices.Contains(conds, "|/etc/nodeproof/.fetched") || !slices.Contains(conds, "|/etc/kubernetes/kubeconfig") {
		t.Errorf("the service does not require an enrolled node: %v", conds)
	}
	if !strings.Contains(strings.Join(svc["Unit"]["After"], " "), firstbootUnit) {
		t.Errorf("the service does not run after %s", firstbootUnit)
	}
	if got := timer.one(t, "Timer", "Unit"); got != reattestUnit {
		t.Errorf("the timer runs %s", got)
	}
	for _, k := range []string{"OnBootSec", "OnUnitInactiveSec"} {
		if timer.one(t, "Timer", k) == "" {
			t.Errorf("the timer has no %s", k)
		}
	}
	if got := timer.one(t, "Install", "WantedBy"); got != "timers.target" {
		t.Errorf("WantedBy=%s", got)
	}
}

func TestOrderWithIgnition(t *testing.T) {
	dir := ignitionDracutDir(t)
	units := map[string]unit{
		"nodeproof-agent.service":       parseUnit(t, agentUnit),
		"nodeproof-kubelet-key.service": parseUnit(t, keyUnit),
	}
	for _, name := range []string{"ignition-fetch-offline.service", "ignition-fetch.service", "ignition-kargs.service",
		"ignition-disks.service", "ignition-mount.service", "ignition-files.service", "ignition-complete.target"} {
		units[name] = parseUnit(t, filepath.Join(dir, name))
	}
	// The drop-in adds to ignition-fetch.service.
	drop := parseUnit(t, fetchDropIn)
	fetch := units["ignition-fetch.service"]
	for _, k := range []string{"After", "Requires"} {
		fetch["Unit"][k] = append(fetch["Unit"][k], drop["Unit"][k]...)
	}

	// The agent runs when ignition-fetch does: the same path conditions.
	agentCond := units["nodeproof-agent.service"].all("Unit", "ConditionPathExists")
	for _, c := range fetch.all("Unit", "ConditionPathExists") {
		if !slices.Contains(agentCond, c) {
			t.Errorf("ignition-fetch.service has ConditionPathExists=%s, nodeproof-agent.service not", c)
		}
	}
	for _, c := range agentCond {
		if c != "/etc/initrd-release" && !slices.Contains(fetch.all("Unit", "ConditionPathExists"), c) {
			t.Errorf("nodeproof-agent.service has ConditionPathExists=%s, ignition-fetch.service not", c)
		}
	}

	// Edges a -> b: a starts before b.
	edges := map[string][]string{}
	for name, u := range units {
		for _, b := range u.all("Unit", "Before") {
			if _, ok := units[b]; ok {
				edges[name] = append(edges[name], b)
			}
		}
		for _, a := range u.all("Unit", "After") {
			if _, ok := units[a]; ok {
				edges[a] = append(edges[a], name)
			}
		}
	}
	order := topo(t, units, edges)
	t.Logf("start order: %s", strings.Join(order, " → "))
	want := []string{"ignition-fetch-offline.service", "nodeproof-agent.service", "ignition-fetch.service",
		"ignition-disks.service", "ignition-mount.service", "ignition-files.service",
		"nodeproof-kubelet-key.service", "ignition-complete.target"}
	for i := 1; i < len(want); i++ {
		if !reaches(edges, want[i-1], want[i]) {
			t.Errorf("nothing orders %s before %s", want[i-1], want[i])
		}
	}
}

// topo sorts the units by the edges, failing on a cycle (systemd would
// break it by dropping a job at random).
func topo(t *testing.T, units map[string]unit, edges map[string][]string) []string {
	t.Helper()
	in := map[string]int{}
	for n := range units {
		in[n] += 0
		for _, m := range edges[n] {
			in[m]++
		}
	}
	var ready, order []string
	for n, d := range in {
		if d == 0 {
			ready = append(ready, n)
		}
	}
	for len(ready) > 0 {
		slices.Sort(ready)
		n := ready[0]
		ready = ready[1:]
		order = append(order, n)
		for _, m := range edges[n] {
			if in[m]--; in[m] == 0 {
				ready = append(ready, m)
			}
		}
	}
	if len(order) != len(in) {
		t.Fatalf("ordering cycle among %v", in)
	}
	return order
}

func reaches(edges map[string][]string, from, to string) bool {
	seen := map[string]bool{}
	var walk func(string) bool
	walk = func(n string) bool {
		if n == to {
			return true
		}
		if seen[n] {
			return false
		}
		seen[n] = true
		return slices.ContainsFunc(edges[n], walk)
	}
	return walk(from)
}

// TestSystemdAnalyzeVerify runs systemd's own checker where it is installed,
// on copies whose Exec lines run /bin/true (the agent is not installed
// here). It reports unknown keys and bad values as warnings and exits 0, so
// any line about the units fails the test.
func TestSystemdAnalyzeVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze is not installed: the units are checked by this test's own reader only")
		return
	}
	dir := t.TempDir()
	exe := regexp.MustCompile(`(?m)^(Exec[A-Za-z]*=)[-@:+!]*\S+`)
	var names []string
	for _, f := range []string{agentUnit, keyUnit, firstbootUnit, reattestUnit, reattestTimer, kubeletUnit} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		if err := os.WriteFile(filepath.Join(dir, name), exe.ReplaceAll(b, []byte("${1}/bin/true")), 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	cmd := exec.Command(sa, append([]string{"verify", "--man=no"}, names...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	var bad []string
	for _, line := range strings.Split(string(out), "\n") {
		if slices.ContainsFunc(names, func(n string) bool { return strings.Contains(line, n) }) {
			bad = append(bad, line)
		}
	}
	if err != nil || len(bad) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	if len(out) > 0 {
		t.Logf("systemd-analyze verify (about other units):\n%s", out)
	}
}

func TestShellSyntax(t *testing.T) {
	for _, f := range []string{moduleSetup, keyHelper} {
		if out, err := exec.Command("bash", "-n", f).CombinedOutput(); err != nil {
			t.Errorf("bash -n %s: %v\n%s", f, err, out)
		}
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm()&0o111 == 0 {
			t.Errorf("%s is not executable (%v)", f, err)
		}
	}
}

// dracutStubs are dracut's functions as module-setup.sh calls them, logging
// each call to $LOG.
const dracutStubs = `
log() { printf '%s\n' "$*" >>"$LOG"; }
inst_binary() { log inst_binary "$@"; }
inst_simple() { log inst_simple "$@"; }
inst_script() { log inst_script "$@"; }
inst_multiple() { log inst_multiple "$@"; }
instmods() { log instmods "$@"; }
dfatal() { log dfatal "$@"; }
systemctl_stub() { log systemctl "$@"; }
SYSTEMCTL=systemctl_stub
systemdsystemunitdir=/usr/lib/systemd/system
initdir=/nonexistent-initdir
`

// runModuleSetup sources module-setup.sh with dracut's functions stubbed
// and runs script; it returns the calls made and the exit code.
func runModuleSetup(t *testing.T, env []string, script string) ([]string, int) {
	t.Helper()
	logFile := filepath.Join(t.TempDir(), "log")
	moddir, err := filepath.Abs(moduleDir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", dracutStubs+"moddir="+moddir+"\n. "+filepath.Join(moddir, "module-setup.sh")+"\n"+script)
	cmd.Env = append([]string{"LOG=" + logFile, "PATH=" + os.Getenv("PATH")}, env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if len(out) > 0 {
		t.Logf("module-setup.sh output:\n%s", out)
	}
	b, _ := os.ReadFile(logFile)
	return strings.Split(strings.TrimSpace(string(b)), "\n"), code
}

func TestModuleSetup(t *testing.T) {
	t.Run("check-depends", func(t *testing.T) {
		calls, code := runModuleSetup(t, nil, `check; log check "$?"; log depends $(depends)`)
		if code != 0 || !slices.Equal(calls, []string{"check 255", "depends ignition network"}) {
			t.Fatalf("exit %d, calls %q; want check returning 255, depends on ignition and network", code, calls)
		}
	})

	// Files a build on this machine would take.
	conf := t.TempDir()
	agentBin := filepath.Join(conf, "nodeproof-agent")
	write := func(path, data string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(path, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(agentBin, "#!/bin/sh\n", 0o755)
	write(filepath.Join(conf, "mcs-ca-bundle.crt"), "-----BEGIN CERTIFICATE-----\n", 0o644)
	env := []string{"NODEPROOF_AGENT_BINARY=" + agentBin, "NODEPROOF_CONFIG_DIR=" + conf}

	t.Run("refuses-incomplete", func(t *testing.T) {
		// No agent.env.
		calls, code := runModuleSetup(t, env, "install")
		if code == 0 || !strings.HasPrefix(calls[len(calls)-1], "dfatal") {
			t.Fatalf("install without agent.env: exit %d, calls %q; want dfatal and a failed build", code, calls)
		}
		// An agent.env without the evidence.
		write(filepath.Join(conf, "agent.env"), "NODEPROOF_SERVER=https://mcs.example.com:22623\nNODEPROOF_POOL=worker\n", 0o644)
		calls, code = runModuleSetup(t, env, "install")
		if code == 0 || !strings.Contains(calls[len(calls)-1], "NODEPROOF_EVIDENCE") {
			t.Fatalf("install with an incomplete agent.env: exit %d, calls %q", code, calls)
		}
		// No agent binary.
		calls, code = runModuleSetup(t, []string{"NODEPROOF_AGENT_BINARY=/nonexistent/nodeproof-agent", "NODEPROOF_CONFIG_DIR=" + conf}, "install")
		if code == 0 || !strings.Contains(calls[len(calls)-1], "/nonexistent/nodeproof-agent") {
			t.Fatalf("install without the agent: exit %d, calls %q", code, calls)
		}
	})

	t.Run("install", func(t *testing.T) {
		write(filepath.Join(conf, "agent.env"), "NODEPROOF_SERVER=https://mcs.example.com:22623\nNODEPROOF_POOL=worker\nNODEPROOF_EVIDENCE=tpm\n", 0o644)
		calls, code := runModuleSetup(t, env, "install; installkernel")
		if code != 0 {
			t.Fatalf("install: exit %d, calls %q", code, calls)
		}
		moddir, _ := filepath.Abs(moduleDir)
		// What the units run and read is what install puts in the initramfs.
		for _, want := range []string{
			"inst_binary " + agentBin + " /usr/bin/nodeproof-agent",
			"inst_simple " + conf + "/mcs-ca-bundle.crt /etc/nodeproof/mcs-ca-bundle.crt",
			"inst_simple " + conf + "/agent.env /etc/nodeproof/agent.env",
			"inst_script " + moddir + "/nodeproof-persist-kubelet-key.sh /usr/libexec/nodeproof-persist-kubelet-key",
			"inst_simple " + moddir + "/nodeproof-agent.service /usr/lib/systemd/system/nodeproof-agent.service",
			"inst_simple " + moddir + "/nodeproof-kubelet-key.service /usr/lib/systemd/system/nodeproof-kubelet-key.service",
			"inst_simple " + moddir + "/ignition-fetch-nodeproof.conf /usr/lib/systemd/system/ignition-fetch.service.d/10-nodeproof.conf",
			"systemctl -q --root=/nonexistent-initdir add-requires ignition-complete.target nodeproof-agent.service",
			"systemctl -q --root=/nonexistent-initdir add-requires ignition-complete.target nodeproof-kubelet-key.service",
		} {
			if !slices.Contains(calls, want) {
				t.Errorf("install did not call: %s\ncalls:\n%s", want, strings.Join(calls, "\n"))
			}
		}
		// Every file of the module directory is installed (but the
		// module's own script).
		files, _ := os.ReadDir(moduleDir)
		for _, f := range files {
			if f.Name() == "module-setup.sh" {
				continue
			}
			if !slices.ContainsFunc(calls, func(c string) bool { return strings.Contains(c, moddir+"/"+f.Name()+" ") }) {
				t.Errorf("install does not install %s", f.Name())
			}
		}
		// The helper's commands are in the initramfs.
		for _, cmd := range []string{"cp", "chmod", "dirname", "mkdir", "mv", "sed", "sync"} {
			if !slices.ContainsFunc(calls, func(c string) bool {
				return strings.HasPrefix(c, "inst_multiple ") && slices.Contains(strings.Fields(c), cmd)
			}) {
				t.Errorf("install does not install %s (the key helper runs it)", cmd)
			}
		}
	})
}

// The helper, run for real on a directory standing in for /sysroot (with no
// SELinux policy, so it labels nothing).
func TestPersistKubeletKey(t *testing.T) {
	dir := t.TempDir()
	sysroot := filepath.Join(dir, "sysroot")
	key := filepath.Join(dir, "run", "kubelet-client.key.tmp")
	if err := os.MkdirAll(filepath.Dir(key), 0o700); err != nil {
		t.Fatal(err)
	}
	const pem = "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"
	if err := os.WriteFile(key, []byte(pem), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 { // twice: a rerun replaces the file
		if out, err := exec.Command("bash", keyHelper, key, sysroot).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", keyHelper, err, out)
		}
	}
	dst := filepath.Join(sysroot, "var/lib/kubelet/pki/kubelet-client.key.tmp")
	b, err := os.ReadFile(dst)
	if err != nil || string(b) != pem {
		t.Fatalf("%s: %q, %v", dst, b, err)
	}
	for path, mode := range map[string]os.FileMode{dst: 0o600, filepath.Dir(dst): 0o700} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v (%v), want %v", path, fi.Mode().Perm(), err, mode)
		}
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), "*.nodeproof"))
	if len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestAgentFlags checks that every flag the units pass is one the agent
// accepts, and that the whole command line parses: run with the unit's
// arguments (environment filled in, the CA bundle somewhere absent), the
// agent gets as far as reading the CA bundle, past flag parsing.
func TestAgentFlags(t *testing.T) {
	var usage bytes.Buffer
	if code := agentcli.Main(context.Background(), []string{"-h"}, &usage, &usage); code != 0 {
		t.Fatalf("nodeproof-agent -h: exit %d\n%s", code, usage.String())
	}
	flagRe := regexp.MustCompile(`^--?([a-z0-9][a-z0-9-]*)(=|$)`)
	env := map[string]string{
		"NODEPROOF_SERVER": "https://mcs.example.com:22623", "NODEPROOF_POOL": "worker", "NODEPROOF_EVIDENCE": "tpm",
	}
	for _, f := range []string{agentUnit, firstbootUnit, reattestUnit} {
		t.Run(filepath.Base(f), func(t *testing.T) {
			u := parseUnit(t, f)
			args := execArgs(t, u.one(t, "Service", "ExecStart"))[1:]
			for i, a := range args {
				m := flagRe.FindStringSubmatch(a)
				if m == nil {
					t.Fatalf("%s: %q is not a --flag=value", f, a)
				}
				if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(m[1]) + `(\s|$)`).Match(usage.Bytes()) {
					t.Errorf("%s: nodeproof-agent has no flag --%s", f, m[1])
				}
				// ${VAR} from agent.env.
				args[i] = os.Expand(a, func(k string) string {
					v, ok := env[k]
					if !ok {
						t.Errorf("%s: %s is not set by agent.env", f, k)
					}
					return v
				})
				if strings.HasPrefix(a, "--ca-bundle=") {
					args[i] = "--ca-bundle=" + filepath.Join(t.TempDir(), "absent.crt")
				}
			}
			var out bytes.Buffer
			code := agentcli.Main(context.Background(), args, &out, &out)
			if code != 1 || !strings.Contains(out.String(), "CA bundle") {
				t.Fatalf("nodeproof-agent %s: exit %d, want 1 at reading the CA bundle (2 is a usage error)\n%s",
					strings.Join(args, " "), code, out.String())
			}
		})
	}
}

// TestKubeletBootstrapUnit: the kubelet's first certificate is got with
// the bound key before the kubelet starts, in both modes (the bootstrap
// kubeconfig is there, whoever wrote it), after the fetch-mode agent wrote
// its files; the kubelet requires it; the paths it passes are the ones
// OpenShift's kubelet.service passes the kubelet and the ones the
// re-attesting agent reads; every flag is the subcommand's, and the whole
// command line parses (run against an empty directory, it stops at the
// missing bound key, not at a usage error).
func TestKubeletBootstrapUnit(t *testing.T) {
	u := parseUnit(t, kubeletUnit)
	wantHas(t, kubeletUnit+" ConditionPathExists", u.all("Unit", "ConditionPathExists"), kubeletboot.DefaultBootstrapKubeconfig)
	wantHas(t, kubeletUnit+" Before", u.all("Unit", "Before"), "kubelet.service")
	wantHas(t, kubeletUnit+" After", u.all("Unit", "After"), firstbootUnit, "network-online.target")
	wantHas(t, kubeletUnit+" Wants", u.all("Unit", "Wants"), "network-online.target")
	wantHas(t, kubeletUnit+" RequiredBy", u.all("Install", "RequiredBy"), "kubelet.service")
	wantOne(t, u, kubeletUnit, "Service", "Type", "oneshot")
	args := execArgs(t, u.one(t, "Service", "ExecStart"))
	if len(args) < 2 || args[0] != "/usr/bin/nodeproof-agent" || args[1] != "kubelet-bootstrap" {
		t.Fatalf("%s runs %q, not nodeproof-agent kubelet-bootstrap", kubeletUnit, args)
	}
	// The bootstrap kubeconfig is left to the default
	// (kubeletboot.DefaultBootstrapKubeconfig): the unit rides in the
	// public tier, which never names it (mcs/render's checkPublicServed).
	if raw, err := os.ReadFile(kubeletUnit); err != nil || bytes.Contains(raw, []byte("bootstrap-kubeconfig")) {
		t.Errorf("%s names bootstrap-kubeconfig (%v): the public tier must not", kubeletUnit, err)
	}
	want := map[string]string{
		"kubeconfig":  kubeletboot.DefaultKubeconfig,
		"cert-dir":    kubeletboot.DefaultCertDir,
		"kubelet-key": agent.DefaultKubeletKeyPath,
		"bound-key":   agent.DefaultBoundKeyPath, // what reattest reads (its default)
	}
	var usage bytes.Buffer
	if code := agentcli.Main(context.Background(), []string{"kubelet-bootstrap", "-h"}, &usage, &usage); code != 0 {
		t.Fatalf("nodeproof-agent kubelet-bootstrap -h: exit %d\n%s", code, usage.String())
	}
	dir := t.TempDir()
	run := []string{"kubelet-bootstrap"}
	seen := map[string]bool{}
	for _, a := range args[2:] {
		name, val, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok || !strings.HasPrefix(a, "--") {
			t.Fatalf("%s: %q is not a --flag=value", kubeletUnit, a)
		}
		if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(name) + `(\s|$)`).Match(usage.Bytes()) {
			t.Errorf("%s: nodeproof-agent kubelet-bootstrap has no flag --%s", kubeletUnit, name)
		}
		if w, ok := want[name]; ok {
			seen[name] = true
			if val != w {
				t.Errorf("%s: --%s=%s, want %s", kubeletUnit, name, val, w)
			}
			val = filepath.Join(dir, val)
		}
		run = append(run, "--"+name+"="+val)
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("%s does not pass --%s", kubeletUnit, name)
		}
	}
	if slices.ContainsFunc(execArgs(t, parseUnit(t, reattestUnit).one(t, "Service", "ExecStart")), func(a string) bool { return strings.HasPrefix(a, "--bound-key") }) {
		t.Errorf("%s passes --bound-key: keep it the default this unit writes", reattestUnit)
	}
	var out bytes.Buffer
	if code := agentcli.Main(context.Background(), run, &out, &out); code != 1 || !strings.Contains(out.String(), "no bound key") {
		t.Errorf("nodeproof-agent %s: exit %d, want 1 at the missing bound key\n%s", strings.Join(run, " "), code, out.String())
	}
}
