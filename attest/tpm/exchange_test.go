package tpm

import (
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// Exchange is one real TPM attestation, captured once from a software TPM
// (swtpm with its local CA's EK certificate, or the go-tpm-tools simulator
// with a test vendor CA) by TestCapturedExchanges -write-exchanges and kept
// in testdata/exchanges: the node's two messages exactly as its TPM made
// them, and what the server needs to check them again (the vendor roots,
// the session it sealed, the time). The fuzz targets start from these, so
// the fuzzer mutates structures a TPM really emitted and reaches the
// checks past decoding.
type Exchange struct {
	// Producer says which TPM made it; Log names the firmware log its PCRs
	// hold (firmware-testdata).
	Producer string `json:"producer"`
	Log      string `json:"log"`
	// Time is the verifier's clock for both steps.
	Time time.Time `json:"time"`
	// Roots and Intermediates (DER) are the vendor CA the EK chains to.
	Roots         [][]byte `json:"roots"`
	Intermediates [][]byte `json:"intermediates,omitempty"`
	// KubeletKeySHA256 is the kubelet key the exchange binds.
	KubeletKeySHA256 []byte           `json:"kubeletKeySHA256"`
	Request          ChallengeRequest `json:"request"`
	Session          attest.Session   `json:"session"`
	Evidence         Evidence         `json:"evidence"`
}

// exchangeDir is where captured exchanges live.
const exchangeDir = "testdata/exchanges"

// LoadExchanges reads every captured exchange, sorted by file name.
func LoadExchanges(tb testing.TB) []Exchange {
	tb.Helper()
	names, err := filepath.Glob(filepath.Join(exchangeDir, "*.json"))
	if err != nil {
		tb.Fatal(err)
	}
	sort.Strings(names)
	var out []Exchange
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			tb.Fatal(err)
		}
		var x Exchange
		if err := json.Unmarshal(b, &x); err != nil {
			tb.Fatalf("%s: %v", n, err)
		}
		out = append(out, x)
	}
	if len(out) == 0 {
		tb.Fatalf("no captured exchanges in %s", exchangeDir)
	}
	return out
}

// RootSet is the exchange's vendor CA.
func (x *Exchange) RootSet(tb testing.TB) RootSet {
	tb.Helper()
	set := RootSet{Name: "vendor"}
	for _, der := range x.Roots {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			tb.Fatal(err)
		}
		set.Roots = append(set.Roots, c)
	}
	for _, der := range x.Intermediates {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			tb.Fatal(err)
		}
		set.Intermediates = append(set.Intermediates, c)
	}
	return set
}

// Verifier checks the exchange at its own time, trusting its vendor CA.
func (x *Exchange) Verifier(tb testing.TB) *Verifier {
	tb.Helper()
	t := x.Time
	v, err := NewVerifier(Options{Roots: []RootSet{x.RootSet(tb)}, Clock: func() time.Time { return t }})
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// WriteExchange stores x in testdata/exchanges/<name>.json.
func WriteExchange(tb testing.TB, name string, x *Exchange) {
	tb.Helper()
	b, err := json.MarshalIndent(x, "", " ")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.MkdirAll(exchangeDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(exchangeDir, name+".json"), append(b, '\n'), 0o644); err != nil {
		tb.Fatal(err)
	}
}
