package systemtest_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/aws/awstest"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/identity/gcevtpm/gcevtpmtest"
	"github.com/nodeproof/nodeproof/identity/nitrotpm"
	"github.com/nodeproof/nodeproof/identity/nitrotpm/nitrotpmtest"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// cloudLog is a real GCE Shielded VM's event log (Ubuntu 21.04, Secure
// Boot off): the firmware log both clouds' vTPMs replay here.
const cloudLog = "ubuntu-2104-no-secure-boot"

// cloudTPMSetup is `nodeproof serve` taking both cloud vTPM kinds, trusting
// a test GCE CA (--gce-vtpm-roots, --gce-vtpm-intermediates-dir) and a
// test Nitro PKI (--nitrotpm-roots) and the AWS setup's Region.
type cloudTPMSetup struct {
	*awsSetup
	srv *cmdServer
	now time.Time
	ca  *gcevtpmtest.CA
	pki *nitrotpmtest.PKI
	man *swtpm.Manufacturer
	log []byte
}

func newCloudTPMSetup(t *testing.T) *cloudTPMSetup {
	t.Helper()
	if err := swtpm.Check(); err != nil {
		t.Fatalf("cloud vTPM tests need swtpm (%s): %v", swtpm.InstallHint, err)
	}
	s := &cloudTPMSetup{awsSetup: newAWSSetup(t, nil), now: time.Now().Truncate(time.Second), log: firmwaretestdata.MustLog(cloudLog)}
	// Pool worker takes both cloud vTPM kinds from the fakes' project, in
	// the test VMs' zone, and account, in us-east-1; any boot components
	// (the log is a real VM's: its digests are what they are).
	s.policy = writePolicy(t, t.TempDir(), policytest.New().Pool("worker",
		policytest.Public().GCEVTPM().Zones("us-central1-a").NitroTPM().Regions("us-east-1")))
	var err error
	if s.ca, err = gcevtpmtest.NewCA(s.now); err != nil {
		t.Fatal(err)
	}
	if s.pki, err = nitrotpmtest.NewPKI(awstest.NewDocument("us-east-1", s.now).InstanceID, "us-east-1", s.now); err != nil {
		t.Fatal(err)
	}
	if s.man, err = swtpm.NewManufacturer(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gceRoot, nitroRoot, inter := filepath.Join(dir, "gce-root.pem"), filepath.Join(dir, "nitro-root.pem"), filepath.Join(dir, "intermediates")
	writePEM(t, gceRoot, s.ca.Root.Raw)
	writePEM(t, nitroRoot, s.pki.Root.Raw)
	if err := os.Mkdir(inter, 0o700); err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(inter, "intermediate.pem"), s.ca.Intermediate.Raw)
	s.srv = s.serve(t, directoryMode, "--gce-vtpm-roots", gceRoot, "--gce-vtpm-intermediates-dir", inter, "--nitrotpm-roots", nitroRoot)
	return s
}

func writePEM(t *testing.T, path string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// client is an agent client of the server with a fresh kubelet key (its
// proof sent with every verify, as the agent does).
func (s *cloudTPMSetup) client(t *testing.T) (*agent.Client, []byte) {
	t.Helper()
	c, err := agent.NewClient(s.srv.url, s.srv.bundle)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubelet.key")
	der, err := agent.KubeletKey(path)
	if err != nil {
		t.Fatal(err)
	}
	c.KubeletKey = ecKey(t, path)
	return c, der
}

// gceVM is a swtpm provisioned as a GCE vTPM of inst, its log in a file
// (what the agent's --event-log names for a swtpm).
func (s *cloudTPMSetup) gceVM(t *testing.T, ca *gcevtpmtest.CA, inst gcevtpm.InstanceInfo, o gcevtpmtest.VMOptions) (path string, vm *gcevtpmtest.VM) {
	t.Helper()
	vm, err := ca.NewVM(context.Background(), s.man, t.TempDir(), s.log, inst, s.now, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vm.Close)
	return "tcp:" + vm.TPM.Addr, vm
}

// logFile writes the boot log for --event-log.
func (s *cloudTPMSetup) logFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "binary_bios_measurements")
	if err := os.WriteFile(f, s.log, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// attestAs runs the agent with evidence kind from the TPM at tpmPath (and
// IMDS, nsm for a NitroTPM), as nodeproof-agent does (agent.Sources), and
// returns the server's answer.
func (s *cloudTPMSetup) attestAs(t *testing.T, kind attest.Kind, o agent.SourceOptions) (*api.VerifyResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o.EventLog = s.logFile(t)
	ev, closer, err := agent.Sources()[kind](ctx, o)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	c, der := s.client(t)
	return ev.Attest(ctx, c, "worker", "", der)
}

// TestGCEVTPMAttacksEndToEnd: a GCE Shielded VM's vTPM, as nodeproof-agent finds
// and uses it, enrols against nodeproof serve under its instance name and
// fetches its config; the server refuses every VM its policy or Google's
// chain does not vouch for, a quote by a key other than the certified one,
// the VM enrolling again with a new key, a replayed verify; the agent
// refuses a vTPM without its AK certificate.
func TestGCEVTPMAttacksEndToEnd(t *testing.T) {
	s := newCloudTPMSetup(t)
	ctx := context.Background()
	inst := gcevtpmtest.Instance("gce-node-1")
	path, vm := s.gceVM(t, s.ca, inst, gcevtpmtest.VMOptions{})

	kind, found, err := agent.DetectEvidence(ctx, agent.DetectOptions{TPMPath: path})
	if err != nil || kind != attest.KindGCEVTPM {
		t.Fatalf("--evidence auto on a GCE vTPM found %q (%s), %v", kind, found, err)
	}
	c, der := s.client(t)
	coll, err := gcevtpm.NewCollector(ctx, mustDial(t, vm), gcevtpm.CollectorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vr, err := agent.GCEVTPMEvidence{Collector: coll}.Attest(ctx, c, "worker", "asked-for", der)
	if err != nil {
		t.Fatalf("the GCE vTPM's enrolment: %v\n%s", err, s.srv.log)
	}
	if vr.NodeName != inst.InstanceName {
		t.Errorf("enrolled as %q, want the instance name %q (not the name asked for)", vr.NodeName, inst.InstanceName)
	}
	if _, err := c.FetchConfig(ctx, "worker", vr.ConfigToken); err != nil {
		t.Fatalf("the enrolled VM's fetch: %v", err)
	}
	// Its re-attestation (every boot, on a timer) passes as a TPM's does.
	c.Purpose = attest.PurposeReattest
	rr, err := agent.GCEVTPMEvidence{Collector: coll}.Attest(ctx, c, "worker", inst.InstanceName, der)
	if err != nil || rr.Reattest == nil || rr.NodeName != inst.InstanceName {
		t.Fatalf("the enrolled VM's re-attestation: %+v, %v", rr, err)
	}

	other := func(f func(*gcevtpm.InstanceInfo)) gcevtpm.InstanceInfo {
		i := gcevtpmtest.Instance("gce-node-2")
		i.InstanceID++
		f(&i)
		return i
	}
	foreign, err := gcevtpmtest.NewCA(s.now)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		attack string
		ca     *gcevtpmtest.CA
		inst   gcevtpm.InstanceInfo
		o      gcevtpmtest.VMOptions
		want   attest.Reason
	}{
		{"a VM of another project, certified by Google", s.ca, other(func(i *gcevtpm.InstanceInfo) { i.ProjectID = "someone-else" }), gcevtpmtest.VMOptions{}, attest.ReasonPolicyProject},
		{"a VM in another zone, certified by Google", s.ca, other(func(i *gcevtpm.InstanceInfo) { i.Zone = "europe-west4-a" }), gcevtpmtest.VMOptions{}, attest.ReasonPolicyZone},
		{"an AK certificate naming a non-production instance (isProduction false)", s.ca, other(func(i *gcevtpm.InstanceInfo) { i.IsProduction = false }), gcevtpmtest.VMOptions{}, attest.ReasonNotProduction},
		{"an AK certificate without the instance extension", s.ca, other(func(*gcevtpm.InstanceInfo) {}), gcevtpmtest.VMOptions{Cert: gcevtpmtest.Cert{NoExtension: true}}, attest.ReasonInstanceInfoMissing},
		{"an expired AK certificate", s.ca, other(func(*gcevtpm.InstanceInfo) {}), gcevtpmtest.VMOptions{Cert: gcevtpmtest.Cert{NotBefore: s.now.AddDate(-2, 0, 0), NotAfter: s.now.AddDate(-1, 0, 0)}}, attest.ReasonAKCertExpired},
		{"an AK certificate from a CA with Google's names and other keys", foreign, other(func(*gcevtpm.InstanceInfo) {}), gcevtpmtest.VMOptions{}, attest.ReasonAKCertUntrusted},
	} {
		p, _ := s.gceVM(t, tc.ca, tc.inst, tc.o)
		_, err := s.attestAs(t, attest.KindGCEVTPM, agent.SourceOptions{TPMPath: p})
		attacktable.Check(t, "GCE vTPM (server)", tc.attack, "403 "+string(tc.want), fetchRefusal(nil, err))
	}

	// A quote by another VM's AK, sent with this VM's certificate: the
	// certificate vouches for a key that did not quote.
	_, vm2 := s.gceVM(t, s.ca, other(func(*gcevtpm.InstanceInfo) {}), gcevtpmtest.VMOptions{})
	coll2, err := gcevtpm.NewCollector(ctx, mustDial(t, vm2), gcevtpm.CollectorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	impostor, impostorKey := s.client(t)
	impostor.Purpose = attest.PurposeReattest
	_, err = agent.GCEVTPMEvidence{Collector: coll2}.Attest(ctx, impostor, "worker", inst.InstanceName, impostorKey)
	attacktable.Check(t, "GCE vTPM (server)", "another Google-certified VM of the project re-attests as the enrolled VM's node",
		"403 "+string(attest.ReasonNodeNameTaken), fetchRefusal(nil, err))
	attacker, key := s.client(t)
	var ch api.ChallengeResponse
	post(t, attacker, api.PathChallenge, api.ChallengeRequest{Kind: attest.KindGCEVTPM, Pool: "worker", KubeletPublicKey: key, Request: api.Message(coll2.Request())}, &ch)
	var gc gcevtpm.Challenge
	if err := json.Unmarshal(ch.Challenge, &gc); err != nil {
		t.Fatal(err)
	}
	keySHA, _ := attest.KeySHA256(key)
	ev2, err := coll2.Answer(&gc, keySHA)
	if err != nil {
		t.Fatal(err)
	}
	ev1, err := coll.Answer(&gc, keySHA)
	if err != nil {
		t.Fatal(err)
	}
	byOther := *ev1
	byOther.Quote = ev2.Quote
	attacktable.Check(t, "GCE vTPM (server)", "a VM's AK and certificate sent with a quote by another VM's AK",
		"403 "+string(attest.ReasonQuoteSignature), refusal(postRaw(t, attacker, api.PathVerify, api.VerifyRequest{Session: ch.Session, Kind: attest.KindGCEVTPM, Evidence: api.Message(&byOther)})))
	ev2.AKCertificate, ev2.Intermediates = ev1.AKCertificate, ev1.Intermediates
	attacktable.Check(t, "GCE vTPM (server)", "a VM's AK and quote sent with another VM's AK certificate",
		"403 "+string(attest.ReasonAKCertKeyMismatch), refusal(postRaw(t, attacker, api.PathVerify, api.VerifyRequest{Session: ch.Session, Kind: attest.KindGCEVTPM, Evidence: api.Message(ev2)})))
	attacktable.Check(t, "GCE vTPM (server)", "a GCE vTPM session answered as another kind (its evidence under \"tpm\", read strictly as a TPM's)",
		"400 "+string(attest.ReasonMalformedRequest), refusal(postRaw(t, attacker, api.PathVerify, api.VerifyRequest{Session: ch.Session, Kind: attest.KindTPM, Evidence: api.Message(ev1)})))
	attacktable.Check(t, "GCE vTPM (server)", "a GCE vTPM session answered with a bare-metal TPM's evidence",
		"400 "+string(attest.ReasonMalformed), refusal(postRaw(t, attacker, api.PathVerify, api.VerifyRequest{Session: ch.Session, Kind: attest.KindTPM, Evidence: api.Message(&tpm.Evidence{})})))
	coll.Close()
	coll2.Close()

	// The same VM again, a new kubelet key (a reinstall, or root on it).
	_, err = s.attestAs(t, attest.KindGCEVTPM, agent.SourceOptions{TPMPath: path})
	attacktable.Check(t, "GCE vTPM (server)", "the enrolled VM enrols again with a new kubelet key (no release; the pool re-enrols after release)",
		"403 "+string(attest.ReasonIdentityEnrolled), fetchRefusal(nil, err))

	// A vTPM whose AK has no certificate: the agent refuses to go on.
	p, _ := s.gceVM(t, s.ca, other(func(*gcevtpm.InstanceInfo) {}), gcevtpmtest.VMOptions{NoCertificate: true})
	_, err = s.attestAs(t, attest.KindGCEVTPM, agent.SourceOptions{TPMPath: p})
	got := "accepted"
	if errors.Is(err, gcevtpm.ErrNoCertificate) {
		got = "agent: no AK certificate"
	} else if err != nil {
		got = err.Error()
	}
	attacktable.Check(t, "GCE vTPM (agent)", "a vTPM whose AK has no certificate in NV (an older VM)", "agent: no AK certificate", got)
}

// mustDial opens a channel to vm's TPM.
func mustDial(t *testing.T, vm *gcevtpmtest.VM) *tpm.SocketChannel {
	t.Helper()
	ch, err := vm.Dial()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// nitroInstance is an EC2 instance with a NitroTPM: a swtpm with the
// SHA-384 bank booted from the cloud log, its IMDS serving doc.
type nitroInstance struct {
	doc  awstest.Document
	tpm  *tpm.SocketChannel // the collector's and the fake NSM's (swtpm serves one connection)
	imds *awstest.IMDS
}

func (s *cloudTPMSetup) nitroInstance(t *testing.T, doc awstest.Document) *nitroInstance {
	t.Helper()
	state := filepath.Join(t.TempDir(), "tpm")
	if err := s.man.Provision(context.Background(), state, "sha256,sha384"); err != nil {
		t.Fatal(err)
	}
	p, err := swtpm.Start(context.Background(), state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	ch, err := tpm.DialSocket("tcp", p.Addr, s.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	if _, err := tpmtest.ExtendLog(ch, s.log); err != nil {
		t.Fatal(err)
	}
	files, err := s.region.Files(doc)
	if err != nil {
		t.Fatal(err)
	}
	md := awstest.NewIMDS(files)
	t.Cleanup(md.Close)
	return &nitroInstance{doc: doc, tpm: ch, imds: md}
}

// evidence is the agent's NitroTPM evidence on the instance, its NSM a
// fake that signs with the test PKI (the instance's module); swap, when
// set, changes each document before it is signed. The collector and the
// NSM share the instance's channel, as the NitroTPM's vendor command
// shares the TPM.
func (s *cloudTPMSetup) evidence(t *testing.T, in *nitroInstance, swap func(*nitrotpmtest.Payload)) agent.NitroTPMEvidence {
	t.Helper()
	pki, err := s.pki.ForInstance(in.doc.InstanceID, s.now)
	if err != nil {
		t.Fatal(err)
	}
	coll, err := nitrotpm.NewCollector(keepOpen{in.tpm}, &nitrotpmtest.NSM{PKI: pki, TPM: in.tpm, Clock: time.Now, Swap: swap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coll.Close() })
	return agent.NitroTPMEvidence{Collector: coll, IMDS: in.imds.Client()}
}

// keepOpen keeps a shared channel open when a collector closes.
type keepOpen struct{ *tpm.SocketChannel }

func (keepOpen) Close() error { return nil }

// attestNitro runs the agent's NitroTPM attestation with ev.
func (s *cloudTPMSetup) attestNitro(t *testing.T, ev agent.NitroTPMEvidence) (*api.VerifyResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, der := s.client(t)
	return ev.Attest(ctx, c, "worker", "asked-for", der)
}

// TestNitroTPMAttacksEndToEnd: an EC2 instance's NitroTPM, through the agent
// (a fake NSM speaking the hypervisor's bytes), enrols against nodeproof
// serve under its private DNS name and fetches its config; the server
// refuses documents with another nonce, key or PCRs, an instance of an
// account its policy does not list, and a document replayed into another
// session or with its own after delivery.
func TestNitroTPMAttacksEndToEnd(t *testing.T) {
	s := newCloudTPMSetup(t)
	ctx := context.Background()
	doc := awstest.NewDocument("us-east-1", s.now.Add(-2*time.Hour))
	in := s.nitroInstance(t, doc)

	c, der := s.client(t)
	vr, err := s.evidence(t, in, nil).Attest(ctx, c, "worker", "asked-for", der)
	if err != nil {
		t.Fatalf("the NitroTPM's enrolment: %v\n%s", err, s.srv.log)
	}
	if want := aws.PrivateDNSName("us-east-1", doc.PrivateIP); vr.NodeName != want {
		t.Errorf("enrolled as %q, want the private DNS name %q", vr.NodeName, want)
	}
	if _, err := c.FetchConfig(ctx, "worker", vr.ConfigToken); err != nil {
		t.Fatalf("the enrolled instance's fetch: %v", err)
	}
	_, err = s.attestNitro(t, s.evidence(t, in, nil))
	attacktable.Check(t, "NitroTPM (server)", "the enrolled instance enrols again with a new kubelet key (no release; the pool re-enrols after release)",
		"403 "+string(attest.ReasonIdentityEnrolled), fetchRefusal(nil, err))

	// Documents the NSM makes otherwise; another instance each, so that
	// only the document decides.
	n := 0
	instance := func(f func(*awstest.Document)) *nitroInstance {
		n++
		d := doc
		d.PrivateIP, d.InstanceID = fmt.Sprintf("10.0.9.%d", n), fmt.Sprintf("i-0a1b2c3d4e5f6%04x", n)
		f(&d)
		return s.nitroInstance(t, d)
	}
	for _, tc := range []struct {
		attack string
		doc    func(*awstest.Document)
		swap   func(*nitrotpmtest.Payload)
		want   attest.Reason
	}{
		{"a Nitro document carrying another nonce", func(*awstest.Document) {}, func(p *nitrotpmtest.Payload) { p.Nonce = make([]byte, 32) }, attest.ReasonNitroDocNonce},
		{"a Nitro document carrying another public key than the AK", func(*awstest.Document) {}, func(p *nitrotpmtest.Payload) { p.PublicKey = s.pki.Root.RawSubjectPublicKeyInfo }, attest.ReasonNitroDocKey},
		{"a Nitro document whose PCR 4 differs from the quoted one", func(*awstest.Document) {}, func(p *nitrotpmtest.Payload) {
			p.NitroTPMPCRs[4] = append([]byte(nil), p.NitroTPMPCRs[4]...)
			p.NitroTPMPCRs[4][0] ^= 1
		}, attest.ReasonNitroPCRs},
		{"an instance of an account the pool does not list", func(d *awstest.Document) { d.AccountID = "444455556666" }, nil, attest.ReasonPolicyAccount},
	} {
		_, err := s.attestNitro(t, s.evidence(t, instance(tc.doc), tc.swap))
		attacktable.Check(t, "NitroTPM (server)", tc.attack, "403 "+string(tc.want), fetchRefusal(nil, err))
	}

	// A genuine instance's evidence, replayed: into another session, and
	// with its own once its config was delivered.
	replayed := instance(func(*awstest.Document) {})
	coll := s.evidence(t, replayed, nil).Collector
	id, err := aws.Collect(ctx, replayed.imds.Client())
	if err != nil {
		t.Fatal(err)
	}
	honest, key := s.client(t)
	keySHA, _ := attest.KeySHA256(key)
	challenge := func(c *agent.Client) (string, *nitrotpm.Challenge) {
		var ch api.ChallengeResponse
		post(t, c, api.PathChallenge, api.ChallengeRequest{Kind: attest.KindNitroTPM, Pool: "worker", KubeletPublicKey: key, Request: api.Message(coll.Request())}, &ch)
		var nc nitrotpm.Challenge
		if err := json.Unmarshal(ch.Challenge, &nc); err != nil {
			t.Fatal(err)
		}
		return ch.Session, &nc
	}
	session, nc := challenge(honest)
	nev, err := coll.Answer(nc, keySHA, *id)
	if err != nil {
		t.Fatal(err)
	}
	genuine := api.VerifyRequest{Session: session, Kind: attest.KindNitroTPM, Evidence: api.Message(nev)}
	var gvr api.VerifyResponse
	post(t, honest, api.PathVerify, genuine, &gvr)
	if _, err := honest.FetchConfig(ctx, "worker", gvr.ConfigToken); err != nil {
		t.Fatal(err)
	}
	thief, _ := s.client(t)
	other, _ := challenge(thief)
	into := genuine
	into.Session = other
	attacktable.Check(t, "NitroTPM (server)", "a genuine instance's document and quote replayed into another session",
		"403 "+string(attest.ReasonNitroDocNonce), refusal(postRaw(t, thief, api.PathVerify, into)))
	attacktable.Check(t, "NitroTPM (server)", "a genuine instance's document replayed with its own session after its config was delivered",
		"403 "+string(attest.ReasonSessionReused), refusal(postRaw(t, thief, api.PathVerify, genuine)))
}
