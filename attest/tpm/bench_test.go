package tpm_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"io"
	"strings"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// recorded is one real attestation from the simulator (a real RHEL 8 log
// extended into it), recorded once and verified many times.
type recorded struct {
	ca   *tpmtest.VendorCA
	req  *tpm.ChallengeRequest
	sess *attest.Session
	ev   *tpm.Evidence
	key  []byte
	pol  *policy.Policy
}

var rec *recorded

// record makes the recording on first use; the simulator is released
// before any timing starts.
func record(b *testing.B) *recorded {
	if rec != nil {
		return rec
	}
	ca, err := tpmtest.NewVendorCA("Vendor", testNow)
	if err != nil {
		b.Fatal(err)
	}
	m := newMachine(b, ca, firmwaretestdata.MustLog("rhel8-uefi"))
	v, err := tpm.NewVerifier(tpm.Options{Roots: testRootSets(ca), Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	req, err := m.collector.Request()
	if err != nil {
		b.Fatal(err)
	}
	ch, sess, err := v.Challenge("worker", m.keySHA, req)
	if err != nil {
		b.Fatal(err)
	}
	ev, err := m.collector.Answer(ch, m.keySHA)
	if err != nil {
		b.Fatal(err)
	}
	m.close()
	pol := workerPolicy(b)
	rec = &recorded{ca: ca, req: req, sess: sess, ev: ev, key: m.keySHA, pol: pol}
	return rec
}

// BenchmarkTPMAttestation measures the whole server side of one TPM
// attestation (full) and, in the same run, the cryptography it cannot
// avoid (floor). `make bench-tpm` reports full/floor; the target is 2x.
//
// full: step one (EK certificate chain, AK checks, credential generation,
// nonce) with a fresh verifier's warm intermediate cache, step two
// (activation compare, quote, replay of the real 82-event RHEL 8 log, boot
// state) and policy.
//
// floor: one EK-certificate signature verify (the issuing CA is verified
// once and remembered, as the verifier does), the AK creation signature
// verify, the quote signature verify, RSA-OAEP encryption of the seed to
// the EK, SHA-256 over the whole event log, one PCR extend (SHA-256 of
// PCR ‖ digest) per replayed event, and 64 random bytes.
func BenchmarkTPMAttestation(b *testing.B) {
	r := record(b)
	b.Run("full", func(b *testing.B) {
		v, err := tpm.NewVerifier(tpm.Options{Roots: testRootSets(r.ca), Clock: clock})
		if err != nil {
			b.Fatal(err)
		}
		verifyLoop(b, v, r, r.pol)
	})
	// The policy `policy learn` writes from the machine's log: the whole
	// boot judged (its chain's signers, the command line, the files GRUB
	// read and its 54 commands).
	b.Run("full-learned", func(b *testing.B) {
		v, err := tpm.NewVerifier(tpm.Options{Roots: testRootSets(r.ca), Clock: clock})
		if err != nil {
			b.Fatal(err)
		}
		c, err := v.Verify(r.sess, r.ev)
		if err != nil {
			b.Fatal(err)
		}
		doc, _, err := policy.Learn(nil, "worker", policy.Learned{EKTrust: c.TPM.EKTrust, Bank: "sha256", Boot: c.TPM.Boot,
			Root: &policy.EKRoot{Name: strings.TrimPrefix(c.TPM.EKTrust, "ca:"), Dir: "/unused"}, NodeNames: "requested"})
		if err != nil {
			b.Fatal(err)
		}
		pol, err := policy.Parse(doc)
		if err != nil {
			b.Fatal(err)
		}
		if t := pol.Pools["worker"].TPM; t.Grub == nil || len(t.Grub.Commands) == 0 || t.KernelCmdline == nil || len(t.KernelCmdline.Exact) == 0 {
			b.Fatalf("the learned policy does not judge the whole boot: %+v", t)
		}
		verifyLoop(b, v, r, pol)
	})
	b.Run("floor", func(b *testing.B) {
		f := newFloor(b, r)
		b.ReportAllocs()
		for b.Loop() {
			f.run(b)
		}
	})
}

// floor holds the inputs of the unavoidable operations, parsed up front.
type floor struct {
	ekCert, issuer *x509.Certificate
	ekPub          *rsa.PublicKey
	akPub          *ecdsa.PublicKey
	createMsg      []byte
	createSig      *tpm2.Signature
	quoteMsg       []byte
	quoteSig       *tpm2.Signature
	log            []byte
	extends        int // events the replay extends
}

func newFloor(b *testing.B, r *recorded) *floor {
	ek, err := x509.ParseCertificate(r.req.EKCertificate)
	if err != nil {
		b.Fatal(err)
	}
	pub, err := tpm2.DecodePublic(r.req.AK.Public)
	if err != nil {
		b.Fatal(err)
	}
	k, err := pub.Key()
	if err != nil {
		b.Fatal(err)
	}
	cs, err := tpm2.DecodeSignature(bytes.NewBuffer(r.req.AK.CreateSignature))
	if err != nil {
		b.Fatal(err)
	}
	qs, err := tpm2.DecodeSignature(bytes.NewBuffer(r.ev.Quotes[0].Signature))
	if err != nil {
		b.Fatal(err)
	}
	claims, err := tpm.NewVerifier(tpm.Options{Roots: testRootSets(r.ca), Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	c, err := claims.Verify(r.sess, r.ev)
	if err != nil {
		b.Fatal(err)
	}
	return &floor{
		extends: c.TPM.Boot.LogEvents,
		ekCert:  ek, issuer: r.ca.Intermediate, ekPub: ek.PublicKey.(*rsa.PublicKey), akPub: k.(*ecdsa.PublicKey),
		createMsg: r.req.AK.CreateAttestation, createSig: cs, quoteMsg: r.ev.Quotes[0].Quote, quoteSig: qs, log: r.ev.EventLog,
	}
}

func (f *floor) run(b *testing.B) {
	if err := f.ekCert.CheckSignatureFrom(f.issuer); err != nil {
		b.Fatal(err)
	}
	d := sha256.Sum256(f.createMsg)
	if !ecdsa.Verify(f.akPub, d[:], f.createSig.ECC.R, f.createSig.ECC.S) {
		b.Fatal("creation signature")
	}
	d = sha256.Sum256(f.quoteMsg)
	if !ecdsa.Verify(f.akPub, d[:], f.quoteSig.ECC.R, f.quoteSig.ECC.S) {
		b.Fatal("quote signature")
	}
	var seed [32]byte
	if _, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, f.ekPub, seed[:], []byte("IDENTITY\x00")); err != nil {
		b.Fatal(err)
	}
	_ = sha256.Sum256(f.log)
	var pcr [64]byte
	for i := 0; i < f.extends; i++ {
		sum := sha256.Sum256(pcr[:])
		copy(pcr[:32], sum[:])
	}
	var rnd [64]byte
	if _, err := io.ReadFull(rand.Reader, rnd[:]); err != nil {
		b.Fatal(err)
	}
}

// verifyLoop times what the server does per machine: the challenge, the
// verification of r's evidence, the policy's verdict.
func verifyLoop(b *testing.B, v *tpm.Verifier, r *recorded, pol *policy.Policy) {
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := v.Challenge("worker", r.key, r.req); err != nil {
			b.Fatal(err)
		}
		c, err := v.Verify(r.sess, r.ev)
		if err != nil {
			b.Fatal(err)
		}
		if err := pol.Evaluate("worker", c); err != nil {
			b.Fatal(err)
		}
	}
}
