// Command scale is `make bench`: a thousand machines arrive at once. It
// starts a real etcd and kube-apiserver, `nodeproof serve` (cluster mode,
// Kubernetes store) and `nodeproof approve` as processes from their built
// binaries, and a load generator standing in for N machines: most with a
// TPM (bench/simtpm, a software model producing the structures a TPM
// produces; every machine its own EK, EK certificate and AK), some with a
// GCP identity token or an AWS identity document from loopback metadata
// services. Each machine attests, fetches its ~500 KB rendered config with
// the config token, and submits its kubelet client CSR with the bootstrap
// token the config carried, exactly as a kubelet does; the approver
// approves on the real API server.
//
// It reports time until all are approved, p50/p99 time-to-config and
// time-to-approval, server and approver CPU per machine, peak RSS of each
// process, errors and lost or duplicated approvals, and the server's CPU
// per TPM attestation against the crypto floor measured in the same run.
// Run from the module root (make does).
package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	awsimds "github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	legacytpm2 "github.com/google/go-tpm/legacy/tpm2"
	"github.com/vincent-petithory/dataurl"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/bench/internal/bigconfig"
	"github.com/nodeproof/nodeproof/bench/internal/proc"
	"github.com/nodeproof/nodeproof/bench/simtpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/gcp/gcptest"
	"github.com/nodeproof/nodeproof/internal/kubetest"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/cluster"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/store/kubestore"
)

const policy = `apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
trust:
  ekRoots:
  - {name: bench-vendor, dir: %s}
pools:
  worker:
    evidence: [tpm, gcp, aws]
    tpm: {ekTrust: [ca:bench-vendor], requireSecureBoot: true}
    gcp: {projects: [nodeproof-test]}
    aws: {accounts: ["123456789012"], nodeName: instanceID}
    serve: {nodeNames: requested}
`

func main() {
	n := flag.Int("n", 1000, "machines")
	nGCP := flag.Int("gcp", 50, "of which with a GCP identity")
	nAWS := flag.Int("aws", 50, "of which with an AWS identity")
	spread := flag.Duration("spread", 3*time.Second, "the machines arrive within this")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after")
	attestOnly := flag.Int("attest-only", 200, "TPM attestations (no config, no CSR) for the server-CPU-per-attestation figure")
	out := flag.String("o", "", "also write the report (markdown) here")
	flag.Parse()
	log.SetFlags(log.Ltime)
	r, err := run(*n, *nGCP, *nAWS, *spread, *timeout, *attestOnly)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(r)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(r), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

// tb lets the metadata fakes (written for tests) run here.
type tb struct {
	mu       sync.Mutex
	cleanups []func()
}

func (*tb) Helper()            {}
func (*tb) Fatal(args ...any)  { log.Fatal(args...) }
func (t *tb) Cleanup(f func()) { t.mu.Lock(); t.cleanups = append(t.cleanups, f); t.mu.Unlock() }
func (t *tb) close() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

// machine is one simulated machine's identity and what it measured.
type machine struct {
	name     string
	kind     string
	ev       agent.Evidence
	key      *ecdsa.PrivateKey
	pub      []byte
	start    time.Time
	config   time.Duration // arrival → full config fetched
	csrName  string
	approved time.Duration // arrival → CSR approved (seen by the watcher)
	record   string
	err      error
}

func run(n, nGCP, nAWS int, spread, timeout time.Duration, attestOnly int) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Minute)
	defer cancel()
	if nGCP+nAWS > n {
		return "", errors.New("-gcp + -aws exceed -n")
	}
	dir, err := os.MkdirTemp("", "nodeproof-scale-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	fakes := new(tb)
	defer fakes.close()

	log.Print("building nodeproof")
	bin := filepath.Join(dir, "nodeproof")
	if b, err := exec.Command("go", "build", "-o", bin, "./cmd/nodeproof").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build (run from the module root): %v\n%s", err, b)
	}

	log.Print("starting etcd and kube-apiserver")
	env, err := clustertest.Launch(mkdir(dir, "cp"), "deploy/crds")
	if err != nil {
		return "", err
	}
	defer env.Stop()
	cfg := env.Config
	cfg.QPS, cfg.Burst = 1000, 2000
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		return "", err
	}
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeproof"}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	tokenDir := mkdir(dir, "node-bootstrapper")
	if err := clustertest.MakeNodeBootstrapper(ctx, cfg, kc, tokenDir); err != nil {
		return "", err
	}
	for _, f := range []string{"deploy/approver/rbac.yaml", "deploy/store/rbac.yaml", "deploy/cluster/node-bootstrap-rbac.yaml"} {
		if err := kubetest.ApplyFile(ctx, c, f); err != nil {
			return "", err
		}
	}
	ex, err := clustertest.ReadExamples("deploy/examples/bootstrap")
	if err != nil {
		return "", err
	}
	grown := 0
	for _, mc := range ex.Configs {
		if strings.HasPrefix(mc.Name, "rendered-worker-") {
			if grown, err = bigconfig.Grow(mc); err != nil {
				return "", err
			}
		}
	}
	if err := ex.CreateAll(ctx, c); err != nil {
		return "", err
	}
	admin, approverKC := filepath.Join(dir, "admin.kubeconfig"), filepath.Join(dir, "approver.kubeconfig")
	if err := clustertest.WriteKubeconfig(cfg, admin, ""); err != nil {
		return "", err
	}
	if err := clustertest.WriteKubeconfig(cfg, approverKC, "nodeproof/nodeproof-approver"); err != nil {
		return "", err
	}

	// Machines' identities.
	log.Printf("making %d TPM machines (software model), %d GCP and %d AWS identities", n-nGCP-nAWS, nGCP, nAWS)
	fleet, err := newFleet(mkdir(dir, "vendor"), n-nGCP-nAWS)
	if err != nil {
		return "", err
	}
	gceKey := gcptest.NewKey(fakes)
	var gces []*gcptest.Server
	for i := range nGCP {
		s := gcptest.NewServerWithKey(fakes, time.Now, gceKey)
		inst := s.Instance()
		inst.InstanceName, inst.InstanceID = fmt.Sprintf("gce-%04d", i), fmt.Sprint(4000000000000000000+i)
		s.SetInstance(inst)
		gces = append(gces, s)
	}
	region, err := awstest.NewRegion("us-east-1")
	if err != nil {
		return "", err
	}
	awsCerts := mkdir(dir, "aws-certs")
	os.WriteFile(filepath.Join(awsCerts, "us-east-1.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: region.Cert.Raw}), 0o600)

	policyFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyFile, fmt.Appendf(nil, policy, fleet.rootsDir), 0o600); err != nil {
		return "", err
	}
	state := mkdir(dir, "server")
	secure, plain, debug := freePort(), freePort(), freePort()
	url := fmt.Sprintf("https://127.0.0.1:%d", secure)
	jwks := "http://127.0.0.1:1/none"
	if len(gces) > 0 {
		jwks = gces[0].JWKSURL()
	}
	serverLog, approverLog := filepath.Join(dir, "serve.log"), filepath.Join(dir, "approve.log")
	server, err := startProcess(bin, serverLog, "serve", "--kubeconfig", admin, "--apiserver-url", cfg.Host,
		"--bootstrap-token-dir", tokenDir, "--policy", policyFile, "--state-dir", state, "--hosts", "127.0.0.1",
		"--listen", "127.0.0.1", "--secure-port", fmt.Sprint(secure), "--insecure-port", fmt.Sprint(plain),
		"--gcp-audience-url", url, "--gcp-jwks-url", jwks, "--aws-certs-dir", awsCerts,
		"--debug-addr", fmt.Sprintf("127.0.0.1:%d", debug))
	if err != nil {
		return "", err
	}
	defer stopProcess(server)
	approver, err := startProcess(bin, approverLog, "approve", "--kubeconfig", approverKC, "--leader-elect-id", "bench",
		"--metrics-addr", "127.0.0.1:0", "--kube-api-qps", "200", "--kube-api-burst", "400")
	if err != nil {
		return "", err
	}
	defer stopProcess(approver)
	if err := waitServed(fmt.Sprintf("http://127.0.0.1:%d/config/worker", plain)); err != nil {
		return "", fmt.Errorf("%w\n%s", err, tail(serverLog))
	}
	bundle, err := os.ReadFile(filepath.Join(state, "certs", "current", certs.CABundleFileName))
	if err != nil {
		return "", err
	}

	// The machines.
	ms := make([]*machine, n)
	for i := range n {
		m := &machine{name: fmt.Sprintf("scale-%04d", i)}
		if m.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return "", err
		}
		if m.pub, err = x509.MarshalPKIXPublicKey(&m.key.PublicKey); err != nil {
			return "", err
		}
		switch {
		case i < nGCP:
			m.kind = "gcp"
			m.ev = agent.GCPEvidence{Metadata: gces[i].Client()}
		case i < nGCP+nAWS:
			m.kind = "aws"
			doc := awstest.NewDocument("us-east-1", time.Now().Add(-time.Minute))
			doc.InstanceID = fmt.Sprintf("i-%017x", i)
			f, err := region.Files(doc)
			if err != nil {
				return "", err
			}
			imds := awstest.NewIMDS(f)
			defer imds.Close()
			// The SDK's default timeouts (1 s dials, 3 attempts) are for a
			// metadata service on the instance, not for fifty on a 2-core
			// machine under this load.
			m.ev = agent.AWSEvidence{IMDS: awsimds.New(awsimds.Options{Endpoint: imds.URL, HTTPClient: &http.Client{Timeout: time.Minute}})}
		default:
			m.kind = "tpm"
			m.ev = agent.TPMEvidence{Collector: fleet.machines[i-nGCP-nAWS]}
		}
		ms[i] = m
	}

	// Watch approvals: when each CSR was seen approved (or denied),
	// whether or not its machine has recorded the CSR's name yet.
	var approvedAt, deniedWhy sync.Map
	factory := informers.NewSharedInformerFactory(kc, 0)
	inf := factory.Certificates().V1().CertificateSigningRequests().Informer()
	seen := func(obj any) {
		o := obj.(*certv1.CertificateSigningRequest)
		for _, cond := range o.Status.Conditions {
			switch cond.Type {
			case certv1.CertificateApproved:
				approvedAt.LoadOrStore(o.Name, time.Now())
			case certv1.CertificateDenied:
				deniedWhy.LoadOrStore(o.Name, cond.Reason+": "+cond.Message)
			}
		}
	}
	inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }})
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	settled := func() (approved, failed int) {
		for _, m := range ms {
			switch {
			case m.err != nil:
				failed++
			case m.csrName == "":
			default:
				if _, ok := approvedAt.Load(m.csrName); ok {
					approved++
				} else if _, ok := deniedWhy.Load(m.csrName); ok {
					failed++
				}
			}
		}
		return
	}

	// The server's CPU profile over the burst.
	profile := filepath.Join(os.TempDir(), "nodeproof-scale-server.pprof")
	profiled := make(chan error, 1)
	go func() {
		profiled <- fetchProfile(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", debug, int(spread.Seconds())+15), profile)
	}()
	cpuS0, cpuA0 := proc.CPU(server.Process.Pid), proc.CPU(approver.Process.Pid)
	cpDir := filepath.Join(dir, "cp")
	apiPID, etcdPID := proc.Find("kube-apiserver", cpDir), proc.Find("etcd", cpDir)
	cpuAPI0, cpuEtcd0, cpuSelf0 := proc.CPU(apiPID), proc.CPU(etcdPID), proc.CPU(os.Getpid())
	log.Printf("go: %d machines within %s", n, spread)
	begin := time.Now()
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * spread / time.Duration(n))
			m.start = time.Now()
			m.err = provision(ctx, url, bundle, m)
		}()
	}
	wg.Wait()
	for time.Since(begin) < timeout {
		if a, f := settled(); a+f >= n {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	all := time.Since(begin)
	for _, m := range ms {
		if m.err == nil && m.csrName != "" {
			if t, ok := approvedAt.Load(m.csrName); ok {
				m.approved = t.(time.Time).Sub(m.start)
			} else if why, ok := deniedWhy.Load(m.csrName); ok {
				m.err = fmt.Errorf("CSR denied: %s", why)
			} else {
				m.err = errors.New("CSR not decided before the timeout")
			}
		}
	}
	cpuS, cpuA := proc.CPU(server.Process.Pid)-cpuS0, proc.CPU(approver.Process.Pid)-cpuA0
	others := map[string]time.Duration{
		"kube-apiserver": proc.CPU(apiPID) - cpuAPI0, "etcd": proc.CPU(etcdPID) - cpuEtcd0,
		"load generator (this process: the machines' TPM model, TLS, JSON, metadata fakes)": proc.CPU(os.Getpid()) - cpuSelf0,
	}

	// Lost or duplicated approvals: every approved CSR's record consumed
	// once, by that CSR; no record consumed twice.
	kcl, err := kubestore.NewClient(cfg)
	if err != nil {
		return "", err
	}
	st, err := kubestore.New(kcl, "nodeproof", time.Now)
	if err != nil {
		return "", err
	}
	dup, lost, err := checkRecords(ctx, kc, st, ms)
	if err != nil {
		return "", err
	}

	// Server CPU per TPM attestation, and the floor, in the same run.
	perAttest, floor, err := attestCost(ctx, url, bundle, fleet, attestOnly, server.Process.Pid)
	if err != nil {
		return "", err
	}

	var top string
	if err := <-profiled; err != nil {
		top = "server profile: " + err.Error()
	} else if b, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", bin, profile).CombinedOutput(); err == nil {
		top = "server CPU profile over the burst (" + profile + "):\n" + string(b)
	}
	return report(n, nGCP, nAWS, grown, spread, all, ms, cpuS, cpuA, proc.PeakRSS(server.Process.Pid), proc.PeakRSS(approver.Process.Pid),
		dup, lost, perAttest, floor) + cpuSplit(all, cpuS, cpuA, others) + "\n" + top, nil
}

// cpuSplit shows where the machine's CPU went during the burst.
func cpuSplit(wall, server, approver time.Duration, others map[string]time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nCPU during the burst (%s wall, %.0f CPU-seconds available on %d cores):\n\n| process | CPU-seconds |\n|---|---|\n",
		wall.Round(time.Second), wall.Seconds()*float64(runtime.NumCPU()), runtime.NumCPU())
	fmt.Fprintf(&b, "| nodeproof serve | %.1f |\n| nodeproof approve | %.1f |\n", server.Seconds(), approver.Seconds())
	names := make([]string, 0, len(others))
	for k := range others {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, "| %s | %.1f |\n", k, others[k].Seconds())
	}
	return b.String()
}

func fetchProfile(url, file string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// provision is one machine: attest, fetch the config, submit the CSR.
func provision(ctx context.Context, url string, bundle []byte, m *machine) error {
	c, err := agent.NewClient(url, bundle)
	if err != nil {
		return err
	}
	c.MinBackoff, c.MaxBackoff = 200*time.Millisecond, 2*time.Second
	vr, err := m.ev.Attest(ctx, c, "worker", m.name, m.pub)
	if err != nil {
		return fmt.Errorf("attest: %w", err)
	}
	m.record = vr.Record
	full, err := c.FetchConfig(ctx, vr.Pool, vr.ConfigToken)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	m.config = time.Since(m.start)
	kubeconfig, err := kubeconfigOf(full)
	if err != nil {
		return err
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 50, 100
	nkc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	data, err := cert.MakeCSR(m.key, &pkix.Name{Organization: []string{"system:nodes"}, CommonName: "system:node:" + vr.NodeName}, nil, nil)
	if err != nil {
		return err
	}
	// The API server authenticates a new bootstrap token a moment after
	// its Secret was written (an informer): retry 401s briefly, as the
	// kubelet's bootstrap does.
	var name string
	for try := 0; ; try++ {
		name, _, err = csr.RequestCertificate(nkc, data, "", certv1.KubeAPIServerClientKubeletSignerName, nil,
			[]certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, m.key)
		if err == nil || try > 50 || !strings.Contains(err.Error(), "Unauthorized") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("CSR: %w", err)
	}
	m.csrName = name
	return nil
}

func kubeconfigOf(full []byte) ([]byte, error) {
	var c struct {
		Storage struct {
			Files []struct {
				Path     string `json:"path"`
				Contents struct {
					Source string `json:"source"`
				} `json:"contents"`
			} `json:"files"`
		} `json:"storage"`
	}
	if err := json.Unmarshal(full, &c); err != nil {
		return nil, err
	}
	for _, f := range c.Storage.Files {
		if f.Path == api.FirstBootFiles[0] {
			du, err := dataurl.DecodeString(f.Contents.Source)
			if err != nil {
				return nil, err
			}
			return du.Data, nil
		}
	}
	return nil, errors.New("the full config has no kubeconfig")
}

// checkRecords counts duplicated approvals (a record consumed for more
// than one approved CSR, or a CSR approved twice) and lost ones (an
// attested machine whose CSR is not approved, or approved without its
// record consumed by it).
func checkRecords(ctx context.Context, kc kubernetes.Interface, st *kubestore.Store, ms []*machine) (dup, lost int, err error) {
	csrs, err := kc.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, err
	}
	perRecord := map[string]int{}
	approvedCSR := map[string]bool{}
	for _, c := range csrs.Items {
		n := 0
		for _, cond := range c.Status.Conditions {
			if cond.Type == certv1.CertificateApproved {
				n++
				if i := strings.Index(cond.Message, "NodeAttestation "); i >= 0 {
					perRecord[strings.Fields(cond.Message[i+len("NodeAttestation "):])[0]]++
				}
			}
		}
		if n > 1 {
			dup++
		}
		approvedCSR[c.Name] = n > 0
	}
	for _, k := range perRecord {
		if k > 1 {
			dup += k - 1
		}
	}
	for _, m := range ms {
		if m.record == "" {
			continue // never attested: an error, counted as such
		}
		r, err := st.GetRecord(ctx, m.record)
		if err != nil {
			return 0, 0, err
		}
		if !approvedCSR[m.csrName] || r.ConsumedAt == nil || !strings.HasPrefix(r.ConsumedBy, m.csrName+"/") {
			lost++
		}
	}
	return dup, lost, nil
}

// fleet is the TPM machines (bench/simtpm) and their vendor.
type fleet struct {
	vendor   *tpmtest.VendorCA
	rootsDir string
	log      []byte
	machines []*simtpm.Machine
}

func newFleet(dir string, n int) (*fleet, error) {
	vendor, err := tpmtest.NewVendorCA("bench-vendor", time.Now())
	if err != nil {
		return nil, err
	}
	if err := vendor.WriteRoots(dir); err != nil {
		return nil, err
	}
	f := &fleet{vendor: vendor, rootsDir: dir, log: firmwaretestdata.MustLog("rhel8-uefi")}
	if n == 0 {
		return f, nil
	}
	keys, err := simtpm.EKKeys(n) // cached across runs: RSA key generation is the slow part
	if err != nil {
		return nil, err
	}
	f.machines, err = simtpm.NewMachines(vendor, f.log, keys, nil)
	return f, err
}

// attestCost runs k TPM attestations (no config, no CSR) against the
// server and returns its CPU per attestation, and the crypto floor of one
// attestation measured here, in the same run: the EK certificate's
// signature, the AK creation signature and the quote signature (ECDSA
// P-256), RSA-OAEP to the EK, SHA-256 of the event log and its PCR
// extends, 64 random bytes — what no verifier can skip.
func attestCost(ctx context.Context, url string, bundle []byte, f *fleet, k, pid int) (time.Duration, time.Duration, error) {
	if k == 0 || len(f.machines) == 0 {
		return 0, 0, nil
	}
	keys, err := simtpm.EKKeys(k)
	if err != nil {
		return 0, 0, err
	}
	ms, err := simtpm.NewMachines(f.vendor, f.log, keys, nil)
	if err != nil {
		return 0, 0, err
	}
	kub, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return 0, 0, err
	}
	pub, _ := x509.MarshalPKIXPublicKey(&kub.PublicKey)
	c, err := agent.NewClient(url, bundle)
	if err != nil {
		return 0, 0, err
	}
	cpu0 := proc.CPU(pid)
	var wg sync.WaitGroup
	var failed atomic.Int64
	sem := make(chan struct{}, 8)
	for i, m := range ms {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := c.AttestTPM(ctx, "worker", fmt.Sprintf("cost-%04d", i), m, pub); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return 0, 0, fmt.Errorf("%d of %d cost-run attestations failed", n, k)
	}
	perAttest := (proc.CPU(pid) - cpu0) / time.Duration(k)

	// The floor, on one machine's evidence.
	v, err := tpm.NewVerifier(tpm.Options{Roots: []tpm.RootSet{mustRoots(f.rootsDir)}, Clock: time.Now})
	if err != nil {
		return 0, 0, err
	}
	req, err := ms[0].Request()
	if err != nil {
		return 0, 0, err
	}
	sum := sha256.Sum256(pub)
	ch, sess, err := v.Challenge("worker", sum[:], req)
	if err != nil {
		return 0, 0, err
	}
	ev, err := ms[0].Answer(ch, sum[:])
	if err != nil {
		return 0, 0, err
	}
	claims, err := v.Verify(sess, ev)
	if err != nil {
		return 0, 0, err
	}
	ekCert, err := x509.ParseCertificate(req.EKCertificate)
	if err != nil {
		return 0, 0, err
	}
	akPub, err := legacytpm2.DecodePublic(req.AK.Public)
	if err != nil {
		return 0, 0, err
	}
	ak, err := akPub.Key()
	if err != nil {
		return 0, 0, err
	}
	cs, err := legacytpm2.DecodeSignature(bytes.NewBuffer(req.AK.CreateSignature))
	if err != nil {
		return 0, 0, err
	}
	qs, err := legacytpm2.DecodeSignature(bytes.NewBuffer(ev.Quotes[0].Signature))
	if err != nil {
		return 0, 0, err
	}
	ekPub := ekCert.PublicKey.(*rsa.PublicKey)
	const rounds = 200
	start := time.Now()
	for range rounds {
		if err := ekCert.CheckSignatureFrom(f.vendor.Intermediate); err != nil {
			return 0, 0, err
		}
		d := sha256.Sum256(req.AK.CreateAttestation)
		if !ecdsa.Verify(ak.(*ecdsa.PublicKey), d[:], cs.ECC.R, cs.ECC.S) {
			return 0, 0, errors.New("floor: creation signature")
		}
		d = sha256.Sum256(ev.Quotes[0].Quote)
		if !ecdsa.Verify(ak.(*ecdsa.PublicKey), d[:], qs.ECC.R, qs.ECC.S) {
			return 0, 0, errors.New("floor: quote signature")
		}
		var seed [32]byte
		if _, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, ekPub, seed[:], []byte("IDENTITY\x00")); err != nil {
			return 0, 0, err
		}
		_ = sha256.Sum256(ev.EventLog)
		var pcr [64]byte
		for range claims.TPM.Boot.LogEvents {
			s := sha256.Sum256(pcr[:])
			copy(pcr[:32], s[:])
		}
		var rnd [64]byte
		rand.Read(rnd[:])
	}
	return perAttest, time.Since(start) / rounds, nil
}

func mustRoots(dir string) tpm.RootSet {
	rs, err := tpm.LoadRootSet("bench-vendor", dir)
	if err != nil {
		log.Fatal(err)
	}
	return rs
}

func report(n, nGCP, nAWS, grown int, spread, all time.Duration, ms []*machine, cpuS, cpuA time.Duration, rssS, rssA int64, dup, lost int, perAttest, floor time.Duration) string {
	var toConfig, toApproval []time.Duration
	var errs []string
	for _, m := range ms {
		if m.err != nil {
			errs = append(errs, fmt.Sprintf("%s (%s): %v", m.name, m.kind, m.err))
			continue
		}
		toConfig = append(toConfig, m.config)
		if m.approved > 0 {
			toApproval = append(toApproval, m.approved)
		}
	}
	q := func(d []time.Duration, p float64) string {
		if len(d) == 0 {
			return "-"
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[min(len(d)-1, int(float64(len(d))*p))].Round(time.Millisecond).String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d machines (%d TPM, %d GCP, %d AWS) arriving within %s; rendered worker config grown by %d KB of file contents\n\n",
		n, n-nGCP-nAWS, nGCP, nAWS, spread, grown>>10)
	fmt.Fprintf(&b, "| figure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| all approved after | %s |\n", all.Round(time.Millisecond))
	fmt.Fprintf(&b, "| approved | %d of %d |\n", len(toApproval), n)
	fmt.Fprintf(&b, "| time to config p50 / p99 | %s / %s |\n", q(toConfig, .5), q(toConfig, .99))
	fmt.Fprintf(&b, "| time to approval p50 / p99 | %s / %s |\n", q(toApproval, .5), q(toApproval, .99))
	fmt.Fprintf(&b, "| server CPU per machine | %s |\n", (cpuS / time.Duration(n)).Round(time.Microsecond))
	fmt.Fprintf(&b, "| approver CPU per machine | %s |\n", (cpuA / time.Duration(n)).Round(time.Microsecond))
	fmt.Fprintf(&b, "| server peak RSS | %d MB |\n", rssS>>20)
	fmt.Fprintf(&b, "| approver peak RSS | %d MB |\n", rssA>>20)
	fmt.Fprintf(&b, "| errors | %d |\n", len(errs))
	fmt.Fprintf(&b, "| lost / duplicated approvals | %d / %d |\n", lost, dup)
	if floor > 0 {
		fmt.Fprintf(&b, "| server CPU per TPM attestation / crypto floor | %s / %s = %.2fx |\n", perAttest.Round(time.Microsecond), floor.Round(time.Microsecond), float64(perAttest)/float64(floor))
	}
	for i, e := range errs {
		if i == 10 {
			fmt.Fprintf(&b, "… and %d more\n", len(errs)-10)
			break
		}
		fmt.Fprintln(&b, "error:", e)
	}
	return b.String()
}

func mkdir(parent, name string) string {
	d := filepath.Join(parent, name)
	os.MkdirAll(d, 0o700)
	return d
}

func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func startProcess(bin, logFile string, args ...string) (*exec.Cmd, error) {
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	// As deploy/ runs them: a soft memory limit under the container's
	// (GOMEMLIMIT), so the garbage collector works before memory grows.
	cmd.Env = append(os.Environ(), "GOMEMLIMIT=160MiB")
	cmd.Stdout, cmd.Stderr = f, f
	return cmd, cmd.Start()
}

func stopProcess(cmd *exec.Cmd) {
	cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
	}
}

func waitServed(url string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return errors.New("the server does not serve the worker pool")
}

func tail(file string) string {
	b, _ := os.ReadFile(file)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
