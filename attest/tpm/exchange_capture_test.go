package tpm_test

import (
	"flag"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

var writeExchanges = flag.Bool("write-exchanges", false, "capture real TPM exchanges from swtpm and the simulator into testdata/exchanges (fuzz seeds)")

// TestCapturedExchanges checks that the exchanges the fuzz targets start
// from are still what the verifier accepts: each request passes Challenge
// (EK chain, AK attributes and creation attestation) and each answer passes
// Verify (activation secret, quote, binding, event log replay) at the
// exchange's time, with the claims the log implies. A seed that stopped
// verifying would leave the fuzzers mutating refusals only.
//
// go test ./attest/tpm -run TestCapturedExchanges -args -write-exchanges
// captures them again (swtpm and the go-tpm-tools simulator).
func TestCapturedExchanges(t *testing.T) {
	if *writeExchanges {
		captureSwtpm(t, "rhel8-uefi")
		captureSimulator(t, "crypto-agile-eventlog")
	}
	for _, x := range tpm.LoadExchanges(t) {
		t.Run(x.Producer+"/"+x.Log, func(t *testing.T) {
			v := x.Verifier(t)
			req := x.Request
			if _, _, err := v.Challenge("worker", x.KubeletKeySHA256, &req); err != nil {
				t.Fatalf("captured request refused: %v", err)
			}
			sess, ev := x.Session, x.Evidence
			claims, err := v.Verify(&sess, &ev)
			if err != nil {
				t.Fatalf("captured evidence refused: %v", err)
			}
			if claims.TPM.EKTrust != "ca:vendor" || claims.TPM.PCRBank != "sha256" || claims.TPM.Boot.LogEvents == 0 {
				t.Fatalf("claims: trust %q bank %q, %d events", claims.TPM.EKTrust, claims.TPM.PCRBank, claims.TPM.Boot.LogEvents)
			}
			// At the session's expiry the same answer is refused: the
			// stored time is what makes the seeds verify.
			late := x
			late.Time = x.Session.Expires
			sess, ev = x.Session, x.Evidence
			_, err = late.Verifier(t).Verify(&sess, &ev)
			wantReason(t, err, attest.ReasonSessionExpired)
		})
	}
}

func captureSwtpm(t *testing.T, log string) {
	m := newSwMachine(t, firmwaretestdata.MustLog(log))
	dir, err := manufacturer(t).RootsDir()
	if err != nil {
		t.Fatal(err)
	}
	set, err := tpm.LoadRootSet("vendor", dir)
	if err != nil {
		t.Fatal(err)
	}
	x := &tpm.Exchange{Producer: "swtpm", Log: log, Time: time.Now().UTC().Truncate(time.Second), KubeletKeySHA256: m.keySHA}
	for _, c := range set.Roots {
		x.Roots = append(x.Roots, c.Raw)
	}
	for _, c := range set.Intermediates {
		x.Intermediates = append(x.Intermediates, c.Raw)
	}
	capture(t, x, m.collector)
	tpm.WriteExchange(t, "swtpm-"+log, x)
}

func captureSimulator(t *testing.T, log string) {
	ca := newCA(t, "Vendor")
	m := newMachine(t, ca, firmwaretestdata.MustLog(log))
	x := &tpm.Exchange{Producer: "go-tpm-tools-simulator", Log: log, Time: testNow, KubeletKeySHA256: m.keySHA,
		Roots: [][]byte{ca.Root.Raw}, Intermediates: [][]byte{ca.Intermediate.Raw}}
	capture(t, x, m.collector)
	tpm.WriteExchange(t, "simulator-"+log, x)
}

// capture runs both steps honestly and records them in x.
func capture(t *testing.T, x *tpm.Exchange, c *tpm.Collector) {
	t.Helper()
	req, err := c.Request()
	if err != nil {
		t.Fatal(err)
	}
	ch, sess, err := x.Verifier(t).Challenge("worker", x.KubeletKeySHA256, req)
	if err != nil {
		t.Fatalf("challenge: %v", err)
	}
	ev, err := c.Answer(ch, x.KubeletKeySHA256)
	if err != nil {
		t.Fatalf("answer: %v", err)
	}
	x.Request, x.Session, x.Evidence = *req, *sess, *ev
}
