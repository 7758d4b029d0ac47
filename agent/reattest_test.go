package agent

import (
	"bytes"
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
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

// keyEvidence answers like countingEvidence and records the kubelet key
// each attestation bound.
type keyEvidence struct {
	countingEvidence
	keys [][]byte
}

func (e *keyEvidence) Attest(ctx context.Context, c *Client, pool, node string, pub []byte) (*api.VerifyResponse, error) {
	e.keys = append(e.keys, pub)
	return e.countingEvidence.Attest(ctx, c, pool, node, pub)
}

// TestReattestBoundKey: with its own copy of the bound key, the agent
// proves the same key after the kubelet removed kubelet-client.key.tmp
// (LoadClientCert does once its certificate is issued); without it, it
// would make another key there, one the binding does not hold.
func TestReattestBoundKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		kept bool
		same bool
	}{
		{name: "the agent keeps its copy", kept: true, same: true},
		{name: "no copy: a new key after the kubelet removed its file", kept: false, same: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			kubeletKey := filepath.Join(dir, "pki", "kubelet-client.key.tmp")
			bound := filepath.Join(dir, "nodeproof", "kubelet-bound.key")
			enrolled, err := KubeletKey(kubeletKey) // what enrolment bound
			if err != nil {
				t.Fatal(err)
			}
			ev := &keyEvidence{}
			cfg := ReattestConfig{
				Server: "https://mcs.example:22623", CABundle: testCA(t), Pool: "worker", NodeName: "worker-1", Evidence: ev,
				KubeletKeyPath: kubeletKey, StatePath: filepath.Join(dir, "state.json"), Force: true,
				BootID: func() (string, error) { return "boot-1", nil },
			}
			if tc.kept {
				cfg.BoundKeyPath = bound
			}
			if err := Reattest(context.Background(), cfg); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(kubeletKey); err != nil {
				t.Fatal(err)
			}
			if err := Reattest(context.Background(), cfg); err != nil {
				t.Fatal(err)
			}
			if len(ev.keys) != 2 || !bytes.Equal(ev.keys[0], enrolled) {
				t.Fatalf("attestations bound %d keys, the first the enrolled one: %v", len(ev.keys), len(ev.keys) > 0 && bytes.Equal(ev.keys[0], enrolled))
			}
			if got := bytes.Equal(ev.keys[1], enrolled); got != tc.same {
				t.Errorf("after the kubelet removed its key file, the bound key proved: %v, want %v", got, tc.same)
			}
			if tc.kept {
				if fi, err := os.Stat(bound); err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("the kept copy: %v, mode %v; want 0600", err, fi.Mode())
				}
			}
		})
	}
}
