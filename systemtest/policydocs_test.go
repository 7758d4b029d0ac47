package systemtest_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeproof/nodeproof/agent"
	"github.com/nodeproof/nodeproof/attest"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
	"github.com/nodeproof/nodeproof/internal/doctest"
	"github.com/nodeproof/nodeproof/internal/swtpm"
	"github.com/nodeproof/nodeproof/mcs/certs"
	"github.com/nodeproof/nodeproof/mcs/serve"
)

// TestPolicyReferenceTPMExample: the TPM example of docs/policy.md, as
// written, is the policy of a real server (directory mode), with its
// ek-roots/vendor holding the software TPM vendor's CA and its inventory
// (the doc's, with this test's machine's EK hash in place of the
// example's) beside it. Machines that booted RHEL 8 (the log the example's
// digests are from) enrol: a vendor-certified TPM in worker under the name
// its agent asks for, an inventory TPM in master under the inventory's
// name; a vendor-certified TPM is refused master (EKTrustNotAllowed); and
// the same document without serve.nodeNames refuses a vendor-certified
// TPM NodeNameNotEstablished, naming that setting on the machine's
// console.
func TestPolicyReferenceTPMExample(t *testing.T) {
	const doc = "../docs/policy.md"
	example, err := doctest.Named(doc, "tpm")
	if err != nil {
		t.Fatal(err)
	}
	inventoryExample, err := doctest.Named(doc, "tpm-inventory")
	if err != nil {
		t.Fatal(err)
	}
	const withoutNodeNames = "    serve:\n      nodeNames: requested"
	ctx := context.Background()
	rhel8 := firmwaretestdata.MustLog("rhel8-uefi")
	for _, tc := range []struct {
		name   string
		policy string // the document served
		check  func(t *testing.T, s *server, enrol func(m *swtpm.Machine, pool, node string) (string, error), newMachine func() *swtpm.Machine)
	}{
		{"as written", example.Text, func(t *testing.T, s *server, enrol func(*swtpm.Machine, string, string) (string, error), newMachine func() *swtpm.Machine) {
			if node, err := enrol(newMachine(), "worker", "worker-1"); err != nil || node != "worker-1" {
				t.Errorf("a vendor-certified TPM in worker asking for worker-1: node %q, %v", node, err)
			}
			if node, err := enrol(s.inventoried, "master", ""); err != nil || node != "master-0" {
				t.Errorf("the inventory's TPM in master: node %q, %v; want the inventory's master-0", node, err)
			}
			_, err := enrol(newMachine(), "master", "master-9")
			if r := refusalReason(err); r != attest.ReasonPolicyEKTrust {
				t.Errorf("a vendor-certified TPM in master: %v; want %s", err, attest.ReasonPolicyEKTrust)
			}
		}},
		{"without serve.nodeNames", strings.Replace(example.Text, withoutNodeNames, "", 1), func(t *testing.T, s *server, enrol func(*swtpm.Machine, string, string) (string, error), newMachine func() *swtpm.Machine) {
			_, err := enrol(newMachine(), "worker", "worker-2")
			var r *agent.Refused
			if !errors.As(err, &r) || r.Refusal.Reason != attest.ReasonPolicyNodeNameMissing || !strings.Contains(r.Refusal.Detail, "pools.worker.serve.nodeNames") {
				t.Errorf("a vendor-certified TPM in a pool without serve.nodeNames: %v; want %s naming pools.worker.serve.nodeNames", err, attest.ReasonPolicyNodeNameMissing)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.policy == example.Text && !strings.Contains(example.Text, withoutNodeNames) {
				t.Fatalf("the example no longer says %q", withoutNodeNames)
			}
			dir := t.TempDir()
			// The vendor: a software TPM manufacturer, whose CA is the
			// example's ek-roots/vendor.
			man, err := swtpm.NewManufacturer(filepath.Join(dir, "vendor"))
			if err != nil {
				t.Fatal(err)
			}
			inventoried := bootedMachine(t, man, rhel8)
			roots, err := man.RootsDir()
			if err != nil {
				t.Fatal(err)
			}
			copyDir(t, roots, filepath.Join(dir, "ek-roots", "vendor"))
			// The inventory of the doc, naming this machine's EK.
			inv := inventoryExample.Text
			old := strings.Fields(strings.SplitN(strings.SplitN(inv, "ekSHA256:", 2)[1], "\n", 2)[0])[0]
			if err := os.WriteFile(filepath.Join(dir, "ek-inventory.yaml"), []byte(strings.Replace(inv, old, ekHash(t, inventoried), 1)), 0o600); err != nil {
				t.Fatal(err)
			}
			policyFile := filepath.Join(dir, "policy.yaml")
			if err := os.WriteFile(policyFile, []byte(tc.policy), 0o600); err != nil {
				t.Fatal(err)
			}
			s := startServerWith(t, nil, func(c *serve.Config) { c.Policy = policyFile })
			s.man, s.inventoried = man, inventoried
			bundle, err := os.ReadFile(filepath.Join(s.stateDir, "certs", "current", certs.CABundleFileName))
			if err != nil {
				t.Fatal(err)
			}
			enrol := func(m *swtpm.Machine, pool, node string) (string, error) {
				var console bytes.Buffer
				err := agent.Run(ctx, agent.Config{
					Server: s.url, CABundle: bundle, Pool: pool, NodeName: node, Evidence: agent.TPMEvidence{Collector: m.Collector},
					KubeletKeyPath: filepath.Join(t.TempDir(), "kubelet.key"), Mode: agent.ModePointer, IgnitionDir: t.TempDir(), Console: &console,
				})
				t.Logf("%s in %s:\n%s", node, pool, console.String())
				if err != nil {
					return "", err
				}
				_, after, ok := strings.Cut(console.String(), "attested: node ")
				if !ok {
					return "", errors.New("the console does not say the node")
				}
				return strings.Fields(after)[0][:len(strings.Fields(after)[0])-1], nil
			}
			tc.check(t, s, enrol, func() *swtpm.Machine { return bootedMachine(t, s.man, rhel8) })
		})
	}
}

// bootedMachine is a new simulated machine of man, booted from log.
func bootedMachine(t *testing.T, man *swtpm.Manufacturer, log []byte) *swtpm.Machine {
	t.Helper()
	m, err := man.NewMachine(context.Background(), t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// ekHash is the inventory's ekSHA256 of m's EK (what the agent presents).
func ekHash(t *testing.T, m *swtpm.Machine) string {
	t.Helper()
	req, err := m.Collector.Request()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(req.EKPublic)
	return hex.EncodeToString(sum[:])
}

func refusalReason(err error) attest.Reason {
	var r *agent.Refused
	if errors.As(err, &r) {
		return r.Refusal.Reason
	}
	return ""
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	es, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
