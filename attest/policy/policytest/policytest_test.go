package policytest

import (
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
)

// TestBuilder: what the builder sets is what the server loads, and
// nothing else is written.
func TestBuilder(t *testing.T) {
	b := New().EKRoot("swtpm-localca", t.TempDir()).
		Pool("worker", TPM("ca:swtpm-localca").SecureBoot().GCP().AWS().Requested().Lifetime(10*time.Second, 40*time.Second).MaxInstanceAge(time.Hour)).
		Pool("master", Public().Private().Token()).
		Pool("default", Public()).
		Pool("pinned", TPM().PCR(4, strings.Repeat("ab", 32)))
	doc, err := b.YAML()
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	w := p.Pools["worker"]
	switch {
	case len(w.Evidence) != 3 || w.Evidence[0] != attest.KindTPM:
		t.Errorf("worker evidence %v", w.Evidence)
	case !w.TPM.RequireSecureBoot || w.TPM.EKTrust[0] != "ca:swtpm-localca" || !w.TPM.BootComponents.Kernel.Any:
		t.Errorf("worker tpm %+v", w.TPM)
	case w.GCP.Projects[0] != GCPProject || !w.GCP.AnyZone || w.GCP.MaxInstanceAge.Duration != time.Hour:
		t.Errorf("worker gcp %+v", w.GCP)
	case w.AWS.Accounts[0] != AWSAccount || !w.AWS.AnyRegion:
		t.Errorf("worker aws %+v", w.AWS)
	case w.Serve.NodeNames != "requested" || w.Lifetime.StaleAfter.Duration != 40*time.Second:
		t.Errorf("worker serve %+v lifetime %+v", w.Serve, w.Lifetime)
	}
	if m := p.Pools["master"]; m.Serve.PublicTier() || !m.Serve.Token || len(m.Evidence) != 0 {
		t.Errorf("master %+v", m)
	}
	if got := p.Pools["pinned"].TPM.PCRs["4"]; got != strings.Repeat("ab", 32) {
		t.Errorf("pinned PCR 4 = %q:\n%s", got, doc)
	}
	if _, ok := p.Pools["default"]; !ok {
		t.Errorf("the empty pool is missing:\n%s", doc)
	}
	for _, unset := range []string{"allowSHA1", "deniedDigests", "zones", "regions", "reenrol", "insecurePort"} {
		if strings.Contains(string(doc), unset) {
			t.Errorf("%s is written though nothing set it:\n%s", unset, doc)
		}
	}
}

// TestBuilderRefusesWhatTheServerRefuses: a pool the server would not
// load (here: a TPM pool that allows no kernel) is an error, not a file.
func TestBuilderRefusesWhatTheServerRefuses(t *testing.T) {
	_, err := New().Pool("worker", TPM().Edit(func(p *policy.Pool) { p.TPM.BootComponents.Kernel = policy.DigestList{} })).YAML()
	if err == nil || !strings.Contains(err.Error(), "kernel") {
		t.Fatalf("YAML = %v, want the policy's refusal of the empty kernel list", err)
	}
}

// TestBuilderBootRules: signer rules, the SBAT minimum, the MOK
// constraint (an empty list written, not left out: it refuses every MOK),
// a reference set with its date, and audited rules load as set.
func TestBuilderBootRules(t *testing.T) {
	fp := strings.Repeat("cd", 32)
	until := time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC)
	any := policy.DigestList{Any: true}
	p, err := New().Pool("worker", TPM().SignedBy("kernel", fp).MinimumSBAT(map[string]int{"grub": 5}).MOKs().
		ReferenceSet(policy.ReferenceSet{Name: "previous", NotAfter: &until, Shim: any, Bootloader: any, Kernel: any}).Audit(policy.RuleMinimumSBAT)).Policy()
	if err != nil {
		t.Fatal(err)
	}
	tp := p.Pools["worker"].TPM
	switch {
	case tp.BootComponents.Kernel.Any || len(tp.BootComponents.Kernel.SignedBy) != 1 || tp.BootComponents.Kernel.SignedBy[0] != fp:
		t.Errorf("kernel %+v", tp.BootComponents.Kernel)
	case tp.MinimumSBAT["grub"] != 5 || tp.MachineOwnerKeys == nil || len(tp.MachineOwnerKeys.Allow) != 0:
		t.Errorf("SBAT %v, MOKs %+v", tp.MinimumSBAT, tp.MachineOwnerKeys)
	case len(tp.ReferenceSets) != 1 || tp.ReferenceSets[0].NotAfter == nil || !tp.ReferenceSets[0].NotAfter.Equal(until):
		t.Errorf("reference sets %+v", tp.ReferenceSets)
	case len(tp.Audit) != 1 || tp.Audit[0] != policy.RuleMinimumSBAT:
		t.Errorf("audit %v", tp.Audit)
	}
}

// TestBuilderCloudVTPM: the cloud vTPM kinds take their cloud's lists
// (narrowed by Zones and Regions) and any boot unless one is set.
func TestBuilderCloudVTPM(t *testing.T) {
	kernel := strings.Repeat("cd", 48)
	doc, err := New().Pool("gce", Public().GCEVTPM().Zones("us-central1-a")).
		Pool("ec2", Public().Boot("", "", kernel).NitroTPM().Regions("us-east-1")).
		Pool("azure", Public().AzureVTPM().Requested()).YAML()
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	g, e, a := p.Pools["gce"], p.Pools["ec2"], p.Pools["azure"]
	switch {
	case len(g.Evidence) != 1 || g.Evidence[0] != attest.KindGCEVTPM || g.GCP.Projects[0] != GCPProject || g.GCP.AnyZone || g.GCP.Zones[0] != "us-central1-a" || !g.TPM.BootComponents.Kernel.Any:
		t.Errorf("gce pool %+v", g)
	case len(e.Evidence) != 1 || e.Evidence[0] != attest.KindNitroTPM || e.AWS.Accounts[0] != AWSAccount || e.AWS.AnyRegion || e.AWS.Regions[0] != "us-east-1" || e.TPM.BootComponents.Kernel.Allow[0] != kernel:
		t.Errorf("ec2 pool %+v", e)
	case len(a.Evidence) != 1 || a.Evidence[0] != attest.KindAzureVTPM || len(a.Azure.Subscriptions) != 1 || a.Azure.Subscriptions[0] != AzureSubscription || a.Azure.AnySubscription || !a.TPM.BootComponents.Kernel.Any || a.Serve.NodeNames != "requested":
		t.Errorf("azure pool %+v", a)
	}
}
