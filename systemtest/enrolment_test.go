package systemtest_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/store/kubestore"
	"github.com/nodeproof/nodeproof/store/kubestore/v1alpha1"
	"github.com/nodeproof/nodeproof/systemtest"
)

// enrolPolicy: pool worker takes every kind of evidence and requested
// names (the weakest naming: the name rule must hold on its own); pool
// reinstall re-enrols always (the documented opt-out). Two GCP projects
// and two AWS accounts, so that cloud names can repeat across them.
func enrolPolicy(roots string) *policytest.Builder {
	return policytest.New().EKRoot(systemtest.VendorRoot, roots).
		Pool("worker", policytest.TPM("ca:"+systemtest.VendorRoot).SecureBoot().
			GCP(policytest.GCPProject, "other-project").AWS(policytest.AWSAccount, "210987654321").Requested()).
		Pool("reinstall", policytest.TPM("ca:"+systemtest.VendorRoot).Requested().Reenrol(policy.ReenrolAlways))
}

// enrolEnv is `nodeproof serve` in cluster mode with the Kubernetes store
// on a real API server, swtpm machines from a vendor, a GCE metadata
// server and an AWS region: every kind of identity, and the store, Events
// and `nodeproof release` as an operator meets them.
type enrolEnv struct {
	*cmdServer
	man        *swtpm.Manufacturer
	gce        *gcptest.Server
	region     *awstest.Region
	kc         kubernetes.Interface
	objects    client.Client // reads the store's objects
	cluster    client.Client // the admin's, with the MCO types
	storeFlags []string
	cfg        *rest.Config
	policyFile string // the server's --policy, reloaded every second
}

// newEnrolEnv starts the server with extra flags after its own.
func newEnrolEnv(t *testing.T, extra ...string) *enrolEnv {
	t.Helper()
	w := systemtest.New(t, "..", systemtest.Options{Cluster: true, NoExamples: true, TPM: true, Cloud: true,
		Policy: func(w *systemtest.World) *policytest.Builder { return enrolPolicy(w.EKRoots) }})
	e := &enrolEnv{man: w.Manufacturer, gce: w.GCE, region: w.Region, kc: w.KC, cfg: w.Config, cluster: w.Client, policyFile: w.PolicyFile}
	var err error
	if e.objects, err = kubestore.NewClient(w.Config); err != nil {
		t.Fatal(err)
	}
	setup := &awsSetup{region: w.Region, certsDir: w.AWSCerts, policy: w.PolicyFile, stateDir: filepath.Join(t.TempDir(), "state")}
	kubeconfig, tokenDir := w.Admin, w.TokenDir
	e.storeFlags = []string{"--store", "kubernetes", "--kubeconfig", kubeconfig, "--store-namespace", "nodeproof"}
	e.cmdServer = setup.serve(t, []string{"--kubeconfig", kubeconfig, "--apiserver-url", w.Config.Host, "--bootstrap-token-dir", tokenDir, "--cert-store=state-dir", "--token-store=file",
		"--store", "kubernetes", "--store-namespace", "nodeproof"},
		append([]string{"--gcp-jwks-url", e.gce.JWKSURL(), "--gcp-audience-url", "https://mcs.nodeproof.test:22623"}, extra...)...)
	return e
}

// kubelet is a kubelet key: its private half (to prove possession) and its
// public key (PKIX DER), as the agent binds it.
type kubelet struct {
	key crypto.Signer
	der []byte
}

func newKubelet(t *testing.T) kubelet {
	t.Helper()
	k, _, err := agent.LoadKubeletKey(filepath.Join(t.TempDir(), "kubelet.key"))
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return kubelet{key: k, der: der}
}

// attempt attests with ev for pool and node, binding k's public key, with a
// proof of possession of k when prove; it returns "200" or the refusal
// ("403 Reason").
func (e *enrolEnv) attempt(t *testing.T, ev agent.Evidence, pool, node string, k kubelet, prove bool) string {
	t.Helper()
	c, err := agent.NewClient(e.url, e.bundle)
	if err != nil {
		t.Fatal(err)
	}
	if prove {
		c.KubeletKey = k.key
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = ev.Attest(ctx, c, pool, node, k.der)
	var refused *agent.Refused
	switch {
	case err == nil:
		return "200"
	case errors.As(err, &refused):
		return fmt.Sprintf("%d %s", refused.Status, refused.Refusal.Reason)
	}
	t.Fatalf("attest %s as %s: %v\n%s", pool, node, err, e.log)
	return ""
}

// mustEnrol is attempt that must succeed.
func (e *enrolEnv) mustEnrol(t *testing.T, what string, ev agent.Evidence, pool, node string, k kubelet, prove bool) {
	t.Helper()
	if got := e.attempt(t, ev, pool, node, k, prove); got != "200" {
		t.Fatalf("%s: %s\n%s", what, got, e.log)
	}
}

// release runs `nodeproof release NODE` beside the running server.
func (e *enrolEnv) release(t *testing.T, node string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := cli.Run(context.Background(), append(append([]string{"release"}, e.storeFlags...), node), &stdout, &stderr); code != 0 {
		t.Fatalf("nodeproof release %s: exit %d: %s", node, code, stderr.String())
	}
	return stdout.String()
}

// event waits for an Event with reason on node's NodeBinding and returns
// its message.
func (e *enrolEnv) event(t *testing.T, node, reason string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := e.kc.CoreV1().Events("nodeproof").List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.kind=NodeBinding,involvedObject.name=" + node + ",reason=" + reason})
		if err == nil && len(evs.Items) > 0 {
			return evs.Items[0].Message
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event on NodeBinding %s after 30 s (%v)", reason, node, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// state is what the store holds: every record and binding, by name and
// version, so that a refusal can be shown to have written nothing.
func (e *enrolEnv) state(t *testing.T) string {
	t.Helper()
	var recs v1alpha1.NodeAttestationList
	var binds v1alpha1.NodeBindingList
	ctx := context.Background()
	if err := e.objects.List(ctx, &recs, client.InNamespace("nodeproof")); err != nil {
		t.Fatal(err)
	}
	if err := e.objects.List(ctx, &binds, client.InNamespace("nodeproof")); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, r := range recs.Items {
		fmt.Fprintf(&b, "record %s@%s\n", r.Name, r.ResourceVersion)
	}
	for _, r := range binds.Items {
		fmt.Fprintf(&b, "binding %s@%s\n", r.Name, r.ResourceVersion)
	}
	return b.String()
}

// tpmMachine is a genuine swtpm machine that booted the RHEL 8 log.
func (e *enrolEnv) tpmMachine(t *testing.T) agent.Evidence {
	t.Helper()
	m, err := e.man.NewMachine(context.Background(), t.TempDir(), firmwaretestdata.MustLog("rhel8-uefi"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return agent.TPMEvidence{Collector: m.Collector}
}

// TestEnrolmentAttacks plays the attacker that holds one genuine identity —
// root on an enrolled machine, a second genuine TPM, a workload that can
// reach the cloud metadata server — against `nodeproof serve` with the
// Kubernetes store: a node name belongs to the identity that enrolled with
// it first, an identity enrols once under one name, enrolling again needs
// the proof of the enrolled kubelet key, a release or a pool that opts out;
// every refusal leaves an Event and writes nothing else. The approver's
// side (a CSR decided on the owner's enrolment) is TestDecide's.
func TestEnrolmentAttacks(t *testing.T) {
	e := newEnrolEnv(t)
	// row checks a refused attempt: its reason, and that it wrote no
	// record and changed no binding.
	row := func(t *testing.T, area, attack, want string, try func() string) {
		t.Helper()
		before := e.state(t)
		attacktable.Check(t, area, attack, want, try())
		if after := e.state(t); want != "200" && after != before {
			t.Errorf("%s: the refusal changed the store:\nbefore:\n%safter:\n%s", attack, before, after)
		}
	}
	taken, enrolled := "403 "+string(attest.ReasonNodeNameTaken), "403 "+string(attest.ReasonIdentityEnrolled)

	t.Run("TPM", func(t *testing.T) {
		a, b := e.tpmMachine(t), e.tpmMachine(t)
		ka := newKubelet(t)
		e.mustEnrol(t, "machine A enrols as master-0", a, "worker", "master-0", ka, true)
		row(t, "enrolment", "TPM: a second genuine TPM asks for a node name another TPM enrolled with (master-0)", taken,
			func() string { return e.attempt(t, b, "worker", "master-0", newKubelet(t), true) })
		if msg := e.event(t, "master-0", string(attest.ReasonNodeNameTaken)); !strings.Contains(msg, "asked for node master-0") {
			t.Errorf("NodeNameTaken event: %q", msg)
		}
		row(t, "enrolment", "TPM: an enrolled TPM asks for a second node name", enrolled,
			func() string { return e.attempt(t, a, "worker", "master-1", ka, true) })
		row(t, "enrolment", "TPM: root on an enrolled machine enrols it again with a kubelet key of its own", enrolled,
			func() string { return e.attempt(t, a, "worker", "master-0", newKubelet(t), true) })
		row(t, "enrolment", "TPM: enrolled again binding the enrolled kubelet key's hash, without its private key", enrolled,
			func() string { return e.attempt(t, a, "worker", "master-0", ka, false) })
		if msg := e.event(t, "master-0", string(attest.ReasonIdentityEnrolled)); !strings.Contains(msg, "enrolled as node master-0") {
			t.Errorf("IdentityAlreadyEnrolled event: %q", msg)
		}
		e.mustEnrol(t, "machine A again with its enrolled kubelet key, proven (a lost answer)", a, "worker", "master-0", ka, true)
		out := e.release(t, "master-0")
		if !strings.Contains(out, "it was bound to tpm-ek:") {
			t.Fatalf("release said %q", out)
		}
		if msg := e.event(t, "master-0", "Released"); !strings.Contains(msg, "bound to tpm-ek:") {
			t.Errorf("Released event: %q", msg)
		}
		e.mustEnrol(t, "machine B takes master-0 once it was released", b, "worker", "master-0", newKubelet(t), true)
		row(t, "enrolment", "TPM: the released machine asks for its old name back", taken,
			func() string { return e.attempt(t, a, "worker", "master-0", ka, true) })
		e.mustEnrol(t, "the released machine enrols under another name", a, "worker", "master-1", newKubelet(t), true)
	})

	t.Run("GCP", func(t *testing.T) {
		gce := agent.GCPEvidence{Metadata: e.gce.Client()}
		inst := gcptest.DefaultInstance(time.Now())
		inst.InstanceName, inst.InstanceID = "gce-1", "1000000000000000001"
		e.gce.SetInstance(inst)
		k := newKubelet(t)
		e.mustEnrol(t, "the instance enrols at first boot", gce, "worker", "", k, true)
		row(t, "enrolment", "GCP: a workload on the joined node mints an identity token and binds its own kubelet key", enrolled,
			func() string { return e.attempt(t, gce, "worker", "", newKubelet(t), true) })
		row(t, "enrolment", "GCP: a workload binds the node's kubelet public key without its private key", enrolled,
			func() string { return e.attempt(t, gce, "worker", "", k, false) })
		e.mustEnrol(t, "the instance again with its enrolled kubelet key, proven", gce, "worker", "", k, true)

		// An instance created two hours ago: a token minted long after
		// its first boot, refused before anything else.
		old := inst
		old.InstanceName, old.InstanceID, old.Created = "gce-old", "1000000000000000002", time.Now().Add(-2*time.Hour).Truncate(time.Second)
		e.gce.SetInstance(old)
		row(t, "enrolment", "GCP: an identity token of an instance created 2 h ago (past the first-boot window)", "403 "+string(attest.ReasonPolicyInstanceAge),
			func() string { return e.attempt(t, gce, "worker", "", newKubelet(t), true) })

		// A project the pool does not list.
		stranger := inst
		stranger.ProjectID, stranger.ProjectNumber, stranger.InstanceName, stranger.InstanceID = "someone-else", 999999999999, "gce-stranger", "3000000000000000001"
		e.gce.SetInstance(stranger)
		row(t, "policy", "GCP: an instance of a project the pool does not list", "403 "+string(attest.ReasonPolicyProject),
			func() string { return e.attempt(t, gce, "worker", "", newKubelet(t), true) })

		// GCP instance names are unique per project and zone only.
		twin := inst
		twin.ProjectID, twin.ProjectNumber, twin.InstanceID = "other-project", 210987654321, "2000000000000000001"
		e.gce.SetInstance(twin)
		row(t, "enrolment", "GCP: an instance of another project with the same instance name", taken,
			func() string { return e.attempt(t, gce, "worker", "", newKubelet(t), true) })

		e.release(t, "gce-1")
		e.gce.SetInstance(inst)
		e.mustEnrol(t, "the instance, reinstalled and released, enrols with a new kubelet key", gce, "worker", "", newKubelet(t), true)
	})

	t.Run("AWS", func(t *testing.T) {
		doc := awstest.NewDocument("us-east-1", time.Now().Add(-5*time.Minute))
		doc.InstanceID, doc.PrivateIP = "i-0e0e0e0e0e0e0e001", "10.0.7.7"
		imds := e.imds(t, doc)
		aws := agent.AWSEvidence{IMDS: imds.Client()}
		k := newKubelet(t)
		e.mustEnrol(t, "the instance enrols", aws, "worker", "", k, true)
		row(t, "enrolment", "AWS: a workload on the joined node reads the identity document and binds its own kubelet key", enrolled,
			func() string { return e.attempt(t, aws, "worker", "", newKubelet(t), true) })
		e.mustEnrol(t, "the instance again with its enrolled kubelet key, proven", aws, "worker", "", k, true)

		// An account the pool does not list.
		stranger := doc
		stranger.AccountID, stranger.InstanceID, stranger.PrivateIP = "999999999999", "i-0d0d0d0d0d0d0d001", "10.0.8.8"
		imds.SetFiles(e.files(t, stranger))
		row(t, "policy", "AWS: an instance of an account the pool does not list", "403 "+string(attest.ReasonPolicyAccount),
			func() string { return e.attempt(t, aws, "worker", "", newKubelet(t), true) })
		imds.SetFiles(e.files(t, doc))

		// ip-10-0-7-7.ec2.internal exists in every VPC of every account.
		twin := doc
		twin.AccountID, twin.InstanceID = "210987654321", "i-0f0f0f0f0f0f0f001"
		imds.SetFiles(e.files(t, twin))
		row(t, "enrolment", "AWS: an instance of another account with the same private IP (the same private DNS name)", taken,
			func() string { return e.attempt(t, aws, "worker", "", newKubelet(t), true) })
		out := e.release(t, "ip-10-0-7-7.ec2.internal")
		if !strings.Contains(out, "aws:123456789012/us-east-1/i-0e0e0e0e0e0e0e001") {
			t.Fatalf("release said %q", out)
		}
		e.mustEnrol(t, "the other account's instance takes the released name", aws, "worker", "", newKubelet(t), true)
	})

	t.Run("a pool that re-enrols always", func(t *testing.T) {
		m := e.tpmMachine(t)
		e.mustEnrol(t, "enrols", m, "reinstall", "reinstall-0", newKubelet(t), true)
		row(t, "enrolment", "TPM: enrolled again with a new kubelet key in a pool with reenrol: always (the documented opt-out)", "200",
			func() string { return e.attempt(t, m, "reinstall", "reinstall-0", newKubelet(t), true) })
		if msg := e.event(t, "reinstall-0", "Reenrolled"); !strings.Contains(msg, "new kubelet key") {
			t.Errorf("Reenrolled event: %q", msg)
		}
		row(t, "enrolment", "TPM: a pool with reenrol: always still keeps one name per identity", enrolled,
			func() string { return e.attempt(t, m, "reinstall", "reinstall-1", newKubelet(t), true) })
	})
}

// imds serves doc, signed by the environment's region.
func (e *enrolEnv) imds(t *testing.T, doc awstest.Document) *awstest.IMDS {
	t.Helper()
	md := awstest.NewIMDS(e.files(t, doc))
	t.Cleanup(md.Close)
	return md
}

func (e *enrolEnv) files(t *testing.T, doc awstest.Document) awstest.Files {
	t.Helper()
	f, err := e.region.Files(doc)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestServeRefusesFailOpenPolicy: a pool with an empty allow-list — no
// project, account, zone, region, EK trust or boot stage listed — is
// refused when the server starts, naming the pool and the field; it does
// not serve as if it meant any.
func TestServeRefusesFailOpenPolicy(t *testing.T) {
	const anyBoot = "bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}"
	for _, tc := range []struct{ name, pool, want string }{
		{"gcp projects", "evidence: [gcp], gcp: {anyZone: true}", `pool "lab": gcp.projects is empty`},
		{"gcp zones", "evidence: [gcp], gcp: {projects: [p]}", `pool "lab": gcp.zones is empty`},
		{"aws accounts", "evidence: [aws], aws: {regions: [us-east-1]}", `pool "lab": aws.accounts is empty`},
		{"aws regions", `evidence: [aws], aws: {accounts: ["1"]}`, `pool "lab": aws.regions is empty`},
		{"tpm EK trust", "evidence: [tpm], tpm: {" + anyBoot + "}", `pool "lab": tpm.ekTrust is empty`},
		{"tpm kernel", "evidence: [tpm], tpm: {anyEKTrust: true, bootComponents: {shim: {any: true}, bootloader: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}", `pool "lab": tpm.bootComponents.kernel.allow is empty`},
		{"tpm command line", "evidence: [tpm], tpm: {anyEKTrust: true, bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, grub: {any: true}}", `pool "lab": tpm.kernelCmdline is empty`},
		{"tpm grub", "evidence: [tpm], tpm: {anyEKTrust: true, bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}}", `pool "lab": tpm.grub is empty`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			pol := filepath.Join(dir, "policy.yaml")
			doc := "apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\npools:\n  lab: {" + tc.pool + "}\n"
			if err := os.WriteFile(pol, []byte(doc), 0o600); err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			code := cli.Run(context.Background(), []string{"serve", "--policy", pol, "--state-dir", filepath.Join(dir, "state"),
				"--server-basedir", "../deploy/examples/bootstrap", "--bootstrap-kubeconfig", "../deploy/examples/bootstrap-kubeconfig"}, io.Discard, &stderr)
			if code == 0 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("serve: exit %d, %q; want a refusal naming %q", code, stderr.String(), tc.want)
			}
		})
	}
}
