package systemtest_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/cmd/nodeproof/cli"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/azuretpm"
	"github.com/nodeproof/nodeproof/identity/azuretpm/azuretpmtest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/mcs/api"
	"github.com/nodeproof/nodeproof/mcs/cluster/clustertest"
	"github.com/nodeproof/nodeproof/systemtest"
)

// azureSetup is `nodeproof serve` taking Azure vTPM evidence from the lab
// subscription (policytest.AzureSubscription), its nodes named by request,
// trusting a lab vTPM CA (--azure-vtpm-roots,
// --azure-vtpm-intermediates-dir) and a lab IMDS signer's hierarchy
// (--azure-imds-roots, --azure-imds-intermediates-dir); and a fake IMDS
// signing with that signer.
type azureSetup struct {
	*awsSetup
	srv  *cmdServer
	now  time.Time
	ca   *azuretpmtest.CA
	imds *azuretpmtest.IMDS
	man  *swtpm.Manufacturer
	log  []byte
	vms  int
}

func newAzureSetup(t *testing.T, mode []string) *azureSetup {
	t.Helper()
	if err := swtpm.Check(); err != nil {
		t.Fatalf("Azure vTPM tests need swtpm (%s): %v", swtpm.InstallHint, err)
	}
	s := &azureSetup{awsSetup: newAWSSetup(t, nil), now: time.Now().Truncate(time.Second), log: firmwaretestdata.MustLog(cloudLog)}
	// Any boot components: the log is a real VM's.
	s.policy = writePolicy(t, t.TempDir(), policytest.New().Pool("worker", policytest.Public().AzureVTPM().Requested()))
	var err error
	if s.ca, err = azuretpmtest.NewCA(s.now); err != nil {
		t.Fatal(err)
	}
	imdsCA, err := azuretpmtest.NewIMDSCA(s.now, "metadata.azure.com")
	if err != nil {
		t.Fatal(err)
	}
	s.imds = azuretpmtest.NewIMDS(imdsCA, time.Now)
	t.Cleanup(s.imds.Close)
	if s.man, err = swtpm.NewManufacturer(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	akRoot, imdsRoot := filepath.Join(dir, "vtpm-root.pem"), filepath.Join(dir, "imds-root.pem")
	akInter, imdsInter := filepath.Join(dir, "vtpm-intermediates"), filepath.Join(dir, "imds-intermediates")
	writePEM(t, akRoot, s.ca.Root.Raw)
	writePEM(t, imdsRoot, imdsCA.Root.Raw)
	for _, d := range []string{akInter, imdsInter} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	writePEM(t, filepath.Join(akInter, "intermediate.pem"), s.ca.Intermediate.Raw)
	writePEM(t, filepath.Join(imdsInter, "intermediate.pem"), imdsCA.Intermediate.Raw)
	s.srv = s.serve(t, mode, "--azure-vtpm-roots", akRoot, "--azure-vtpm-intermediates-dir", akInter,
		"--azure-imds-roots", imdsRoot, "--azure-imds-intermediates-dir", imdsInter)
	return s
}

// vm is a swtpm provisioned by ca as the vTPM of Azure VM vmID ("" : a
// fresh VM ID), and its TPM path for the agent.
func (s *azureSetup) vm(t *testing.T, ca *azuretpmtest.CA, vmID string, o azuretpmtest.VMOptions) (path, id string, vm *azuretpmtest.VM) {
	t.Helper()
	if vmID == "" {
		s.vms++
		vmID = fmt.Sprintf("5f3c8a1e-2b7d-4c9a-9e61-%012x", s.vms)
	}
	vm, err := ca.NewVM(context.Background(), s.man, t.TempDir(), s.log, vmID, s.now, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vm.Close)
	return "tcp:" + vm.TPM.Addr, vmID, vm
}

// document makes the fake IMDS sign documents naming VM vmID, changed by
// edit (nil: as IMDS signs them).
func (s *azureSetup) document(vmID string, edit func(*azuretpmtest.Content)) {
	s.imds.Rewrite(func(c azuretpmtest.Content) azuretpmtest.Content {
		c.VMID = vmID
		if edit != nil {
			edit(&c)
		}
		return c
	})
}

// client is an agent client of the server with a fresh kubelet key.
func (s *azureSetup) client(t *testing.T) (*agent.Client, []byte) {
	t.Helper()
	return (&cloudTPMSetup{awsSetup: s.awsSetup, srv: s.srv}).client(t)
}

// attest runs the agent with Azure vTPM evidence from the TPM at path, as
// nodeproof-agent does (agent.Sources), asking for nodeName.
func (s *azureSetup) attest(t *testing.T, path, nodeName string) (*api.VerifyResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logFile := filepath.Join(t.TempDir(), "binary_bios_measurements")
	if err := os.WriteFile(logFile, s.log, 0o600); err != nil {
		t.Fatal(err)
	}
	ev, closer, err := agent.Sources()[attest.KindAzureVTPM](ctx, agent.SourceOptions{TPMPath: path, EventLog: logFile, AzureIMDS: s.imds.Client()})
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	c, der := s.client(t)
	return ev.Attest(ctx, c, "worker", nodeName, der)
}

// TestAzureVTPMAttacksEndToEnd: an Azure Trusted Launch VM's vTPM, as
// nodeproof-agent finds and uses it (--evidence auto), with IMDS's attested
// document, enrols against nodeproof serve under the name it asks for
// (serve.nodeNames: requested) and fetches its config, and re-attests; the
// server refuses a VM of a subscription its policy does not list, a
// document naming another VM, an AK certificate or a document from
// another chain, an expired document, a quote by another key than the
// certified one, the VM enrolling again with a new key, and the VM once
// revoked; the agent refuses a TPM without Azure's AK certificate.
func TestAzureVTPMAttacksEndToEnd(t *testing.T) {
	s := newAzureSetup(t, directoryMode)
	ctx := context.Background()
	path, vmID, vm := s.vm(t, s.ca, azuretpmtest.VMID, azuretpmtest.VMOptions{})
	s.document(vmID, nil)

	kind, found, err := agent.DetectEvidence(ctx, agent.DetectOptions{TPMPath: path})
	if err != nil || kind != attest.KindAzureVTPM {
		t.Fatalf("--evidence auto on an Azure vTPM found %q (%s), %v", kind, found, err)
	}
	c, der := s.client(t)
	coll, err := azuretpm.NewCollector(ctx, mustDialAzure(t, vm), azuretpm.CollectorOptions{IMDS: s.imds.Client()})
	if err != nil {
		t.Fatal(err)
	}
	vr, err := agent.AzureVTPMEvidence{Collector: coll}.Attest(ctx, c, "worker", "azure-node-1", der)
	if err != nil {
		t.Fatalf("the Azure VM's enrolment: %v\n%s", err, s.srv.log)
	}
	if vr.NodeName != "azure-node-1" {
		t.Errorf("enrolled as %q, want the name asked for", vr.NodeName)
	}
	if _, err := c.FetchConfig(ctx, "worker", vr.ConfigToken); err != nil {
		t.Fatalf("the enrolled VM's fetch: %v", err)
	}
	c.Purpose = attest.PurposeReattest
	rr, err := agent.AzureVTPMEvidence{Collector: coll}.Attest(ctx, c, "worker", "azure-node-1", der)
	if err != nil || rr.Reattest == nil || rr.NodeName != "azure-node-1" {
		t.Fatalf("the enrolled VM's re-attestation: %+v, %v", rr, err)
	}

	foreign, err := azuretpmtest.NewCA(s.now)
	if err != nil {
		t.Fatal(err)
	}
	foreignIMDS, err := azuretpmtest.NewIMDSCA(s.now, "metadata.azure.com")
	if err != nil {
		t.Fatal(err)
	}
	other := "0e4f1c2d-3b5a-4e6f-8a9b-0c1d2e3f4a5b"
	for i, tc := range []struct {
		attack string
		ca     *azuretpmtest.CA
		o      azuretpmtest.VMOptions
		// doc edits the document IMDS signs for the VM; vm its vmId.
		doc  func(*azuretpmtest.Content)
		imds *azuretpmtest.IMDS
		want attest.Reason
	}{
		{attack: "a VM of a subscription the pool does not list, certified by Azure", ca: s.ca, doc: func(c *azuretpmtest.Content) { c.SubscriptionID = other }, want: attest.ReasonPolicySubscription},
		{attack: "an attested document naming another VM than the AK certificate (the enrolled VM's)", ca: s.ca, doc: func(c *azuretpmtest.Content) { c.VMID = azuretpmtest.VMID }, want: attest.ReasonAzureDocVM},
		{attack: "an AK certificate from a CA with Azure's names and other keys", ca: foreign, want: attest.ReasonAKCertUntrusted},
		{attack: "an expired AK certificate", ca: s.ca, o: azuretpmtest.VMOptions{Cert: azuretpmtest.Cert{NotBefore: s.now.AddDate(-2, 0, 0), NotAfter: s.now.AddDate(-1, 0, 0)}}, want: attest.ReasonAKCertExpired},
		{attack: "an attested document past its expiresOn", ca: s.ca, doc: func(c *azuretpmtest.Content) {
			c.Created, c.Expires = s.now.Add(-8*time.Hour), s.now.Add(-2*time.Hour)
		}, want: attest.ReasonAzureDocExpired},
		{attack: "an attested document signed under a hierarchy with IMDS's names and other keys", ca: s.ca, imds: azuretpmtest.NewIMDS(foreignIMDS, time.Now), want: attest.ReasonAzureDocUntrusted},
	} {
		_, id, v := s.vm(t, tc.ca, "", tc.o)
		md := s.imds
		if tc.imds != nil {
			md = tc.imds
			t.Cleanup(md.Close)
		}
		md.Rewrite(func(c azuretpmtest.Content) azuretpmtest.Content {
			c.VMID = id
			if tc.doc != nil {
				tc.doc(&c)
			}
			return c
		})
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		coll, err := azuretpm.NewCollector(ctx, mustDialAzure(t, v), azuretpm.CollectorOptions{IMDS: md.Client()})
		if err != nil {
			t.Fatal(err)
		}
		ac, key := s.client(t)
		_, err = agent.AzureVTPMEvidence{Collector: coll}.Attest(ctx, ac, "worker", fmt.Sprintf("azure-attack-%d", i), key)
		coll.Close()
		cancel()
		attacktable.Check(t, "Azure vTPM (server)", tc.attack, "403 "+string(tc.want), fetchRefusal(nil, err))
	}

	// A quote by another VM's AK, sent with this VM's certificate; this
	// VM's AK and quote with the other's certificate.
	_, id2, vm2 := s.vm(t, s.ca, "", azuretpmtest.VMOptions{})
	attacker, key := s.client(t)
	keySHA, _ := attest.KeySHA256(key)
	coll1, err := azuretpm.NewCollector(ctx, mustDialAzure(t, vm), azuretpm.CollectorOptions{IMDS: s.imds.Client()})
	if err != nil {
		t.Fatal(err)
	}
	coll2, err := azuretpm.NewCollector(ctx, mustDialAzure(t, vm2), azuretpm.CollectorOptions{IMDS: s.imds.Client()})
	if err != nil {
		t.Fatal(err)
	}
	var ch api.ChallengeResponse
	post(t, attacker, api.PathChallenge, api.ChallengeRequest{Kind: attest.KindAzureVTPM, Pool: "worker", NodeName: "azure-attack-q", KubeletPublicKey: key, Request: api.Message(coll1.Request())}, &ch)
	var ac azuretpm.Challenge
	if err := json.Unmarshal(ch.Challenge, &ac); err != nil {
		t.Fatal(err)
	}
	s.document(vmID, nil)
	ev1, err := coll1.Answer(&ac, keySHA)
	if err != nil {
		t.Fatal(err)
	}
	s.document(id2, nil)
	ev2, err := coll2.Answer(&ac, keySHA)
	if err != nil {
		t.Fatal(err)
	}
	byOther := *ev1
	byOther.Quote = ev2.Quote
	attacktable.Check(t, "Azure vTPM (server)", "a VM's AK, certificate and document sent with a quote by another VM's AK",
		"403 "+string(attest.ReasonQuoteSignature), refusal(postRaw(t, attacker, api.PathVerify, api.VerifyRequest{Session: ch.Session, Kind: attest.KindAzureVTPM, Evidence: api.Message(&byOther)})))
	withCert := *ev2
	withCert.AKCertificate = ev1.AKCertificate
	attacktable.Check(t, "Azure vTPM (server)", "a VM's AK and quote sent with another VM's AK certificate",
		"403 "+string(attest.ReasonAKCertKeyMismatch), refusal(postRaw(t, attacker, api.PathVerify, api.VerifyRequest{Session: ch.Session, Kind: attest.KindAzureVTPM, Evidence: api.Message(&withCert)})))
	coll1.Close()
	coll2.Close()

	// The same VM again, a new kubelet key (a reinstall, or root on it).
	s.document(vmID, nil)
	_, err = s.attest(t, path, "azure-node-1")
	attacktable.Check(t, "Azure vTPM (server)", "the enrolled VM enrols again with a new kubelet key (no release; the pool re-enrols after release)",
		"403 "+string(attest.ReasonIdentityEnrolled), fetchRefusal(nil, err))

	// Revoked, then released: the VM stays banned under any name.
	for _, args := range [][]string{
		{"revoke", "azure-node-1", "--reason", "VM compromised", "--by", "alice"},
		{"release", "azure-node-1", "--reason", "VM deleted", "--by", "alice"},
	} {
		var stdout, stderr bytes.Buffer
		if code := cli.Run(ctx, append(args, "--state-dir", s.stateDir), &stdout, &stderr); code != 0 {
			t.Fatalf("nodeproof %v: exit %d: %s", args, code, stderr.String())
		}
	}
	_, err = s.attest(t, path, "azure-node-2")
	attacktable.Check(t, "Azure vTPM (server)", "a revoked VM enrols again, after its node's release, under another name",
		"403 "+string(attest.ReasonRevoked), fetchRefusal(nil, err))

	// A TPM without Azure's AK certificate: the agent refuses to go on.
	p, _, _ := s.vm(t, s.ca, "", azuretpmtest.VMOptions{NoCertificate: true})
	_, err = s.attest(t, p, "azure-node-3")
	got := "accepted"
	if errors.Is(err, azuretpm.ErrNotAzure) {
		got = "agent: not an Azure vTPM"
	} else if err != nil {
		got = err.Error()
	}
	attacktable.Check(t, "Azure vTPM (agent)", "a TPM without Azure's AK certificate in NV (not a Trusted Launch vTPM)", "agent: not an Azure vTPM", got)
}

// mustDialAzure opens a channel to vm's TPM.
func mustDialAzure(t *testing.T, vm *azuretpmtest.VM) *tpm.SocketChannel {
	t.Helper()
	ch, err := vm.Dial()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// TestAzureVTPMKubeletCSR: on a deployed cluster (a real API server, the
// example pools, deploy/'s RBAC), an Azure VM's vTPM enrols through the
// agent against nodeproof serve in cluster mode, fetches its config, and
// the kubelet's client CSR, made with the attested key through the
// config's bootstrap kubeconfig, is approved by nodeproof approve with the
// kind's reason, naming the record.
func TestAzureVTPMKubeletCSR(t *testing.T) {
	w := systemtest.New(t, "..", systemtest.Options{Cluster: true})
	s := newAzureSetup(t, []string{"--kubeconfig", w.Admin, "--apiserver-url", w.Config.Host, "--bootstrap-token-dir", w.TokenDir,
		"--cert-store=state-dir", "--token-store=file", "--store", "kubernetes", "--store-namespace", "nodeproof"})
	ctx := context.Background()

	logs := new(testenv.LockedBuffer)
	actx, acancel := context.WithCancel(ctx)
	adone := make(chan error, 1)
	go func() {
		adone <- cli.Approve(actx, cli.ApproveConfig{
			Kubeconfig: w.Approver, StoreNamespace: "nodeproof",
			LeaderElect: true, LeaseNamespace: "nodeproof", Identity: "approver-0",
			QPS: 50, Burst: 100, Clock: time.Now, Log: slog.New(slog.NewJSONHandler(logs, nil)),
		})
	}()
	t.Cleanup(func() {
		acancel()
		if err := <-adone; err != nil {
			t.Errorf("approve: %v", err)
		}
	})

	c, der := s.client(t)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := c.HTTP.Get(s.srv.url + "/config/worker")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server does not serve the worker pool: %v\n%s", err, s.srv.log)
		}
	}

	path, vmID, _ := s.vm(t, s.ca, azuretpmtest.VMID, azuretpmtest.VMOptions{})
	s.document(vmID, nil)
	actx2, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	logFile := filepath.Join(t.TempDir(), "binary_bios_measurements")
	if err := os.WriteFile(logFile, s.log, 0o600); err != nil {
		t.Fatal(err)
	}
	ev, closer, err := agent.Sources()[attest.KindAzureVTPM](actx2, agent.SourceOptions{TPMPath: path, EventLog: logFile, AzureIMDS: s.imds.Client()})
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	vr, err := ev.Attest(actx2, c, "worker", "azure-worker-0", der)
	if err != nil {
		t.Fatalf("the Azure VM's enrolment: %v\n%s", err, s.srv.log)
	}
	served, err := c.FetchConfig(actx2, "worker", vr.ConfigToken)
	if err != nil {
		t.Fatalf("the enrolled VM's fetch: %v", err)
	}

	rc := servedKubeconfig(t, served)
	if _, err := clustertest.WaitWhoAmI(ctx, rc, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	nkc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	key := c.KubeletKey.(*ecdsa.PrivateKey)
	data, err := cert.MakeCSR(key, &pkix.Name{Organization: []string{"system:nodes"}, CommonName: "system:node:" + vr.NodeName}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	name, _, err := csr.RequestCertificate(nkc, data, "", certv1.KubeAPIServerClientKubeletSignerName, nil,
		[]certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, key)
	if err != nil {
		t.Fatal(err)
	}
	want := string(attest.ReasonAttested(attest.KindAzureVTPM))
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, err := w.KC.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) > 0 {
			cond := got.Status.Conditions[0]
			if cond.Type != certv1.CertificateApproved || cond.Reason != want || !strings.Contains(cond.Message, vr.Record) {
				t.Fatalf("CSR decided %s %s: %s; want approved %s naming record %s", cond.Type, cond.Reason, cond.Message, want, vr.Record)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CSR %s not decided\n%s", name, logs)
		}
	}
}
