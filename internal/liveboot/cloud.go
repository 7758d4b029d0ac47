package liveboot

import (
	"context"
	"crypto/sha512"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The cloud path (issue 40 item 2): on installer-provisioned GCP and AWS
// clusters the image and its initramfs cannot be changed, so the agent
// comes in the machine's user-data Ignition config and runs from systemd
// after the switch to the real root (deploy/node's fetch mode,
// nodeproof-agent-firstboot.service). The live boot uses the stock
// initramfs (DracutGuest.Stock: Ignition's module, no nodeproof) and a
// minimal real root with systemd made from that same initramfs
// (BuildCloudRoot), on its own disk.

// CloudRootDevice is the real root's disk in the guest: the first of
// Boot.Disks, after the boot disk (vda) and the data disk (vdb).
const CloudRootDevice = "/dev/vdc"

// CloudRootTools are the programs the real root's test unit needs that
// dracut's systemd image lacks (DracutGuest.Install of the stock image the
// root is made from).
var CloudRootTools = []string{"tar", "find", "sort", "stat", "sync", "cut", "sha256sum", "tr", "tail", "sed", "systemctl", "journalctl", "grep", "touch", "echo"}

// CloudRootDrivers are the kernel modules that mount the real root
// (DracutGuest.Drivers).
var CloudRootDrivers = []string{"ext4", "crc32c_generic"}

// CloudCmdline is the kernel command line of a cloud machine's first boot:
// DracutCmdline's, with the real root on CloudRootDevice, mounted
// read-write (no fstab remounts it), instead of the tmpfs.
func CloudCmdline(node string) string {
	return strings.Replace(DracutCmdline(node), "root=tmpfs", "root="+CloudRootDevice+" rw", 1)
}

//go:embed cloudroot
var cloudRootFiles embed.FS

// CloudRoot is the real root of a cloud image for the live boot.
type CloudRoot struct {
	// Initramfs is a stock dracut image (DracutGuest.Stock with
	// CloudRootTools installed): its systemd, udev, networkd and
	// libraries become the root's.
	Initramfs string
	// Agent, when set, is installed as /usr/bin/nodeproof-agent (an image
	// that ships the agent); empty when the user data delivers it.
	Agent string
}

// BuildCloudRoot makes the real root as an ext4 image at out (mke2fs -d,
// no loop mounts): the stock initramfs's tree without what makes it an
// initramfs (initrd-release, Ignition's generator and binary), booting to
// multi-user.target, with /etc/os-release, /etc/machine-id
// "uninitialized" (the first boot: systemd applies the presets, Ignition's
// included, then),
// the accounts an RHCOS image has, systemd-networkd enabled (DHCP from the
// kernel's ip=), a preset that enables nothing else, stand-ins for the
// kubelet and the MCD's first boot, and the live boot's report unit
// (cloudroot/: it says on the console what ran and what the agent wrote,
// saves it to the data disk and powers off).
func (c *CloudRoot) BuildCloudRoot(ctx context.Context, out string) error {
	work, err := os.MkdirTemp(filepath.Dir(out), ".cloudroot-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	tree := filepath.Join(work, "root")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return err
	}
	unpack := exec.CommandContext(ctx, "sh", "-c", `zstd -dc "$1" | cpio -idm --quiet --no-absolute-filenames`, "unpack", c.Initramfs)
	unpack.Dir = tree
	if b, err := unpack.CombinedOutput(); err != nil {
		return fmt.Errorf("liveboot: unpacking %s: %w\n%s", c.Initramfs, err, b)
	}
	unit := func(p string) string { return filepath.Join(tree, "usr/lib/systemd/system", p) }
	for _, p := range []string{"etc/initrd-release", "usr/lib/initrd-release", "etc/os-release", "init",
		"usr/lib/systemd/system-generators/ignition-generator", "usr/bin/ignition", "etc/machine-id",
		"etc/passwd", "etc/group", "etc/shadow", "etc/gshadow", "usr/lib/systemd/system/default.target",
		"etc/systemd/system/default.target"} {
		if err := os.RemoveAll(filepath.Join(tree, p)); err != nil {
			return err
		}
	}
	for _, u := range []string{"multi-user.target", "systemd-networkd.service", "systemd-networkd-wait-online.service", "network-online.target"} {
		if _, err := os.Stat(unit(u)); err != nil {
			return fmt.Errorf("liveboot: the stock initramfs has no %s to make a root of: %w", u, err)
		}
	}
	links := map[string]string{
		"usr/lib/systemd/system/default.target":                                               "multi-user.target",
		"etc/systemd/system/multi-user.target.wants/systemd-networkd.service":                 "/usr/lib/systemd/system/systemd-networkd.service",
		"etc/systemd/system/network-online.target.wants/systemd-networkd-wait-online.service": "/usr/lib/systemd/system/systemd-networkd-wait-online.service",
		"etc/systemd/system/multi-user.target.wants/kubelet.service":                          "/usr/lib/systemd/system/kubelet.service",
		"etc/systemd/system/multi-user.target.wants/machine-config-daemon-firstboot.service":  "/usr/lib/systemd/system/machine-config-daemon-firstboot.service",
		"etc/systemd/system/multi-user.target.wants/nodeproof-cloudroot-report.service":       "/usr/lib/systemd/system/nodeproof-cloudroot-report.service",
	}
	for l, target := range links {
		p := filepath.Join(tree, l)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			return err
		}
		if err := os.Symlink(target, p); err != nil {
			return err
		}
	}
	files := map[string]File{
		"etc/os-release": {Data: []byte("NAME=\"nodeproof live boot root\"\nID=nodeproof-liveboot\nPRETTY_NAME=\"nodeproof live boot root (systemd from the stock initramfs)\"\n"), Mode: 0o644},
		// "uninitialized", not empty: systemd 250 and later boot an empty
		// one as a configured system, and apply no presets.
		"etc/machine-id": {Data: []byte("uninitialized\n"), Mode: 0o444},
		"etc/passwd": {Data: []byte("root:x:0:0:root:/root:/bin/bash\ncore:x:1000:1000:CoreOS Admin:/var/home/core:/bin/bash\n" +
			"systemd-network:x:998:998:systemd Network Management:/:/usr/sbin/nologin\nmessagebus:x:997:997::/nonexistent:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"), Mode: 0o644},
		"etc/group":   {Data: []byte("root:x:0:\nwheel:x:10:core\nsystemd-journal:x:190:\ncore:x:1000:\nsystemd-network:x:998:\nmessagebus:x:997:\nnogroup:x:65534:\n"), Mode: 0o644},
		"etc/shadow":  {Data: []byte("root:*:19000:0:99999:7:::\ncore:*:19000:0:99999:7:::\nsystemd-network:!*:19000::::::\nmessagebus:!*:19000::::::\nnobody:!*:19000::::::\n"), Mode: 0},
		"etc/gshadow": {Data: []byte("root:*::\nwheel:*::core\ncore:!::\nsystemd-network:!::\nmessagebus:!::\nnogroup:*::\n"), Mode: 0},
		// A first boot enables what presets say: Ignition's
		// (/etc/systemd/system-preset/20-ignition.preset) and nothing else.
		"usr/lib/systemd/system-preset/99-default.preset": {Data: []byte("disable *\n"), Mode: 0o644},
	}
	if c.Agent != "" {
		files["usr/bin/nodeproof-agent"] = File{Src: c.Agent, Mode: 0o755}
	}
	for name, src := range map[string]string{"kubelet.service": "usr/lib/systemd/system/kubelet.service",
		"machine-config-daemon-firstboot.service": "usr/lib/systemd/system/machine-config-daemon-firstboot.service",
		"nodeproof-cloudroot-report.service":      "usr/lib/systemd/system/nodeproof-cloudroot-report.service",
		"nodeproof-cloudroot-report.sh":           "usr/libexec/nodeproof-cloudroot-report"} {
		b, err := fs.ReadFile(cloudRootFiles, "cloudroot/"+name)
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		files[src] = File{Data: b, Mode: mode}
	}
	for p, f := range files {
		dst := filepath.Join(tree, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := writeFile(dst, f); err != nil {
			return err
		}
		if err := os.Chmod(dst, f.Mode); err != nil {
			return err
		}
	}
	for _, d := range []string{"root", "var/home/core", "usr/local/bin", "var/lib", "var/log", "tmp", "sysroot"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(tree, "tmp"), 0o1777); err != nil {
		return err
	}
	if err := os.Chown(filepath.Join(tree, "var/home/core"), 1000, 1000); err != nil {
		return err
	}
	du, err := exec.CommandContext(ctx, "du", "-sm", tree).Output()
	if err != nil {
		return fmt.Errorf("liveboot: du: %w", err)
	}
	var mb int
	if _, err := fmt.Sscan(string(du), &mb); err != nil {
		return fmt.Errorf("liveboot: du: %q: %w", du, err)
	}
	mke2fs, err := lookTool("mke2fs")
	if err != nil {
		return err
	}
	// Room for what Ignition and the agent write (the agent binary
	// among them).
	size := fmt.Sprintf("%dM", mb+mb/2+64)
	if b, err := exec.CommandContext(ctx, mke2fs, "-q", "-F", "-t", "ext4", "-L", "root", "-d", tree, out, size).CombinedOutput(); err != nil {
		return fmt.Errorf("liveboot: mke2fs: %w\n%s", err, b)
	}
	return nil
}

// CloudUserData is a cloud machine's user-data Ignition config (on QEMU:
// the qemu platform's fw_cfg config, standing for GCP's or AWS's user
// data) for fetch mode: the pointer config (its merge of the pool's public
// tier and its CA) plus the agent binary from AgentURL with its SHA-512
// (Ignition refuses a binary whose hash differs), the first-boot unit
// enabled with a drop-in running the agent from /usr/local/bin (an RHCOS
// /usr is read-only; /usr/local is /var/usrlocal) with the settings of
// CloudAgentEnv, and the CA bundle.
type CloudUserData struct {
	// Pointer is `nodeproof pointer`'s config.
	Pointer []byte
	// Agent is the agent binary (its hash goes in the config); AgentURL
	// where the machine fetches it.
	Agent, AgentURL string
	// Unit is deploy/node/nodeproof-agent-firstboot.service; Bootstrap,
	// when set, deploy/node/nodeproof-kubelet-bootstrap.service, and
	// Reattest deploy/node/nodeproof-reattest.service (the public tier
	// installs and enables them; the user data gives them the agent's path
	// too, and the re-attestation the user data's settings: without it the
	// node's timer would run an agent that is not there, and the node
	// would never attest again).
	Unit, Bootstrap, Reattest []byte
	// CABundle, Server, Pool and Evidence are the agent's settings.
	CABundle               []byte
	Server, Pool, Evidence string
}

// CloudAgentPath is where the user data puts the agent; CloudAgentEnv its
// settings (read after the public tier's agent.env, if any).
const (
	CloudAgentPath = "/usr/local/bin/nodeproof-agent"
	CloudAgentEnv  = "/etc/nodeproof/agent-user-data.env"
)

// Config returns the Ignition config.
func (u *CloudUserData) Config() ([]byte, error) {
	var cfg map[string]any
	if err := json.Unmarshal(u.Pointer, &cfg); err != nil {
		return nil, fmt.Errorf("liveboot: the pointer config: %w", err)
	}
	if _, ok := cfg["storage"]; ok {
		return nil, fmt.Errorf("liveboot: the pointer config has a storage section already")
	}
	if _, ok := cfg["systemd"]; ok {
		return nil, fmt.Errorf("liveboot: the pointer config has a systemd section already")
	}
	agent, err := os.ReadFile(u.Agent)
	if err != nil {
		return nil, err
	}
	sum := sha512.Sum512(agent)
	// The user data's settings in a file of their own, read after
	// agent.env: Ignition's merge gives the merged public tier's files the
	// last word on a path, and the public tier may carry an agent.env too
	// (deploy/examples' 50-worker-nodeproof-agent).
	dropin, err := agentDropin("the first-boot unit", u.Unit, "EnvironmentFile="+CloudAgentEnv+"\n")
	if err != nil {
		return nil, err
	}
	units := []any{map[string]any{"name": "nodeproof-agent-firstboot.service", "enabled": true, "contents": string(u.Unit),
		"dropins": []any{map[string]any{"name": "10-agent-from-user-data.conf", "contents": dropin}}}}
	if u.Bootstrap != nil {
		d, err := agentDropin("the kubelet bootstrap unit", u.Bootstrap, "")
		if err != nil {
			return nil, err
		}
		units = append(units, map[string]any{"name": "nodeproof-kubelet-bootstrap.service",
			"dropins": []any{map[string]any{"name": "10-agent-from-user-data.conf", "contents": d}}})
	}
	if u.Reattest != nil {
		d, err := agentDropin("the re-attestation unit", u.Reattest, "EnvironmentFile="+CloudAgentEnv+"\n")
		if err != nil {
			return nil, err
		}
		units = append(units, map[string]any{"name": "nodeproof-reattest.service",
			"dropins": []any{map[string]any{"name": "10-agent-from-user-data.conf", "contents": d}}})
	}
	env := fmt.Sprintf("NODEPROOF_SERVER=%s\nNODEPROOF_POOL=%s\nNODEPROOF_EVIDENCE=%s\n", u.Server, u.Pool, u.Evidence)
	data := func(b []byte) string { return "data:;base64," + base64.StdEncoding.EncodeToString(b) }
	cfg["storage"] = map[string]any{"files": []any{
		map[string]any{"path": CloudAgentPath, "mode": 0o755, "overwrite": true,
			"contents": map[string]any{"source": u.AgentURL, "verification": map[string]any{"hash": "sha512-" + hex.EncodeToString(sum[:])}}},
		map[string]any{"path": CloudAgentEnv, "mode": 0o644, "overwrite": true, "contents": map[string]any{"source": data([]byte(env))}},
		map[string]any{"path": "/etc/nodeproof/mcs-ca-bundle.crt", "mode": 0o644, "overwrite": true, "contents": map[string]any{"source": data(u.CABundle)}},
	}}
	cfg["systemd"] = map[string]any{"units": units}
	return json.MarshalIndent(cfg, "", "  ")
}

// agentDropin is a drop-in that runs unit's nodeproof-agent command from
// CloudAgentPath (with extra [Service] lines first).
func agentDropin(what string, unit []byte, extra string) (string, error) {
	exec, rest, ok := strings.Cut(string(unit), "ExecStart=/usr/bin/nodeproof-agent ")
	if !ok || !strings.Contains(exec, "[Service]") {
		return "", fmt.Errorf("liveboot: %s has no ExecStart=/usr/bin/nodeproof-agent", what)
	}
	args, _, _ := strings.Cut(rest, "\n")
	return "# The agent comes in the user data (/usr is the image's).\n[Service]\n" + extra +
		"ExecStart=\nExecStart=" + CloudAgentPath + " " + args + "\n", nil
}
