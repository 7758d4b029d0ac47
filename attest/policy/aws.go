package policy

import "github.com/nodeproof/nodeproof/attest"

// AWSPolicy is what an EC2 instance must be. A pool that takes AWS
// evidence lists its accounts, or says anyAccount: an empty list never
// means any account in the world.
type AWSPolicy struct {
	// Accounts are allowed AWS account IDs (required unless AnyAccount).
	Accounts []string `yaml:"accounts"`
	// AnyAccount accepts an instance of any AWS account: anyone with an
	// EC2 instance anywhere could then attest. For test setups only;
	// logged as a warning when the server starts.
	AnyAccount bool `yaml:"anyAccount"`
	// Regions are allowed regions; required unless AnyRegion.
	Regions []string `yaml:"regions"`
	// AnyRegion accepts every region of the allowed accounts. Logged at
	// start.
	AnyRegion bool `yaml:"anyRegion"`
	// RequireLiveCheck refuses documents the EC2 API did not confirm (the
	// instance running, in the expected VPC and tags).
	RequireLiveCheck bool `yaml:"requireLiveCheck"`
	// NodeName is the node name an attested instance gets:
	// "privateDNSName" (the default, what EC2 and the AWS cloud provider
	// name nodes) or "instanceID". Never the name the machine asks for.
	NodeName string `yaml:"nodeName"`
}

// AWS node name choices.
const (
	AWSNodeNamePrivateDNS = "privateDNSName"
	AWSNodeNameInstanceID = "instanceID"
)

// evaluateAWS checks the account (AccountNotAllowed), the region
// (RegionNotAllowed) and, if required, that the EC2 API confirmed the
// instance (LiveCheckRequired).
// Each refusal names the setting (in, e.g. "pools.worker.aws.").
func evaluateAWS(in string, a *AWSPolicy, c *attest.InstanceClaims) error {
	if !a.AccountList().Allows(c.Account) {
		return attest.DenySetting(attest.ReasonPolicyAccount, in+"accounts", "account %s is not in %saccounts", c.Account, in)
	}
	if !a.RegionList().Allows(c.Location) {
		return attest.DenySetting(attest.ReasonPolicyRegion, in+"regions", "region %s is not in %sregions", c.Location, in)
	}
	if a.RequireLiveCheck && !c.LiveChecked {
		return attest.DenySetting(attest.ReasonPolicyLiveCheck, in+"requireLiveCheck", "the EC2 API did not confirm this instance, and %srequireLiveCheck is set (the server's --aws-live-check-region turns the check on)", in)
	}
	return nil
}

// AccountList is aws.accounts with aws.anyAccount.
func (a AWSPolicy) AccountList() AllowList {
	return AllowList{Field: "aws.accounts", AnyField: "aws.anyAccount", What: "accounts whose instances may attest",
		Items: a.Accounts, Any: a.AnyAccount, Open: "aws.anyAccount: an instance of any AWS account in the world may attest", Wide: true}
}

// RegionList is aws.regions with aws.anyRegion.
func (a AWSPolicy) RegionList() AllowList {
	return AllowList{Field: "aws.regions", AnyField: "aws.anyRegion", What: "regions",
		Items: a.Regions, Any: a.AnyRegion, Open: "aws.anyRegion: every region of the listed accounts"}
}
