package simtpm

import (
	"bytes"
	"context"
	"crypto"
	"os"
	"sync"
	"testing"
	"time"

	legacy "github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpmutil"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/internal/testenv"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// The model against a real TPM: swtpm (libtpms), provisioned by a
// manufacturer CA, booted from the same log, driven by attest/tpm's
// go-attestation collector.

var (
	manOnce sync.Once
	man     *swtpm.Manufacturer
	manErr  error
	manDir  string
)

// TestMain removes the manufacturer's CA directory after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if manDir != "" {
		os.RemoveAll(manDir)
	}
	os.Exit(code)
}

func manufacturer(t *testing.T) *swtpm.Manufacturer {
	t.Helper()
	manOnce.Do(func() {
		if manDir, manErr = os.MkdirTemp("", "nodeproof-simtpm-ca-"); manErr == nil {
			man, manErr = swtpm.NewManufacturer(manDir)
		}
	})
	if manErr != nil {
		t.Fatalf("swtpm manufacturer: %v", manErr)
	}
	return man
}

// realTPM is a swtpm machine whose command channel the test can also use
// directly, between the collector's commands.
type realTPM struct {
	ch        *tpm.SocketChannel
	collector *tpm.Collector
}

func newRealTPM(t *testing.T, log []byte) *realTPM {
	t.Helper()
	ctx := context.Background()
	state := t.TempDir()
	if err := manufacturer(t).Provision(ctx, state); err != nil {
		t.Fatal(err)
	}
	p, err := swtpm.Start(ctx, state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	ch, err := tpm.DialSocket("tcp", p.Addr, log)
	if err != nil {
		t.Fatal(err)
	}
	if len(log) > 0 {
		if _, err := tpmtest.ExtendLog(ch, log); err != nil {
			t.Fatal(err)
		}
	}
	c, err := tpm.NewCollector(ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &realTPM{ch: ch, collector: c}
}

func (r *realTPM) readPublic(t *testing.T, h tpmutil.Handle) *tpm2.ReadPublicResponse {
	t.Helper()
	rsp, err := tpm2.ReadPublic{ObjectHandle: tpm2.TPMHandle(h)}.Execute(transport.FromReadWriter(r.ch))
	if err != nil {
		t.Fatalf("ReadPublic %#x: %v", h, err)
	}
	return rsp
}

func (r *realTPM) pcrs(t *testing.T, bank legacy.Algorithm) [][]byte {
	t.Helper()
	out := make([][]byte, numPCRs)
	for i := range out {
		v, err := legacy.ReadPCR(r.ch, i, bank)
		if err != nil {
			t.Fatalf("read PCR %d: %v", i, err)
		}
		out[i] = v
	}
	return out
}

func swtpmVerifier(t *testing.T) *tpm.Verifier {
	t.Helper()
	dir, err := manufacturer(t).RootsDir()
	if err != nil {
		t.Fatal(err)
	}
	set, err := tpm.LoadRootSet("swtpm-localca", dir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tpm.NewVerifier(tpm.Options{Roots: []tpm.RootSet{set}, Clock: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// withoutUnique is a TPMT_PUBLIC with its unique field emptied of
// content (its size kept).
func withoutUnique(t *testing.T, raw []byte) []byte {
	t.Helper()
	p, err := tpm2.Unmarshal[tpm2.TPMTPublic](raw)
	if err != nil {
		t.Fatal(err)
	}
	switch p.Type {
	case tpm2.TPMAlgRSA:
		n, err := p.Unique.RSA()
		if err != nil {
			t.Fatal(err)
		}
		p.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgRSA, &tpm2.TPM2BPublicKeyRSA{Buffer: make([]byte, len(n.Buffer))})
	case tpm2.TPMAlgECC:
		pt, err := p.Unique.ECC()
		if err != nil {
			t.Fatal(err)
		}
		p.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: make([]byte, len(pt.X.Buffer))},
			Y: tpm2.TPM2BECCParameter{Buffer: make([]byte, len(pt.Y.Buffer))},
		})
	}
	return tpm2.Marshal(p)
}

// zero keeps b's size and algorithm prefix (names) or size (digests) and
// drops its value.
func zeroName(b []byte) []byte {
	z := make([]byte, len(b))
	copy(z, b[:min(2, len(b))])
	return z
}

// attestLayout is a TPMS_ATTEST with every value that differs between two
// TPMs or two calls (clock, boot count, signer's and object's name
// digests, qualifying data, creation hash) zeroed but sizes, tags and
// algorithm identifiers kept. The restart count, safe flag and firmware
// version (libtpms's, which the model reports) and the quote's PCR
// selection and digest are kept whole.
func attestLayout(t *testing.T, raw []byte) []byte {
	t.Helper()
	a, err := tpm2.Unmarshal[tpm2.TPMSAttest](raw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tpm2.Marshal(a), raw) {
		t.Fatal("TPMS_ATTEST does not round-trip through go-tpm")
	}
	a.QualifiedSigner.Buffer = zeroName(a.QualifiedSigner.Buffer)
	a.ExtraData.Buffer = make([]byte, len(a.ExtraData.Buffer))
	a.ClockInfo.Clock, a.ClockInfo.ResetCount = 0, 0
	switch a.Type {
	case tpm2.TPMSTAttestCreation:
		ci, err := a.Attested.Creation()
		if err != nil {
			t.Fatal(err)
		}
		ci.ObjectName.Buffer = zeroName(ci.ObjectName.Buffer)
		ci.CreationHash.Buffer = make([]byte, len(ci.CreationHash.Buffer))
		a.Attested = tpm2.NewTPMUAttest(tpm2.TPMSTAttestCreation, ci)
	case tpm2.TPMSTAttestQuote:
	default:
		t.Fatalf("attestation type %#x", a.Type)
	}
	return tpm2.Marshal(a)
}

func creationLayout(t *testing.T, raw []byte) []byte {
	t.Helper()
	cd, err := tpm2.Unmarshal[tpm2.TPMSCreationData](raw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tpm2.Marshal(cd), raw) {
		t.Fatal("TPMS_CREATION_DATA does not round-trip through go-tpm")
	}
	cd.ParentName.Buffer = zeroName(cd.ParentName.Buffer)
	cd.ParentQualifiedName.Buffer = zeroName(cd.ParentQualifiedName.Buffer)
	return tpm2.Marshal(cd)
}

func signatureForm(t *testing.T, raw []byte) (alg, hash tpm2.TPMAlgID, r, s int) {
	t.Helper()
	sig, err := tpm2.Unmarshal[tpm2.TPMTSignature](raw)
	if err != nil {
		t.Fatal(err)
	}
	ecc, err := sig.Signature.ECDSA()
	if err != nil {
		t.Fatal(err)
	}
	return sig.SigAlg, ecc.Hash, len(ecc.SignatureR.Buffer), len(ecc.SignatureS.Buffer)
}

// TestEquivalenceWithSwtpm compares, field by field, what the model and a
// swtpm booted from the same log produce for the same exchange.
func TestEquivalenceWithSwtpm(t *testing.T) {
	for _, name := range []string{"rhel8-uefi", "ubuntu-2104-no-secure-boot", "cos-125-intel-tdx-secure-boot"} {
		t.Run(name, func(t *testing.T) { equivalence(t, firmwaretestdata.MustLog(name)) })
	}
}

func equivalence(t *testing.T, log []byte) {
	ca := newVendor(t)
	model := newModel(t, ca, log)
	real := newRealTPM(t, log)
	key := testenv.KubeletKeySHA256(t)

	// PCRs after the same log: byte for byte, both banks, all 24.
	for _, bank := range []struct {
		h   crypto.Hash
		alg legacy.Algorithm
	}{{crypto.SHA1, legacy.AlgSHA1}, {crypto.SHA256, legacy.AlgSHA256}} {
		want, got := real.pcrs(t, bank.alg), model.PCRs(bank.h)
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Errorf("%v PCR %d: model %x, swtpm %x", bank.h, i, got[i], want[i])
			}
		}
	}

	// The EK: the TCG default template (attributes, policy, parameters).
	ekReal := real.readPublic(t, 0x81010001)
	if a, b := withoutUnique(t, model.ekPublic), withoutUnique(t, ekReal.OutPublic.Bytes()); !bytes.Equal(a, b) {
		t.Errorf("EK public area (but unique) differs:\nmodel %x\nswtpm %x", a, b)
	}

	mv, rv := modelVerifier(t, ca), swtpmVerifier(t)
	mr := honestRun(t, model, mv, key)
	rr := honestRun(t, real.collector, rv, key)

	// The AK: go-attestation's template, all but the public point.
	if a, b := withoutUnique(t, mr.req.AK.Public), withoutUnique(t, rr.req.AK.Public); !bytes.Equal(a, b) {
		t.Errorf("AK public area (but unique) differs:\nmodel %x\nswtpm %x", a, b)
	}
	// The SRK go-attestation made, as the AK's parent.
	srkReal := real.readPublic(t, 0x81000002)
	if a, b := withoutUnique(t, model.srkPublic), withoutUnique(t, srkReal.OutPublic.Bytes()); !bytes.Equal(a, b) {
		t.Errorf("SRK public area (but unique) differs:\nmodel %x\nswtpm %x", a, b)
	}

	// Creation data and creation attestation: same layout; and the
	// model's name arithmetic reproduces the real TPM's names.
	if a, b := creationLayout(t, mr.req.AK.CreateData), creationLayout(t, rr.req.AK.CreateData); !bytes.Equal(a, b) {
		t.Errorf("creation data layout differs:\nmodel %x\nswtpm %x", a, b)
	}
	if a, b := attestLayout(t, mr.req.AK.CreateAttestation), attestLayout(t, rr.req.AK.CreateAttestation); !bytes.Equal(a, b) {
		t.Errorf("creation attestation layout differs:\nmodel %x\nswtpm %x", a, b)
	}
	cd, err := tpm2.Unmarshal[tpm2.TPMSCreationData](rr.req.AK.CreateData)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(cd.ParentName.Buffer, srkReal.Name.Buffer) || !bytes.Equal(cd.ParentQualifiedName.Buffer, srkReal.QualifiedName.Buffer) {
		t.Error("swtpm's creation data does not name its SRK")
	}
	if !bytes.Equal(qualifiedName(tpm2.HandleName(tpm2.TPMRHEndorsement).Buffer, srkReal.Name.Buffer), srkReal.QualifiedName.Buffer) {
		t.Error("the model's qualified-name formula does not give swtpm's SRK qualified name")
	}
	realAK, err := tpm2.Unmarshal[tpm2.TPMTPublic](rr.req.AK.Public)
	if err != nil {
		t.Fatal(err)
	}
	realAKName, err := objectName(*realAK)
	if err != nil {
		t.Fatal(err)
	}
	realCreation, err := tpm2.Unmarshal[tpm2.TPMSAttest](rr.req.AK.CreateAttestation)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(qualifiedName(srkReal.QualifiedName.Buffer, realAKName), realCreation.QualifiedSigner.Buffer) {
		t.Error("the model's qualified-signer formula does not give swtpm's")
	}
	if a1, h1, r1, s1 := signatureForm(t, mr.req.AK.CreateSignature); true {
		a2, h2, r2, s2 := signatureForm(t, rr.req.AK.CreateSignature)
		if a1 != a2 || h1 != h2 || r1 != 32 || s1 != 32 || r2 > 32 || s2 > 32 {
			t.Errorf("creation signature: model %#x/%#x r%d s%d, swtpm %#x/%#x r%d s%d", a1, h1, r1, s1, a2, h2, r2, s2)
		}
	}

	// The quote: same layout, and with the same PCRs the same quoted
	// selection and digest, byte for byte.
	if len(mr.ev.Quotes) != 1 || len(rr.ev.Quotes) != 1 {
		t.Fatalf("quotes: model %d, swtpm %d; want 1 each", len(mr.ev.Quotes), len(rr.ev.Quotes))
	}
	mq, rq := mr.ev.Quotes[0], rr.ev.Quotes[0]
	if a, b := attestLayout(t, mq.Quote), attestLayout(t, rq.Quote); !bytes.Equal(a, b) {
		t.Errorf("quote layout differs:\nmodel %x\nswtpm %x", a, b)
	}
	if a1, h1, _, _ := signatureForm(t, mq.Signature); true {
		if a2, h2, _, _ := signatureForm(t, rq.Signature); a1 != a2 || h1 != h2 {
			t.Errorf("quote signature scheme: model %#x/%#x, swtpm %#x/%#x", a1, h1, a2, h2)
		}
	}
	// The evidence around it.
	if len(mr.ev.PCRs) != len(rr.ev.PCRs) {
		t.Fatalf("PCR values sent: model %d, swtpm %d", len(mr.ev.PCRs), len(rr.ev.PCRs))
	}
	for i := range mr.ev.PCRs {
		a, b := mr.ev.PCRs[i], rr.ev.PCRs[i]
		if a.Index != b.Index || a.Bank != b.Bank || !bytes.Equal(a.Digest, b.Digest) {
			t.Errorf("PCR value %d: model %d/%s/%x, swtpm %d/%s/%x", i, a.Index, a.Bank, a.Digest, b.Index, b.Bank, b.Digest)
		}
	}
	if !bytes.Equal(mr.ev.EventLog, rr.ev.EventLog) || len(mr.ev.ActivationSecret) != len(rr.ev.ActivationSecret) {
		t.Error("event log or activation secret differ in form")
	}
	if len(mr.req.EKCertificate) == 0 || len(rr.req.EKCertificate) == 0 {
		t.Error("an EK certificate is missing")
	}

	// Both verify, with the same claims about the boot.
	mc, err := mv.Verify(mr.sess, mr.ev)
	if err != nil {
		t.Fatalf("model refused: %v", err)
	}
	rc, err := rv.Verify(rr.sess, rr.ev)
	if err != nil {
		t.Fatalf("swtpm refused: %v", err)
	}
	if a, b := mc.TPM.PCRs, rc.TPM.PCRs; len(a) != len(b) {
		t.Errorf("claimed PCRs: model %d, swtpm %d", len(a), len(b))
	} else {
		for k := range a {
			if a[k] != b[k] {
				t.Errorf("claimed PCR %d: model %s, swtpm %s", k, a[k], b[k])
			}
		}
	}
	if a, b := mc.TPM.Boot.SecureBoot, rc.TPM.Boot.SecureBoot; a != b || mc.TPM.Boot.LogEvents != rc.TPM.Boot.LogEvents || mc.TPM.Boot.KernelCmdline != rc.TPM.Boot.KernelCmdline {
		t.Errorf("boot claims differ: model %+v, swtpm %+v", mc.TPM.Boot, rc.TPM.Boot)
	}
}

// node is a machine under attack, model or swtpm, with its verifier.
type node struct {
	tpm agent.TPM
	v   *tpm.Verifier
	key []byte
	// other is a second machine of the same kind (the victim of identity
	// theft).
	other agent.TPM
}

func cloneEvidence(e *tpm.Evidence) *tpm.Evidence {
	c := *e
	c.ActivationSecret = bytes.Clone(e.ActivationSecret)
	c.Quotes = append([]tpm.Quote(nil), e.Quotes...)
	for i := range c.Quotes {
		c.Quotes[i].Quote = bytes.Clone(c.Quotes[i].Quote)
		c.Quotes[i].Signature = bytes.Clone(c.Quotes[i].Signature)
	}
	c.PCRs = append([]tpm.PCR(nil), e.PCRs...)
	for i := range c.PCRs {
		c.PCRs[i].Digest = bytes.Clone(c.PCRs[i].Digest)
	}
	return &c
}

// attacks are refusals that must come out the same for the model and for
// a real TPM.
var attacks = []struct {
	name   string
	want   attest.Reason
	attack func(t *testing.T, n node) error
}{
	{"quote tampered", attest.ReasonQuoteSignature, func(t *testing.T, n node) error {
		r := honestRun(t, n.tpm, n.v, n.key)
		ev := cloneEvidence(r.ev)
		ev.Quotes[0].Quote[len(ev.Quotes[0].Quote)-1] ^= 1 // the PCR digest
		_, err := n.v.Verify(r.sess, ev)
		return err
	}},
	{"quote signature tampered", attest.ReasonQuoteSignature, func(t *testing.T, n node) error {
		r := honestRun(t, n.tpm, n.v, n.key)
		ev := cloneEvidence(r.ev)
		ev.Quotes[0].Signature[10] ^= 1
		_, err := n.v.Verify(r.sess, ev)
		return err
	}},
	{"wrong kubelet key", attest.ReasonKubeletKey, func(t *testing.T, n node) error {
		// The session is for another kubelet key; the machine binds its own.
		req, err := n.tpm.Request()
		if err != nil {
			t.Fatal(err)
		}
		ch, sess, err := n.v.Challenge("worker", testenv.KubeletKeySHA256(t), req)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := n.tpm.Answer(ch, n.key)
		if err != nil {
			t.Fatal(err)
		}
		_, err = n.v.Verify(sess, ev)
		return err
	}},
	{"quote replayed with another nonce", attest.ReasonQuoteBinding, func(t *testing.T, n node) error {
		first := honestRun(t, n.tpm, n.v, n.key)
		second := honestRun(t, n.tpm, n.v, n.key)
		old := cloneEvidence(first.ev)
		old.ActivationSecret = second.ev.ActivationSecret
		_, err := n.v.Verify(second.sess, old)
		return err
	}},
	{"PCR value changed", attest.ReasonQuotePCRDigest, func(t *testing.T, n node) error {
		r := honestRun(t, n.tpm, n.v, n.key)
		ev := cloneEvidence(r.ev)
		ev.PCRs[7].Digest[0] ^= 1
		_, err := n.v.Verify(r.sess, ev)
		return err
	}},
	{"event log of another machine", attest.ReasonEventLogReplay, func(t *testing.T, n node) error {
		r := honestRun(t, n.tpm, n.v, n.key)
		ev := cloneEvidence(r.ev)
		ev.EventLog = firmwaretestdata.MustLog("ubuntu-2104-no-secure-boot")
		_, err := n.v.Verify(r.sess, ev)
		return err
	}},
	{"AK creation attestation tampered", attest.ReasonAKCreation, func(t *testing.T, n node) error {
		req, err := n.tpm.Request()
		if err != nil {
			t.Fatal(err)
		}
		req.AK.CreateAttestation = bytes.Clone(req.AK.CreateAttestation)
		req.AK.CreateAttestation[len(req.AK.CreateAttestation)-1] ^= 1
		_, _, err = n.v.Challenge("worker", n.key, req)
		return err
	}},
	{"EK certificate of another TPM", attest.ReasonEKMismatch, func(t *testing.T, n node) error {
		req, err := n.tpm.Request()
		if err != nil {
			t.Fatal(err)
		}
		victim, err := n.other.Request()
		if err != nil {
			t.Fatal(err)
		}
		req.EKCertificate = victim.EKCertificate
		_, _, err = n.v.Challenge("worker", n.key, req)
		return err
	}},
	{"activation with another EK", attest.ReasonActivation, func(t *testing.T, n node) error {
		// The attacker presents a victim's genuine EK and certificate with
		// its own AK: the challenge passes, but only the victim's TPM could
		// activate the credential, and it does not hold the attacker's AK.
		own, err := n.tpm.Request()
		if err != nil {
			t.Fatal(err)
		}
		victim, err := n.other.Request()
		if err != nil {
			t.Fatal(err)
		}
		forged := *victim
		forged.AK = own.AK
		ch, sess, err := n.v.Challenge("worker", n.key, &forged)
		if err != nil {
			t.Fatalf("challenge refused early (%v); the attack is only caught at activation", err)
		}
		if _, err := n.tpm.Answer(ch, n.key); err == nil {
			t.Fatal("a credential made for another EK was activated")
		}
		if _, err := n.other.Answer(ch, n.key); err == nil {
			t.Fatal("the victim activated a credential for an AK it does not hold")
		}
		// It sends evidence anyway: a guessed secret, its own quote.
		r := honestRun(t, n.tpm, n.v, n.key)
		ev := cloneEvidence(r.ev)
		ev.ActivationSecret = make([]byte, 32)
		_, err = n.v.Verify(sess, ev)
		return err
	}},
}

// TestRefusalsSameAsSwtpm runs each attack against a model machine and a
// swtpm machine: the verifier must refuse both with the same reason.
func TestRefusalsSameAsSwtpm(t *testing.T) {
	log := firmwaretestdata.MustLog("rhel8-uefi")
	ca := newVendor(t)
	key := testenv.KubeletKeySHA256(t)
	nodes := map[string]node{
		"model": {tpm: newModel(t, ca, log), other: newModel(t, ca, log), v: modelVerifier(t, ca), key: key},
		"swtpm": {tpm: newRealTPM(t, log).collector, other: newRealTPM(t, log).collector, v: swtpmVerifier(t), key: key},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			got := map[string]attest.Reason{}
			for _, kind := range []string{"swtpm", "model"} {
				err := a.attack(t, nodes[kind])
				if err == nil {
					t.Fatalf("%s: accepted; want %s", kind, a.want)
				}
				r, ok := attest.ReasonOf(err)
				if !ok {
					t.Fatalf("%s: refused without a reason: %v", kind, err)
				}
				got[kind] = r
			}
			if got["model"] != got["swtpm"] || got["model"] != a.want {
				t.Errorf("model %s, swtpm %s; want %s for both", got["model"], got["swtpm"], a.want)
			}
		})
	}
}
