package tpm_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"io"
	"testing"
	"time"

	goattest "github.com/google/go-attestation/attest"
	"github.com/google/go-tpm-tools/simulator"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/internal/tpmtest"
)

// The go-tpm-tools simulator is one per process: these tests do not run in
// parallel.

var testNow = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func clock() time.Time { return testNow }

// simChannel gives the simulator an event log.
type simChannel struct {
	io.ReadWriteCloser
	log []byte
}

func (c *simChannel) MeasurementLog() ([]byte, error) { return c.log, nil }

// noClose keeps the simulator open when a provisioning session ends.
type noClose struct{ *simChannel }

func (noClose) Close() error { return nil }

// machine is a simulated node: a TPM with a vendor EK certificate whose
// PCRs hold a real firmware log.
type machine struct {
	sim       *simulator.Simulator
	ch        *simChannel
	collector *tpm.Collector
	ekCert    *x509.Certificate
	kubelet   *ecdsa.PrivateKey
	keyDER    []byte
	keySHA    []byte
	closed    bool
}

// newMachine starts the simulator, extends log into it, provisions an EK
// certificate from ca, and opens a collector.
func newMachine(t testing.TB, ca *tpmtest.VendorCA, log []byte) *machine {
	t.Helper()
	return newMachineVia(t, ca, log, nil)
}

// newMachineVia is newMachine with the collector's commands going through
// via(the machine's channel) when via is set (a counting channel).
func newMachineVia(t testing.TB, ca *tpmtest.VendorCA, log []byte, via func(tpm.Channel) tpm.Channel) *machine {
	t.Helper()
	sim, err := simulator.Get()
	if err != nil {
		t.Fatalf("start the go-tpm-tools simulator (needs cgo, gcc and libssl-dev: apt-get install gcc libssl-dev): %v", err)
	}
	m := &machine{sim: sim, ch: &simChannel{ReadWriteCloser: sim, log: log}}
	t.Cleanup(m.close)
	if len(log) > 0 {
		if _, err := tpmtest.ExtendLog(sim, log); err != nil {
			t.Fatalf("extend log: %v", err)
		}
	}
	if ca != nil {
		// go-attestation derives the EK from its own template; provision
		// the certificate for exactly that key.
		at, err := goattest.OpenTPM(&goattest.OpenConfig{CommandChannel: noClose{m.ch}})
		if err != nil {
			t.Fatal(err)
		}
		eks, err := at.EKs()
		if err != nil {
			t.Fatal(err)
		}
		der, err := ca.IssueEK(eks[0].Public, testNow)
		if err != nil {
			t.Fatal(err)
		}
		if err := tpmtest.ProvisionEKCert(sim, der); err != nil {
			t.Fatal(err)
		}
		if m.ekCert, err = x509.ParseCertificate(der); err != nil {
			t.Fatal(err)
		}
	}
	var ch tpm.Channel = m.ch
	if via != nil {
		ch = via(m.ch)
	}
	if m.collector, err = tpm.NewCollector(ch); err != nil {
		t.Fatalf("collector: %v", err)
	}
	m.kubelet, m.keyDER, m.keySHA = newKubeletKey(t)
	return m
}

// close releases the simulator (once).
func (m *machine) close() {
	if m.closed {
		return
	}
	m.closed = true
	if m.collector != nil {
		m.collector.Close()
	} else {
		m.sim.Close()
	}
}

func newKubeletKey(t testing.TB) (*ecdsa.PrivateKey, []byte, []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	sum, err := attest.KeySHA256(der)
	if err != nil {
		t.Fatal(err)
	}
	return k, der, sum
}

func newVerifier(t *testing.T, ca *tpmtest.VendorCA, inv *tpm.Inventory) *tpm.Verifier {
	t.Helper()
	v, err := tpm.NewVerifier(tpm.Options{Roots: testRootSets(ca), Inventory: inv, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// testRootSets trusts ca (none when nil).
func testRootSets(ca *tpmtest.VendorCA) []tpm.RootSet {
	if ca == nil {
		return nil
	}
	return []tpm.RootSet{{Name: "test-vendor", Roots: []*x509.Certificate{ca.Root}, Intermediates: []*x509.Certificate{ca.Intermediate}}}
}

func newCA(t *testing.T, name string) *tpmtest.VendorCA {
	t.Helper()
	ca, err := tpmtest.NewVendorCA(name, testNow)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// attestOnce runs both steps honestly and returns what the verifier said.
func attestOnce(t *testing.T, m *machine, v *tpm.Verifier) (*attest.Claims, error) {
	t.Helper()
	req, err := m.collector.Request()
	if err != nil {
		t.Fatal(err)
	}
	ch, sess, err := v.Challenge("worker", m.keySHA, req)
	if err != nil {
		return nil, err
	}
	ev, err := m.collector.Answer(ch, m.keySHA)
	if err != nil {
		t.Fatalf("answer: %v", err)
	}
	return v.Verify(sess, ev)
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

// attestTicketed is attestOnce with an opened AK ticket (nil: none),
// returning the challenge too.
func attestTicketed(t *testing.T, m *machine, v *tpm.Verifier, ticket []byte) (*attest.Claims, *tpm.Challenge, error) {
	t.Helper()
	req, err := m.collector.Request()
	if err != nil {
		t.Fatal(err)
	}
	ch, sess, err := v.ChallengeTicketed("worker", m.keySHA, req, ticket)
	if err != nil {
		return nil, nil, err
	}
	ev, err := m.collector.Answer(ch, m.keySHA)
	if err != nil {
		t.Fatalf("answer: %v", err)
	}
	claims, err := v.Verify(sess, ev)
	return claims, ch, err
}
