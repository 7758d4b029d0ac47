package simtpm

import (
	"crypto/rsa"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// A model machine is a TPM for agent.AttestTPM.
var _ agent.TPM = (*Machine)(nil)

// workerPolicy: the worker pool takes TPM evidence any trust vouched
// for, booted with Secure Boot.
func workerPolicy(t testing.TB) *policy.Policy {
	return policytest.New().Pool("worker", policytest.TPM().SecureBoot()).Must(t)
}

// testKeyCount EK keys are generated once per test binary (not cached:
// tests leave the user's cache alone); tests take distinct ones.
const testKeyCount = 8

var (
	testKeysOnce = sync.OnceValues(func() ([]*rsa.PrivateKey, error) { return GenerateEKKeys(testKeyCount) })
	testKeyMu    sync.Mutex
	testKeyNext  int
)

// ekKey returns a pre-generated EK key, distinct from the last
// testKeyCount-1 ones handed out.
func ekKey(t testing.TB) *rsa.PrivateKey {
	t.Helper()
	keys, err := testKeysOnce()
	if err != nil {
		t.Fatal(err)
	}
	testKeyMu.Lock()
	defer testKeyMu.Unlock()
	k := keys[testKeyNext%len(keys)]
	testKeyNext++
	return k
}

func newVendor(t testing.TB) *tpmtest.VendorCA {
	t.Helper()
	ca, err := tpmtest.NewVendorCA("Model Vendor", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func newModel(t testing.TB, ca *tpmtest.VendorCA, log []byte) *Machine {
	t.Helper()
	m, err := NewMachine(ca, log, nil, WithEKKey(ekKey(t)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func modelVerifier(t testing.TB, ca *tpmtest.VendorCA) *tpm.Verifier {
	t.Helper()
	v, err := tpm.NewVerifier(tpm.Options{
		Roots: []tpm.RootSet{{Name: "test-vendor", Roots: []*x509.Certificate{ca.Root}, Intermediates: []*x509.Certificate{ca.Intermediate}}},
		Clock: time.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// run is one honest exchange between a node and a verifier.
type run struct {
	req  *tpm.ChallengeRequest
	ch   *tpm.Challenge
	sess *attest.Session
	ev   *tpm.Evidence
}

func honestRun(t *testing.T, node agent.TPM, v *tpm.Verifier, keySHA []byte) *run {
	t.Helper()
	r := &run{}
	var err error
	if r.req, err = node.Request(); err != nil {
		t.Fatal(err)
	}
	if r.ch, r.sess, err = v.Challenge("worker", keySHA, r.req); err != nil {
		t.Fatalf("honest challenge refused: %v", err)
	}
	if r.ev, err = node.Answer(r.ch, keySHA); err != nil {
		t.Fatalf("answer: %v", err)
	}
	return r
}

func wantReason(t *testing.T, err error, want attest.Reason) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want refusal %s", want)
	}
	got, ok := attest.ReasonOf(err)
	if !ok {
		t.Fatalf("refused without a typed reason (%v); want %s", err, want)
	}
	if got != want {
		t.Fatalf("refused with %s (%v); want %s", got, err, want)
	}
}
