// Package systemtest is the home of nodeproof's in-process system tests: the
// whole system — a real kube-apiserver and etcd, software TPMs from a
// vendor, cloud metadata services, nodeproof serve and approve — run in
// one test process, with machines attesting, fetching and asking for
// certificates. Its World builds that system for every test that needs
// one (here, internal/e2e and internal/faults, which run the same world
// as processes, internal/liveboot, the demo, bench/fleet): the cluster as
// nodeproof's deployment leaves it, the trust roots, and a policy
// (attest/policy/policytest).
//
// Where a new end-to-end test goes: docs/testing.md.
package systemtest

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
)

// Names the world gives things.
const (
	// Namespace holds the store's objects, the Leases and the approver's
	// service account (deploy/).
	Namespace = "nodeproof"
	// VendorRoot is the name the policy trusts the TPM vendor's CA by.
	VendorRoot = "swtpm-localca"
	// AWSRegion is the region the AWS fake signs for.
	AWSRegion = "us-east-1"
)

// TB is what the world needs of a test (testing.TB fits; a program
// passes its own, as bench/fleet does): the cloud fakes take it.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// Options say what a World holds.
type Options struct {
	// Root is the module root: deploy/ is read from it (required).
	Root string
	// Dir holds everything the world writes (required).
	Dir string
	// Cluster starts a real kube-apiserver and etcd with nodeproof's CRDs,
	// the namespace nodeproof, the node-bootstrapper's token, the RBAC of
	// deploy/ (approver, store, node bootstrap) and the example
	// MachineConfigs and pools, as a deployment leaves a cluster.
	Cluster bool
	// Signer, with Cluster, issues the certificates of approved kubelet
	// CSRs (clustertest.Signer); ServingIPs and CommandPrefix are
	// clustertest.LaunchOptions'.
	Signer        *clustertest.Signer
	ServingIPs    []net.IP
	CommandPrefix []string
	// Production, with Cluster, authorizes as a production cluster does
	// (clustertest.LaunchOptions.Production: the Node authorizer and
	// NodeRestriction): a real kubelet registers its Node.
	Production bool
	// EditExamples, if set, changes the example MachineConfigs and pools
	// before they are created (bench/fleet grows a config).
	EditExamples func(*clustertest.Examples) error
	// NoExamples, with Cluster, leaves the example MachineConfigs and
	// pools out: the cluster serves no pool until the test creates them
	// (as the MCO would, after nodeproof started).
	NoExamples bool
	// TPM makes a software TPM vendor (swtpm, its EK CA in EKRoots),
	// trusted by the policy as "ca:"+VendorRoot.
	TPM bool
	// Cloud starts a GCE metadata server (with Google's JWKS) and an AWS
	// region (its certificate in AWSCerts); Fakes is their test.
	Cloud bool
	Fakes TB
	// Policy is the world's policy (default: DefaultPolicy).
	Policy func(*World) *policytest.Builder
}

// World is a system's setting: the cluster, the trust roots, the policy.
type World struct {
	o Options
	// Config is an admin (system:masters) config of the API server; KC
	// and Client are clients of it (Client knows the MCO's types).
	Config *rest.Config
	KC     kubernetes.Interface
	Client client.Client
	// Admin and Approver are kubeconfig files: the admin's, and the
	// approver's service account (deploy/approver/rbac.yaml).
	Admin, Approver string
	// TokenDir is the node-bootstrapper's token and CA (serve's
	// --bootstrap-token-dir).
	TokenDir string
	// Manufacturer makes the world's TPMs; EKRoots is its CA directory.
	Manufacturer *swtpm.Manufacturer
	EKRoots      string
	// GCE is the GCE metadata server and JWKS; Region the AWS region,
	// whose certificate is in the directory AWSCerts.
	GCE      *gcptest.Server
	Region   *awstest.Region
	AWSCerts string
	// PolicyFile is the policy, written.
	PolicyFile string

	env *clustertest.Env
}

// DefaultPolicy is the pools most system tests run: worker takes TPM
// evidence from the world's vendor with Secure Boot, GCP and AWS evidence
// from the fakes' project and account, and requested node names; master
// serves no public tier.
func DefaultPolicy(w *World) *policytest.Builder {
	worker := policytest.Public()
	if w.EKRoots != "" {
		worker.TPM("ca:" + VendorRoot).SecureBoot()
	}
	if w.GCE != nil {
		worker.GCP().AWS()
	}
	b := policytest.New().Pool("worker", worker.Requested()).Pool("master", policytest.Public().Private())
	if w.EKRoots != "" {
		b.EKRoot(VendorRoot, w.EKRoots)
	}
	return b
}

// Start builds a world. Close stops it.
func Start(ctx context.Context, o Options) (w *World, err error) {
	if o.Root == "" || o.Dir == "" {
		return nil, errors.New("systemtest: Options: Root and Dir are required")
	}
	if o.Cloud && o.Fakes == nil {
		return nil, errors.New("systemtest: Options: Cloud needs Fakes")
	}
	w = &World{o: o}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	if o.Cluster {
		if err := w.startCluster(ctx); err != nil {
			return nil, err
		}
	}
	if o.TPM {
		if w.Manufacturer, err = swtpm.NewManufacturer(w.mkdir("vendor")); err != nil {
			return nil, err
		}
		// The manufacturer's CA exists once it made a TPM.
		if err := w.Manufacturer.Provision(ctx, w.mkdir("first-tpm")); err != nil {
			return nil, err
		}
		if w.EKRoots, err = w.Manufacturer.RootsDir(); err != nil {
			return nil, err
		}
	}
	if o.Cloud {
		w.GCE = gcptest.NewServer(o.Fakes, time.Now)
		if w.Region, err = awstest.NewRegion(AWSRegion); err != nil {
			return nil, err
		}
		w.AWSCerts = w.mkdir("aws-certs")
		if err := os.WriteFile(filepath.Join(w.AWSCerts, AWSRegion+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: w.Region.Cert.Raw}), 0o600); err != nil {
			return nil, err
		}
	}
	pol := o.Policy
	if pol == nil {
		pol = DefaultPolicy
	}
	if w.PolicyFile, err = pol(w).Write(o.Dir); err != nil {
		return nil, err
	}
	return w, nil
}

// startCluster starts the API server and sets it up as a deployment of
// nodeproof leaves it (with the MCO's example objects unless NoExamples).
func (w *World) startCluster(ctx context.Context) error {
	env, err := clustertest.LaunchWith(w.mkdir("control-plane"), clustertest.LaunchOptions{
		CRDDirs: []string{w.Path("deploy/crds")}, Signer: w.o.Signer, ServingIPs: w.o.ServingIPs, CommandPrefix: w.o.CommandPrefix,
		Production: w.o.Production,
	})
	if err != nil {
		return err
	}
	w.env, w.Config = env, env.Config
	if w.KC, err = kubernetes.NewForConfig(w.Config); err != nil {
		return err
	}
	if w.Client, err = client.New(w.Config, client.Options{Scheme: cluster.Scheme()}); err != nil {
		return err
	}
	if _, err := w.KC.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	w.TokenDir = w.mkdir("node-bootstrapper")
	if err := clustertest.MakeNodeBootstrapper(ctx, w.Config, w.KC, w.TokenDir); err != nil {
		return err
	}
	for _, f := range []string{"deploy/approver/rbac.yaml", "deploy/store/rbac.yaml", "deploy/cluster/node-bootstrap-rbac.yaml"} {
		if err := kubetest.ApplyFile(ctx, w.Client, w.Path(f)); err != nil {
			return err
		}
	}
	if !w.o.NoExamples {
		if err := w.createExamples(ctx); err != nil {
			return err
		}
	}
	return w.WriteKubeconfigs(w.Config)
}

// createExamples creates the example MachineConfigs and pools, edited by
// EditExamples.
func (w *World) createExamples(ctx context.Context) error {
	ex, err := clustertest.ReadExamples(w.Path("deploy/examples/bootstrap"))
	if err != nil {
		return err
	}
	if w.o.EditExamples != nil {
		if err := w.o.EditExamples(ex); err != nil {
			return err
		}
	}
	return ex.CreateAll(ctx, w.Client)
}

// WriteKubeconfigs writes Admin and Approver for the API server as cfg
// reaches it (the server itself, or a proxy in front of it).
func (w *World) WriteKubeconfigs(cfg *rest.Config) error {
	w.Admin, w.Approver = filepath.Join(w.o.Dir, "admin.kubeconfig"), filepath.Join(w.o.Dir, "approver.kubeconfig")
	if err := clustertest.WriteKubeconfig(cfg, w.Admin, ""); err != nil {
		return err
	}
	return clustertest.WriteKubeconfig(cfg, w.Approver, Namespace+"/nodeproof-approver")
}

// Close stops what Start started.
func (w *World) Close() {
	if w.env != nil {
		w.env.Stop()
	}
}

// Path is p in the module.
func (w *World) Path(p string) string { return filepath.Join(w.o.Root, p) }

func (w *World) mkdir(name string) string {
	d := filepath.Join(w.o.Dir, name)
	os.MkdirAll(d, 0o700)
	return d
}

// ServeArgs are the flags of `nodeproof serve` in this world's cluster
// mode — the API server, the node-bootstrapper's token, the policy, its
// evidence's trust (GCP's JWKS, the AWS certificates), the certificates
// and tokens in stateDir, on loopback — without the ports and the
// state directory's own flag; apiURL is the API server as nodes reach it
// (empty: as this process does).
func (w *World) ServeArgs(apiURL string) []string {
	if apiURL == "" {
		apiURL = w.Config.Host
	}
	args := []string{"--kubeconfig", w.Admin, "--apiserver-url", apiURL, "--bootstrap-token-dir", w.TokenDir,
		"--cert-store=state-dir", "--token-store=file", "--policy", w.PolicyFile, "--listen", "127.0.0.1"}
	if w.GCE != nil {
		args = append(args, "--gcp-jwks-url", w.GCE.JWKSURL(), "--aws-certs-dir", w.AWSCerts)
	}
	return args
}

// ApproveArgs are the flags of `nodeproof approve` in this world, as the
// approver's service account, leader-elected as id.
func (w *World) ApproveArgs(id string) []string {
	return []string{"--kubeconfig", w.Approver, "--leader-elect-id", id, "--policy", w.PolicyFile}
}

// WaitServing waits until a server's plain port (plainURL) serves the
// worker pool's public tier.
func WaitServing(plainURL string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := http.Get(plainURL + "/config/worker")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("systemtest: %s does not serve the worker pool after %s: %v", plainURL, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
