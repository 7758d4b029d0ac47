package simtpm

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"slices"
	"testing"

	goattest "github.com/google/go-attestation/attest"
	legacy "github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/legacy/tpm2/credactivation"
	"github.com/google/go-tpm/tpm2"

	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/testenv"
)

// TestModelPassesVerifierAndPolicy: the whole exchange, Request →
// Challenge → Answer → Verify, with the real verifier and the vendor CA's
// roots, then the policy of a pool that requires Secure Boot.
func TestModelPassesVerifierAndPolicy(t *testing.T) {
	ca := newVendor(t)
	m := newModel(t, ca, firmwaretestdata.MustLog("rhel8-uefi"))
	v := modelVerifier(t, ca)
	key := testenv.KubeletKeySHA256(t)
	r := honestRun(t, m, v, key)
	claims, err := v.Verify(r.sess, r.ev)
	if err != nil {
		t.Fatalf("the verifier refused the model's evidence: %v", err)
	}
	if claims.TPM.EKTrust != "ca:test-vendor" || claims.TPM.PCRBank != "sha256" {
		t.Errorf("EK trust %q, bank %q; want ca:test-vendor and sha256", claims.TPM.EKTrust, claims.TPM.PCRBank)
	}
	boot := claims.TPM.Boot
	if !boot.SecureBootKnown || !boot.SecureBoot || len(boot.BootApplications) != 3 || !boot.KernelCmdlineKnown {
		t.Errorf("boot state %+v; want Secure Boot on, 3 boot applications and a kernel command line", boot)
	}
	if !bytes.Equal(claims.KubeletKeySHA256, key) {
		t.Error("claims bind another kubelet key")
	}
	pol := workerPolicy(t)
	if err := pol.Evaluate("worker", claims); err != nil {
		t.Fatalf("policy refused the model: %v", err)
	}
	// A machine booted without Secure Boot verifies and policy refuses it.
	off := newModel(t, ca, firmwaretestdata.MustLog("ubuntu-2104-no-secure-boot"))
	r = honestRun(t, off, v, key)
	claims, err = v.Verify(r.sess, r.ev)
	if err != nil {
		t.Fatalf("authentic evidence refused: %v", err)
	}
	wantReason(t, pol.Evaluate("worker", claims), attest.ReasonPolicySecureBootOff)
}

// TestModelAllFirmwareLogs: every real log that a TPM at locality 0 can
// reproduce gives a model machine whose evidence verifies, with the boot
// state the log's expected outcome names.
func TestModelAllFirmwareLogs(t *testing.T) {
	logs, err := firmwaretestdata.Logs()
	if err != nil {
		t.Fatal(err)
	}
	ca := newVendor(t)
	v := modelVerifier(t, ca)
	key := testenv.KubeletKeySHA256(t)
	n := 0
	for _, l := range logs {
		if !l.Expected.Parses || !l.Expected.SHA256 || !l.Expected.SwTPMReplay {
			continue
		}
		n++
		t.Run(l.Name, func(t *testing.T) {
			m := newModel(t, ca, l.Raw)
			r := honestRun(t, m, v, key)
			claims, err := v.Verify(r.sess, r.ev)
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !slices.Equal(claims.TPM.Boot.ReplayedPCRs, l.Expected.ReplayPCRs) {
				t.Errorf("replayed PCRs %v, want %v", claims.TPM.Boot.ReplayedPCRs, l.Expected.ReplayPCRs)
			}
			sb := "unknown"
			if claims.TPM.Boot.SecureBootKnown {
				sb = map[bool]string{true: "on", false: "off"}[claims.TPM.Boot.SecureBoot]
			}
			if sb != l.Expected.SecureBoot {
				t.Errorf("secure boot %s, want %s", sb, l.Expected.SecureBoot)
			}
			if !slices.Equal(claims.TPM.Boot.BootApplications, l.Expected.BootApplications) && len(l.Expected.BootApplications) > 0 {
				t.Errorf("boot applications %v, want %v", claims.TPM.Boot.BootApplications, l.Expected.BootApplications)
			}
		})
	}
	if n < 15 {
		t.Fatalf("only %d logs exercised", n)
	}
}

// TestGoAttestationAcceptsModel: go-attestation's own server-side checks
// (CheckAKParameters via ActivationParameters.Generate, its credential,
// AKPublic.Verify of the quote) accept the model too.
func TestGoAttestationAcceptsModel(t *testing.T) {
	ca := newVendor(t)
	m := newModel(t, ca, firmwaretestdata.MustLog("rhel8-uefi"))
	req, err := m.Request()
	if err != nil {
		t.Fatal(err)
	}
	params := goattest.AttestationParameters{Public: req.AK.Public, CreateData: req.AK.CreateData, CreateAttestation: req.AK.CreateAttestation, CreateSignature: req.AK.CreateSignature}
	ap := goattest.ActivationParameters{EK: &m.ek.PublicKey, AK: params}
	secret, ec, err := ap.Generate()
	if err != nil {
		t.Fatalf("go-attestation refused the AK parameters: %v", err)
	}
	got, err := m.ActivateCredential(ec.Credential, ec.Secret)
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("activation of go-attestation's credential: %x, %v; want %x", got, err, secret)
	}
	nonce := make([]byte, 32)
	rand.Read(nonce)
	q, err := m.Quote(nonce)
	if err != nil {
		t.Fatal(err)
	}
	akPub, err := goattest.ParseAKPublic(req.AK.Public)
	if err != nil {
		t.Fatal(err)
	}
	var pcrs []goattest.PCR
	for i, d := range m.PCRs(crypto.SHA256) {
		pcrs = append(pcrs, goattest.PCR{Index: i, Digest: d, DigestAlg: crypto.SHA256})
	}
	if err := akPub.VerifyAll([]goattest.Quote{{Quote: q.Quote, Signature: q.Signature}}, pcrs, nonce); err != nil {
		t.Fatalf("go-attestation refused the quote: %v", err)
	}
}

// TestActivateCredentialRefusals: a credential for another EK or another
// AK fails as in a TPM.
func TestActivateCredentialRefusals(t *testing.T) {
	ca := newVendor(t)
	a, b := newModel(t, ca, nil), newModel(t, ca, nil)
	secret := bytes.Repeat([]byte{7}, 32)
	name := func(m *Machine) *legacy.HashValue {
		return &legacy.HashValue{Alg: legacy.AlgSHA256, Value: m.akName[2:]}
	}
	cred, enc, err := credactivation.Generate(name(a), &a.ek.PublicKey, 16, secret)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := a.ActivateCredential(cred, enc); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("own credential: %x, %v", got, err)
	}
	if _, err := b.ActivateCredential(cred, enc); !errors.Is(err, ErrValue) {
		t.Errorf("credential for another EK: %v, want %v", err, ErrValue)
	}
	cred, enc, err = credactivation.Generate(name(b), &a.ek.PublicKey, 16, secret)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.ActivateCredential(cred, enc); !errors.Is(err, ErrIntegrity) {
		t.Errorf("credential for another AK: %v, want %v", err, ErrIntegrity)
	}
	if cred, enc, err = credactivation.Generate(name(a), &a.ek.PublicKey, 16, secret); err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Clone(cred)
	tampered[len(tampered)-1] ^= 1
	if _, err := a.ActivateCredential(tampered, enc); !errors.Is(err, ErrIntegrity) {
		t.Errorf("tampered credential: %v, want %v", err, ErrIntegrity)
	}
}

// TestModelStructures decodes every structure with go-tpm's tpm2 and
// checks what a verifier cannot see: the names chain (AK qualified name
// from the SRK's, the SRK's from the endorsement hierarchy), sizes and
// encodings.
func TestModelStructures(t *testing.T) {
	m := newModel(t, newVendor(t), firmwaretestdata.MustLog("rhel8-uefi"))
	ak, err := tpm2.Unmarshal[tpm2.TPMTPublic](m.akPublic)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tpm2.Marshal(ak), m.akPublic) {
		t.Error("AK public area does not round-trip")
	}
	cd, err := tpm2.Unmarshal[tpm2.TPMSCreationData](m.createData)
	if err != nil {
		t.Fatal(err)
	}
	srk, err := tpm2.Unmarshal[tpm2.TPMTPublic](m.srkPublic)
	if err != nil {
		t.Fatal(err)
	}
	srkName, err := objectName(*srk)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(cd.ParentName.Buffer, srkName) || !bytes.Equal(cd.ParentQualifiedName.Buffer, qualifiedName(tpm2.HandleName(tpm2.TPMRHEndorsement).Buffer, srkName)) {
		t.Error("creation data's parent names are not the SRK's")
	}
	att, err := tpm2.Unmarshal[tpm2.TPMSAttest](m.createAttestation)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(att.QualifiedSigner.Buffer, qualifiedName(cd.ParentQualifiedName.Buffer, m.akName)) {
		t.Error("qualified signer is not QN(SRK) || Name(AK)")
	}
	sig, err := tpm2.Unmarshal[tpm2.TPMTSignature](m.createSignature)
	if err != nil {
		t.Fatal(err)
	}
	ecc, err := sig.Signature.ECDSA()
	if err != nil || len(ecc.SignatureR.Buffer) != 32 || len(ecc.SignatureS.Buffer) != 32 {
		t.Errorf("creation signature %v: r, s must be 32 bytes each", err)
	}
	ek, err := tpm2.Unmarshal[tpm2.TPMTPublic](m.ekPublic)
	if err != nil {
		t.Fatal(err)
	}
	rsaID, err := ek.Unique.RSA()
	if err != nil || !bytes.Equal(rsaID.Buffer, m.ek.N.Bytes()) {
		t.Error("EK public area does not hold the EK modulus")
	}
}

// TestEKKeyCache: keys are generated once, kept, and handed out in the
// same order; asking for more adds to the cache.
func TestEKKeyCache(t *testing.T) {
	dir := t.TempDir()
	first, err := LoadEKKeys(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadEKKeys(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 3 || !first[0].Equal(again[0]) || !first[1].Equal(again[1]) {
		t.Fatal("cached keys are not reused in order")
	}
	one, err := LoadEKKeys(dir, 1)
	if err != nil || len(one) != 1 || !one[0].Equal(first[0]) {
		t.Fatalf("a shorter request: %v", err)
	}
}

// TestNewMachines: every machine of a fleet has its own EK, EK
// certificate and AK; one key for two machines is refused.
func TestNewMachines(t *testing.T) {
	ca := newVendor(t)
	keys := []*rsa.PrivateKey{ekKey(t), ekKey(t), ekKey(t)}
	ms, err := NewMachines(ca, firmwaretestdata.MustLog("rhel8-uefi"), keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range ms {
		for _, b := range [][]byte{m.ekPKIX, m.ekCert, m.akPublic} {
			if seen[string(b)] {
				t.Fatal("two machines share an EK, EK certificate or AK")
			}
			seen[string(b)] = true
		}
	}
	v := modelVerifier(t, ca)
	key := testenv.KubeletKeySHA256(t)
	for _, m := range ms {
		r := honestRun(t, m, v, key)
		if _, err := v.Verify(r.sess, r.ev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewMachines(ca, nil, []*rsa.PrivateKey{keys[0], keys[0]}, nil); err == nil {
		t.Fatal("one EK key for two machines was accepted")
	}
}
