package tpm_test

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"testing"
	"time"
	"unicode/utf16"

	goattest "github.com/google/go-attestation/attest"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/attacktable"
)

// workerPolicy: the worker pool takes TPM evidence any trust vouched
// for, booted with Secure Boot.
func workerPolicy(t testing.TB) *policy.Policy {
	return policytest.New().Pool("worker", policytest.TPM().SecureBoot()).Must(t)
}

// honest is one honest run's material, for attacks to reuse.
type honest struct {
	m    *machine
	v    *tpm.Verifier
	req  *tpm.ChallengeRequest
	ch   *tpm.Challenge
	sess *attest.Session
	ev   *tpm.Evidence
}

func runHonest(t *testing.T, m *machine, v *tpm.Verifier) *honest {
	t.Helper()
	h := &honest{m: m, v: v}
	var err error
	if h.req, err = m.collector.Request(); err != nil {
		t.Fatal(err)
	}
	if h.ch, h.sess, err = v.Challenge("worker", m.keySHA, h.req); err != nil {
		t.Fatalf("honest challenge refused: %v", err)
	}
	if h.ev, err = m.collector.Answer(h.ch, m.keySHA); err != nil {
		t.Fatal(err)
	}
	return h
}

// cloneEvidence deep-copies evidence so an attack edits its own copy.
func cloneEvidence(e *tpm.Evidence) *tpm.Evidence {
	c := *e
	c.ActivationSecret = bytes.Clone(e.ActivationSecret)
	c.EventLog = bytes.Clone(e.EventLog)
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

// TestAttacksOnSimulator runs each attack of the threat model against one
// simulated machine booted from a real RHEL 8 log. Every attack must be
// refused with its own reason.
func TestAttacksOnSimulator(t *testing.T) {
	ca := newCA(t, "Vendor")
	m := newMachine(t, ca, firmwaretestdata.MustLog("rhel8-uefi"))
	v := newVerifier(t, ca, nil)
	h := runHonest(t, m, v)
	if _, err := v.Verify(h.sess, h.ev); err != nil {
		t.Fatalf("the honest run is refused, so no attack below means anything: %v", err)
	}

	cases := []struct {
		name   string
		attack func(t *testing.T) error
		want   attest.Reason
	}{
		{"quote replayed with another nonce", func(t *testing.T) error {
			// A second session for the same machine; the attacker answers it
			// with the first session's quote (activating the new credential
			// is possible for it: it owns the TPM).
			ch2, sess2, err := v.Challenge("worker", m.keySHA, h.req)
			if err != nil {
				t.Fatal(err)
			}
			ev2, err := m.collector.Answer(ch2, m.keySHA)
			if err != nil {
				t.Fatal(err)
			}
			old := cloneEvidence(h.ev)
			old.ActivationSecret = ev2.ActivationSecret
			return verifyErr(v.Verify(sess2, old))
		}, attest.ReasonQuoteBinding},
		{"kubelet key swapped", func(t *testing.T) error {
			// The server's session is for the attacker's kubelet key; the
			// machine's quote binds its own.
			_, _, attackerKey := newKubeletKey(t)
			ch2, sess2, err := v.Challenge("worker", attackerKey, h.req)
			if err != nil {
				t.Fatal(err)
			}
			ev2, err := m.collector.Answer(ch2, m.keySHA)
			if err != nil {
				t.Fatal(err)
			}
			return verifyErr(v.Verify(sess2, ev2))
		}, attest.ReasonKubeletKey},
		{"kubelet key swapped and claimed", func(t *testing.T) error {
			_, _, attackerKey := newKubeletKey(t)
			ch2, sess2, err := v.Challenge("worker", attackerKey, h.req)
			if err != nil {
				t.Fatal(err)
			}
			ev2, err := m.collector.Answer(ch2, m.keySHA)
			if err != nil {
				t.Fatal(err)
			}
			ev2.KubeletKeySHA256 = attackerKey
			return verifyErr(v.Verify(sess2, ev2))
		}, attest.ReasonQuoteBinding},
		{"wrong activation secret", func(t *testing.T) error {
			ev := cloneEvidence(h.ev)
			ev.ActivationSecret[0] ^= 1
			return verifyErr(v.Verify(h.sess, ev))
		}, attest.ReasonActivation},
		{"AK not restricted", func(t *testing.T) error {
			req := *h.req
			req.AK = unrestrictedKey(t, m)
			_, _, err := v.Challenge("worker", m.keySHA, &req)
			return err
		}, attest.ReasonAKAttributes},
		{"AK creation attestation of another key", func(t *testing.T) error {
			other := unrestrictedKey(t, m)
			req := *h.req
			req.AK.CreateAttestation, req.AK.CreateSignature = other.CreateAttestation, other.CreateSignature
			_, _, err := v.Challenge("worker", m.keySHA, &req)
			return err
		}, attest.ReasonAKCreation},
		{"EK certificate from an untrusted CA", func(t *testing.T) error {
			_, _, err := newVerifier(t, newCA(t, "Other vendor"), nil).Challenge("worker", m.keySHA, h.req)
			return err
		}, attest.ReasonEKUntrusted},
		{"EK certificate for another key", func(t *testing.T) error {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				t.Fatal(err)
			}
			der, err := ca.IssueEK(&k.PublicKey, testNow)
			if err != nil {
				t.Fatal(err)
			}
			req := *h.req
			req.EKCertificate = der
			_, _, err = v.Challenge("worker", m.keySHA, &req)
			return err
		}, attest.ReasonEKMismatch},
		{"software TPM with its own EK and no certificate", func(t *testing.T) error {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				t.Fatal(err)
			}
			req := *h.req
			req.EKPublic, req.EKCertificate = mustPKIX(t, &k.PublicKey), nil
			_, _, err = v.Challenge("worker", m.keySHA, &req)
			return err
		}, attest.ReasonEKNotInInventory},
		{"event log edited", func(t *testing.T) error {
			ev := cloneEvidence(h.ev)
			shim, _ := hex.DecodeString("40d6cae02973789080cf4c3a9ad11b5a0a4d8bba4438ab96e276cc784454dee7")
			i := bytes.Index(ev.EventLog, shim)
			if i < 0 {
				t.Fatal("shim digest not in log")
			}
			ev.EventLog[i] ^= 1
			return verifyErr(v.Verify(h.sess, ev))
		}, attest.ReasonEventLogReplay},
		{"Secure Boot variable forged in the log", func(t *testing.T) error {
			ev := cloneEvidence(h.ev)
			name := utf16LE("SecureBoot")
			i := bytes.Index(ev.EventLog, name)
			if i < 0 || ev.EventLog[i+len(name)] != 1 {
				t.Fatal("SecureBoot=1 not found in log")
			}
			ev.EventLog[i+len(name)] = 0
			return verifyErr(v.Verify(h.sess, ev))
		}, attest.ReasonEventLogInvalid},
		{"PCR value changed", func(t *testing.T) error {
			ev := cloneEvidence(h.ev)
			ev.PCRs[7].Digest[0] ^= 1
			return verifyErr(v.Verify(h.sess, ev))
		}, attest.ReasonQuotePCRDigest},
		{"quote signature forged", func(t *testing.T) error {
			ev := cloneEvidence(h.ev)
			sig := ev.Quotes[0].Signature
			sig[len(sig)-1] ^= 1
			return verifyErr(v.Verify(h.sess, ev))
		}, attest.ReasonQuoteSignature},
		{"boot PCRs left out of the quote", func(t *testing.T) error {
			return partialQuote(t, m, v, h.req, []int{0, 1, 2, 3})
		}, attest.ReasonQuoteSelection},
		{"session expired", func(t *testing.T) error {
			late, err := tpm.NewVerifier(tpm.Options{Roots: testRootSets(ca), Clock: func() time.Time { return testNow.Add(6 * time.Minute) }})
			if err != nil {
				t.Fatal(err)
			}
			return verifyErr(late.Verify(h.sess, h.ev))
		}, attest.ReasonSessionExpired},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			attacktable.CheckRefusal(t, "TPM", tc.name, tc.want, tc.attack(t))
		})
	}
}

func verifyErr(_ *attest.Claims, err error) error { return err }

func mustPKIX(t *testing.T, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// partialQuote plays a machine that quotes only some PCRs, hiding the rest
// of its boot: it makes its own AK with go-attestation, activates the
// credential honestly, and quotes the subset.
func partialQuote(t *testing.T, m *machine, v *tpm.Verifier, honestReq *tpm.ChallengeRequest, pcrs []int) error {
	t.Helper()
	at, err := goattest.OpenTPM(&goattest.OpenConfig{CommandChannel: noClose{m.ch}})
	if err != nil {
		t.Fatal(err)
	}
	ak, err := at.NewAK(&goattest.AKConfig{Algorithm: goattest.ECDSA})
	if err != nil {
		t.Fatal(err)
	}
	defer ak.Close(at)
	p := ak.AttestationParameters()
	req := *honestReq
	req.AK = tpm.AKParameters{Public: p.Public, CreateData: p.CreateData, CreateAttestation: p.CreateAttestation, CreateSignature: p.CreateSignature}
	ch, sess, err := v.Challenge("worker", m.keySHA, &req)
	if err != nil {
		t.Fatal(err)
	}
	eks, err := at.EKs()
	if err != nil {
		t.Fatal(err)
	}
	secret, err := ak.ActivateCredentialWithEK(at, goattest.EncryptedCredential{Credential: ch.Credential, Secret: ch.Secret}, eks[0])
	if err != nil {
		t.Fatal(err)
	}
	q, err := ak.QuotePCRs(at, attest.BindingDigest(ch.Nonce, m.keySHA), goattest.HashSHA256, pcrs)
	if err != nil {
		t.Fatal(err)
	}
	all, err := at.PCRs(goattest.HashSHA256)
	if err != nil {
		t.Fatal(err)
	}
	ev := &tpm.Evidence{KubeletKeySHA256: m.keySHA, ActivationSecret: secret, Quotes: []tpm.Quote{{Quote: q.Quote, Signature: q.Signature}}, EventLog: m.ch.log}
	for _, i := range pcrs {
		ev.PCRs = append(ev.PCRs, tpm.PCR{Index: i, Bank: "sha256", Digest: all[i].Digest})
	}
	return verifyErr(v.Verify(sess, ev))
}

func utf16LE(s string) []byte {
	var b []byte
	for _, u := range utf16.Encode([]rune(s)) {
		b = append(b, byte(u), byte(u>>8))
	}
	return b
}

// srkHandle is where go-attestation keeps the storage root key it made
// the AK under.
const srkHandle = tpmutil.Handle(0x81000002)

// unrestrictedKey makes a real TPM signing key that is not restricted (it
// could sign a forged quote) and certifies its creation with itself, the
// way an AK would be presented.
func unrestrictedKey(t *testing.T, m *machine) tpm.AKParameters {
	t.Helper()
	tmpl := tpm2.Public{
		Type: tpm2.AlgECC, NameAlg: tpm2.AlgSHA256,
		Attributes: tpm2.FlagSignerDefault &^ tpm2.FlagRestricted,
		ECCParameters: &tpm2.ECCParams{
			Sign:    &tpm2.SigScheme{Alg: tpm2.AlgECDSA, Hash: tpm2.AlgSHA256},
			CurveID: tpm2.CurveNISTP256,
		},
	}
	priv, pub, cd, ch, tix, err := tpm2.CreateKey(m.sim, srkHandle, tpm2.PCRSelection{}, "", "", tmpl)
	if err != nil {
		t.Fatalf("create unrestricted key: %v", err)
	}
	h, _, err := tpm2.Load(m.sim, srkHandle, "", pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	defer tpm2.FlushContext(m.sim, h)
	att, sig, err := tpm2.CertifyCreation(m.sim, "", h, h, nil, ch, *tmpl.ECCParameters.Sign, tix)
	if err != nil {
		t.Fatal(err)
	}
	return tpm.AKParameters{Public: pub, CreateData: cd, CreateAttestation: att, CreateSignature: sig}
}

// TestSHA1OnlyTPM: a TPM whose only PCR bank is SHA-1 quotes that bank;
// the verifier says so in the claims and the default policy refuses it.
func TestSHA1OnlyTPM(t *testing.T) {
	m := newSwMachine(t, firmwaretestdata.MustLog("rhel8-uefi"), "sha1")
	claims, err := swAttest(t, m, swtpmVerifier(t, nil))
	if err != nil {
		t.Fatalf("verifier refused a SHA-1 quote outright (%v); policy should decide", err)
	}
	if claims.TPM.PCRBank != "sha1" {
		t.Fatalf("bank %q, want sha1", claims.TPM.PCRBank)
	}
	pol := workerPolicy(t)
	wantReason(t, pol.Evaluate("worker", claims), attest.ReasonPolicySHA1)
}

// TestSecureBootOffRefusedByPolicy: a real log of a machine booted without
// Secure Boot verifies (it is authentic) and policy refuses it.
func TestSecureBootOffRefusedByPolicy(t *testing.T) {
	ca := newCA(t, "Vendor")
	m := newMachine(t, ca, firmwaretestdata.MustLog("ubuntu-2104-no-secure-boot"))
	claims, err := attestOnce(t, m, newVerifier(t, ca, nil))
	if err != nil {
		t.Fatalf("authentic evidence refused: %v", err)
	}
	pol := workerPolicy(t)
	wantReason(t, pol.Evaluate("worker", claims), attest.ReasonPolicySecureBootOff)
}
