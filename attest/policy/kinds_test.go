package policy

import (
	"slices"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
)

// TestKindsTable: every row of the table of kinds is whole — an
// evaluation; a bank when the TPM's rules judge its boot; a cloud block
// among clouds, with its lists under its block's name — and names a kind
// once.
func TestKindsTable(t *testing.T) {
	seen := map[attest.Kind]bool{}
	for i, r := range kinds {
		t.Run(string(r.kind), func(t *testing.T) {
			if seen[r.kind] {
				t.Fatal("twice in the table")
			}
			seen[r.kind] = true
			switch {
			case r.evaluate == nil:
				t.Error("no evaluation")
			case r.boot && r.bank == "":
				t.Error("the boot rules judge it, but it names no bank")
			case !r.boot && r.bank != "":
				t.Errorf("bank %s without the boot rules", r.bank)
			case r.cloud == nil && !r.boot:
				t.Error("neither an instance nor a boot to judge")
			case r.cloud != nil && !slices.Contains(clouds, r.cloud):
				t.Errorf("cloud block %s is not in clouds", r.cloud.block)
			}
			if r.cloud != nil {
				for _, l := range r.cloud.lists(&Pool{}) {
					if !l.judges(r.kind) {
						t.Errorf("its block's list %s does not judge it", l.Field)
					}
				}
			}
			if kindOf(r.kind) != &kinds[i] {
				t.Error("kindOf does not find its row")
			}
		})
	}
	var table []attest.Kind
	for _, r := range kinds {
		table = append(table, r.kind)
	}
	if !slices.Equal(table, attest.AllKinds()) {
		t.Errorf("the table's kinds %v are not attest's %v", table, attest.AllKinds())
	}
	if kindOf("azure-tdx") != nil {
		t.Error("kindOf found a kind the table does not have")
	}
}

// TestEvidenceNodeName: the evidence's node name, but the instance ID for
// an EC2 instance in a pool with aws.nodeName: instanceID; only for an
// instance of the kind's own cloud.
func TestEvidenceNodeName(t *testing.T) {
	p := &Policy{Pools: map[string]Pool{
		"byID":  {AWS: AWSPolicy{NodeName: AWSNodeNameInstanceID}},
		"byDNS": {AWS: AWSPolicy{NodeName: AWSNodeNamePrivateDNS}},
		"plain": {},
	}}
	ec2 := func(k attest.Kind, cloud string) *attest.Claims {
		return &attest.Claims{Kind: k, NodeName: "ip-10-0-0-5.ec2.internal", Instance: &attest.InstanceClaims{Cloud: cloud, ID: "i-0abc"}}
	}
	for _, tc := range []struct {
		name, pool string
		c          *attest.Claims
		want       string
	}{
		{"aws by instance ID", "byID", ec2(attest.KindAWS, attest.CloudAWS), "i-0abc"},
		{"NitroTPM by instance ID", "byID", ec2(attest.KindNitroTPM, attest.CloudAWS), "i-0abc"},
		{"aws by private DNS name", "byDNS", ec2(attest.KindAWS, attest.CloudAWS), "ip-10-0-0-5.ec2.internal"},
		{"aws by default", "plain", ec2(attest.KindAWS, attest.CloudAWS), "ip-10-0-0-5.ec2.internal"},
		{"gcp in a pool naming EC2 instances by ID", "byID", &attest.Claims{Kind: attest.KindGCP, NodeName: "w-0", Instance: &attest.InstanceClaims{Cloud: attest.CloudGCP, ID: "42"}}, "w-0"},
		{"aws claims naming a GCP instance", "byID", ec2(attest.KindAWS, attest.CloudGCP), "ip-10-0-0-5.ec2.internal"},
		{"tpm", "byID", &attest.Claims{Kind: attest.KindTPM, NodeName: "rack-1"}, "rack-1"},
		{"a pool not in the policy", "nope", ec2(attest.KindAWS, attest.CloudAWS), "ip-10-0-0-5.ec2.internal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.EvidenceNodeName(tc.pool, tc.c); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
