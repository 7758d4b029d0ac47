package demo

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest/tpm/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/internal/walkthrough"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
)

// The demo's machine-side steps: what the guide leaves to the machine (its
// Ignition, its kubelet registering the Node) and what it only describes
// (the node's life: re-attestations, a refused one and the taint). They run
// as the guide's blocks run, printed the same way, with the guide's ports
// substituted alike.
const (
	// publicTier: anyone on the network runs Ignition with the pool's
	// pointer config and no credentials.
	publicTier = `nodeproof pointer --kubeconfig "$KUBECONFIG" --certs-namespace nodeproof --pool worker --url https://127.0.0.1:22623 --http-total 60s -o worker.ign
mkdir -p ignition-public/system ignition-public/root
IGNITION_CONFIG_FILE=worker.ign IGNITION_SYSTEM_CONFIG_DIR=ignition-public/system TMPDIR=ignition-public \
  ignition -platform file -stage fetch -config-cache ignition-public/config.json -state-file ignition-public/state \
  -neednet ignition-public/neednet -root ignition-public/root -log-to-stdout > ignition-public/ignition.log 2>&1
jq -r '.storage.files[].path' ignition-public/config.json
`
	// registerNode: the kubelet registers its Node (with the certificate
	// just approved; here as the admin), and the node re-attests as it
	// will at every boot and hour: the approver marks it Attested.
	registerNode = `cat <<'YAML' | kubectl apply --server-side -f -
apiVersion: v1
kind: Node
metadata:
  name: worker-2
  labels: {node-role.kubernetes.io/worker: ""}
YAML
nodeproof-agent --mode reattest --force --server https://127.0.0.1:22623 --ca-bundle mcs-ca.crt \
  --pool worker --node-name worker-2 --tpm tcp:127.0.0.1:2323 --event-log machines/worker-2/event-log.bin \
  --kubelet-key machines/worker-2/kubelet.key --state machines/worker-2/reattest.json
kubectl wait --for=condition=Attested --timeout=60s node/worker-2
kubectl get node worker-2 -o jsonpath='{range .status.conditions[?(@.type=="Attested")]}{.type}={.status} ({.reason}) {.message}{"\n"}{end}'
`
	// failedBoot: the machine reboots with Secure Boot off; its
	// re-attestation is refused and the approver taints its Node.
	failedBoot = `nodeproof dev tpm reboot --dir machines/worker-2 --event-log firmware-testdata/logs/ubuntu-2104-no-secure-boot.bin
nodeproof-agent --mode reattest --force --server https://127.0.0.1:22623 --ca-bundle mcs-ca.crt \
  --pool worker --node-name worker-2 --tpm tcp:127.0.0.1:2323 --event-log machines/worker-2/event-log.bin \
  --kubelet-key machines/worker-2/kubelet.key --state machines/worker-2/reattest.json || echo "refused: exit $?"
timeout 60 sh -c 'until kubectl get node worker-2 -o jsonpath="{.spec.taints[*].effect}" | grep -q NoSchedule; do sleep 1; done'
kubectl get node worker-2 -o jsonpath='{range .spec.taints[*]}taint {.key}:{.effect}{"\n"}{end}{range .status.conditions[?(@.type=="Attested")]}{.type}={.status} ({.reason}){"\n"}{end}'
`
	// goodBoot: it boots as before: attested again, untainted.
	goodBoot = `nodeproof dev tpm reboot --dir machines/worker-2 --event-log firmware-testdata/logs/rhel8-uefi.bin
nodeproof-agent --mode reattest --force --server https://127.0.0.1:22623 --ca-bundle mcs-ca.crt \
  --pool worker --node-name worker-2 --tpm tcp:127.0.0.1:2323 --event-log machines/worker-2/event-log.bin \
  --kubelet-key machines/worker-2/kubelet.key --state machines/worker-2/reattest.json
kubectl wait --for=condition=Attested --timeout=60s node/worker-2
timeout 60 sh -c 'while kubectl get node worker-2 -o jsonpath="{.spec.taints[*].key}" | grep -q unattested; do sleep 1; done'
kubectl get node worker-2 -o jsonpath='taints: [{.spec.taints}]{"\n"}'
`
	// revokedNode: after the guide's revocation, the node is tainted
	// NoExecute.
	revokedNode = `timeout 60 sh -c 'until kubectl get node worker-2 -o jsonpath="{.spec.taints[*].effect}" | grep -q NoExecute; do sleep 1; done'
kubectl get node worker-2 -o jsonpath='{range .spec.taints[*]}taint {.key}:{.effect}{"\n"}{end}{range .status.conditions[?(@.type=="Attested")]}{.type}={.status} ({.reason}){"\n"}{end}'
`
)

// runServer is part two: a real API server with nothing installed, then
// the cluster part of the operator's guide (docs/operations.md), block by
// block, with the real binaries — each command printed as it runs — and,
// between the guide's blocks, what a machine does and lives through: its
// public tier fetched by the real Ignition, its Node registered, a
// re-attestation, a refused one and the approver's taint, a clean one, and
// after the guide's revocation and its refusal, the NoExecute taint.
func runServer(ctx context.Context, o Options, step, info func(string, ...any)) error {
	root, err := filepath.Abs(orDefault(o.Root, "."))
	if err != nil {
		return err
	}
	bin := o.Bin
	if bin == "" {
		bin = mkdir(o.Dir, "bin")
		step("Building nodeproof and nodeproof-agent (what make build writes into bin/)")
		if err := walkthrough.BuildBinaries(ctx, root, bin); err != nil {
			return err
		}
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return err
	}
	// kubectl and Ignition, as the guide's reader has them.
	tools := mkdir(o.Dir, "tools")
	for _, find := range []func() (string, error){testenv.KubectlPath, testenv.IgnitionPath} {
		p, err := find()
		if err != nil {
			return err
		}
		if err := os.Symlink(p, filepath.Join(tools, filepath.Base(p))); err != nil {
			return err
		}
	}

	step("A Kubernetes control plane starts: real etcd and kube-apiserver %s on loopback, nothing installed (built by `make tools`)", testenv.KubeVersion)
	if err := ctx.Err(); err != nil {
		return err
	}
	// etcd and kube-apiserver die with the demo, however it dies.
	prefix, err := dieWithParent()
	if err != nil {
		return err
	}
	env, err := clustertest.LaunchWith(mkdir(o.Dir, "control-plane"), clustertest.LaunchOptions{Bare: true, CommandPrefix: prefix})
	if err != nil {
		return err
	}
	defer env.Stop()
	if err := ctx.Err(); err != nil {
		return err
	}
	work := mkdir(o.Dir, "work")
	kubeconfig := filepath.Join(work, "admin.kubeconfig")
	if err := clustertest.WriteKubeconfig(env.Config, kubeconfig, ""); err != nil {
		return err
	}
	info("API server %s, up in %s; KUBECONFIG=%s", env.Config.Host, env.Took.Round(100*time.Millisecond), kubeconfig)

	w, err := walkthrough.New(root, work, bin, &indent{w: o.Out})
	if err != nil {
		return err
	}
	w.Vars = append(w.Vars, "KUBECONFIG="+kubeconfig)
	w.Vars[0] = "PATH=" + bin + string(os.PathListSeparator) + tools + string(os.PathListSeparator) + os.Getenv("PATH")
	ports, err := walkthrough.FreePorts(3)
	if err != nil {
		return err
	}
	free := func() (string, error) {
		p, err := walkthrough.FreePorts(1)
		if err != nil {
			return "", err
		}
		return strconv.Itoa(p[0]), nil
	}
	metrics, err := free()
	if err != nil {
		return err
	}
	w.Subst = map[string]string{
		"22623": strconv.Itoa(ports[0]), "22624": strconv.Itoa(ports[0] + 1),
		"2321": strconv.Itoa(ports[1]), "2323": strconv.Itoa(ports[2]), "9090": metrics,
	}
	// What the blocks start dies with the demo, however it dies; on any
	// other end, it is stopped here.
	stopGuard, err := w.Guard()
	if err != nil {
		return err
	}
	defer stopGuard()
	defer w.Close()
	defer stopTPMs(work)
	script := func(text string) error {
		_, err := w.Script(ctx, w.Expand(text))
		return err
	}
	run := func(block string) error {
		_, err := w.Run(ctx, block)
		return err
	}

	step("docs/operations.md, cluster mode: deploy the kubernetes overlay, the example pools and MachineConfigs, the keyring")
	if err := run("cluster-deploy"); err != nil {
		return err
	}
	step("A machine (a software TPM booted as RHEL 8), and a policy learned from it, in an overlay of your own")
	if err := run("cluster-policy"); err != nil {
		return err
	}
	step("nodeproof serve and nodeproof approve, with the deployment's flags")
	if err := run("cluster-ca"); err != nil {
		return err
	}
	if _, err := w.Start(ctx, "cluster-serve", walkthrough.HTTPReady("http://127.0.0.1:"+w.Subst["22624"]+"/healthz")); err != nil {
		return err
	}
	if _, err := w.Start(ctx, "cluster-approve", walkthrough.HTTPReady("http://127.0.0.1:"+w.Subst["9090"]+"/healthz")); err != nil {
		return err
	}
	step("Anyone on the network runs Ignition with the worker pointer config and no credentials: the public tier")
	if err := script(publicTier); err != nil {
		return err
	}
	step("The machine attests and gets its full config; its kubelet's CSR, with the key the attestation bound, is approved")
	if err := run("cluster-enrol"); err != nil {
		return err
	}
	step("The kubelet registers its Node; the node re-attests (every boot and hour): Attested")
	if err := script(registerNode); err != nil {
		return err
	}
	step("The machine reboots with Secure Boot off: its re-attestation is refused, and the approver taints its Node")
	if err := script(failedBoot); err != nil {
		return err
	}
	step("It boots as before: attested again, and the taint is lifted")
	if err := script(goodBoot); err != nil {
		return err
	}
	step("docs/operations.md: inspect, a revocation, and the revoked machine refused")
	if err := run("cluster-admin"); err != nil {
		return err
	}
	step("The revoked node is tainted NoExecute: its pods are evicted")
	if err := script(revokedNode); err != nil {
		return err
	}
	step("Done: the public tier went to anyone; the full config and a kubelet certificate only to the attested machine, for as long as it stays attested")
	return nil
}

// stopTPMs stops the software TPM daemons the guide started under dir.
func stopTPMs(dir string) {
	states, _ := filepath.Glob(filepath.Join(dir, "machines", "*", "state"))
	for _, s := range states {
		if t, err := swtpm.Attach(s); err == nil {
			t.Stop()
		}
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// indent writes each line indented, as the narration's details are.
type indent struct {
	w       io.Writer
	midLine bool
}

func (in *indent) Write(p []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(p), "\n") {
		if line == "" {
			continue
		}
		if !in.midLine {
			if _, err := io.WriteString(in.w, "    "); err != nil {
				return 0, err
			}
		}
		if _, err := io.WriteString(in.w, line); err != nil {
			return 0, err
		}
		in.midLine = !strings.HasSuffix(line, "\n")
	}
	return len(p), nil
}
