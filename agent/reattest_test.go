package agent

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// countingEvidence answers every attestation with a re-attestation result
// (or refuses), counting the attempts: the scheduling is under test here;
// the exchange itself is internal/e2e's (TestNodeLifetimeAttacks).
type countingEvidence struct {
	n      int
	refuse bool
}

func (*countingEvidence) Kind() attest.Kind { return attest.KindTPM }

func (e *countingEvidence) Attest(_ context.Context, c *Client, _, node string, _ []byte) (*api.VerifyResponse, error) {
	e.n++
	if c.Purpose != attest.PurposeReattest {
		return nil, &Refused{Status: 400, Refusal: api.Refusal{Reason: "NotAReattestation"}}
	}
	if e.refuse {
		return nil, &Refused{Status: 403, Refusal: api.Refusal{Reason: attest.ReasonPolicySecureBootOff}}
	}
	return &api.VerifyResponse{NodeName: node, Reattest: &api.ReattestResult{Boots: int64(e.n), IntervalSeconds: 3600}}, nil
}

// testCA is a CA bundle (a self-signed certificate) for a client that
// never connects.
func testCA(t *testing.T) []byte {
	t.Helper()
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}

// TestReattestSchedule: a run attests at the first run of a boot, then only
// once the server's interval (less at most 10% jitter) has passed, or when
// forced; a refusal leaves the schedule as it was.
func TestReattestSchedule(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	boot := "boot-1"
	ev := &countingEvidence{}
	cfg := ReattestConfig{
		Server: "https://mcs.example:22623", CABundle: testCA(t), Pool: "worker", NodeName: "worker-1", Evidence: ev,
		KubeletKeyPath: filepath.Join(dir, "kubelet.key"), StatePath: filepath.Join(dir, "state.json"),
		BootID: func() (string, error) { return boot, nil }, Clock: func() time.Time { return now },
	}
	run := func(step string, wantAttempts int) {
		t.Helper()
		if err := Reattest(context.Background(), cfg); err != nil && !ev.refuse {
			t.Fatalf("%s: %v", step, err)
		}
		if ev.n != wantAttempts {
			t.Fatalf("%s: %d attestations, want %d", step, ev.n, wantAttempts)
		}
	}
	run("first run", 1)
	st, err := LoadReattestState(cfg.StatePath)
	if err != nil || st.BootID != boot || !st.LastSuccess.Equal(now) || st.Boots != 1 ||
		st.NextAt.Before(now.Add(54*time.Minute)) || st.NextAt.After(now.Add(time.Hour)) {
		t.Fatalf("state %+v, %v; want the next run due 54 to 60 minutes on", st, err)
	}
	now = now.Add(10 * time.Minute)
	run("the timer, 10 minutes on", 1)
	cfg.Force = true
	run("forced", 2)
	cfg.Force = false
	boot = "boot-2"
	run("a new boot", 3)
	now = now.Add(61 * time.Minute)
	run("an hour on", 4)
	before, _ := LoadReattestState(cfg.StatePath)
	ev.refuse, boot = true, "boot-3"
	run("refused", 5)
	if after, _ := LoadReattestState(cfg.StatePath); after != before {
		t.Fatalf("a refusal changed the state: %+v → %+v", before, after)
	}
	run("refused, tried again at the next run", 6)
}
