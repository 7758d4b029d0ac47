package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy/policytest"
	"github.com/nodeproof/nodeproof/store"
	"github.com/nodeproof/nodeproof/store/boltstore"
)

// TestPolicyCheckAgainstRecords: every enrolled node is judged by the new
// policy from its last recorded claims; a node without claims (enrolled,
// not re-attested) is reported NOT JUDGED, never counted as passing; the
// command exits 1 when any node would fail, 0 otherwise.
func TestPolicyCheckAgainstRecords(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pol, err := policytest.New().Pool("worker", policytest.TPM().SecureBoot()).Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	claims := func(secureBoot bool) []byte {
		c := attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{PCRBank: "sha256", EKTrust: "ca:vendor"}}
		c.TPM.Boot.SecureBootKnown, c.TPM.Boot.SecureBoot = true, secureBoot
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// name: claims recorded (nil: none)
	nodes := map[string][]byte{"worker-pass": claims(true), "worker-fail": claims(false), "worker-new": nil}
	st, err := boltstore.Open(filepath.Join(dir, "state.db"), time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for node, cl := range nodes {
		id := "ek:" + node
		r := &store.Record{ID: "rec-" + node, NodeName: node, Pool: "worker", Kind: attest.KindTPM, Identity: id,
			KubeletKeySHA256: make([]byte, 32), CreatedAt: now, Expires: now.Add(time.Hour)}
		if err := st.Enrol(ctx, r, store.EnrolOptions{}); err != nil {
			t.Fatal(err)
		}
		if cl == nil {
			continue
		}
		if _, err := st.UpdateStatus(ctx, node, id, func(b *store.Binding) error {
			b.Status.LastAttempt, b.Status.Passed, b.Status.Claims = now, true, cl
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()

	check := func() (int, string) {
		var stdout, stderr bytes.Buffer
		code := Run(ctx, []string{"policy", "check", pol, "--against-records", "--state-dir", dir}, &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}
	code, out := check()
	for _, want := range []string{
		"worker-fail  worker  tpm   FAIL " + string(attest.ReasonPolicySecureBootOff),
		"worker-new   worker  tpm   " + verdictNotJudged,
		"worker-pass  worker  tpm   " + verdictPass,
		"1 of 3 nodes would fail at their next re-attestation; 1 could not be judged",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if code != 1 {
		t.Errorf("a node would fail: exit %d, want 1\n%s", code, out)
	}

	// The failing node released: nothing would fail, one is not judged.
	var stdout, stderr bytes.Buffer
	if c := Run(ctx, []string{"release", "worker-fail", "--state-dir", dir}, &stdout, &stderr); c != 0 {
		t.Fatalf("release: %s", stderr.String())
	}
	code, out = check()
	if code != 0 || !strings.Contains(out, "0 of 2 nodes would fail at their next re-attestation; 1 could not be judged") {
		t.Errorf("no node would fail: exit %d, want 0\n%s", code, out)
	}
}
