package policy

import "github.com/nodeproof/nodeproof/attest"

// AzurePolicy is what an Azure VM must be. A pool that takes Azure
// evidence lists its subscriptions, or says anySubscription: an empty list
// never means any subscription in the world. Azure's attested document
// names no location, so there is no location list.
type AzurePolicy struct {
	// Subscriptions are allowed subscription IDs, lower-case UUIDs as the
	// attested document writes them (required unless AnySubscription).
	Subscriptions []string `yaml:"subscriptions"`
	// AnySubscription accepts a VM of any Azure subscription: anyone with
	// a Trusted Launch VM anywhere could then attest. For test setups
	// only; logged as a warning when the server starts.
	AnySubscription bool `yaml:"anySubscription"`
}

// evaluateAzure checks the subscription (SubscriptionNotAllowed). The
// refusal names the setting (in, e.g. "pools.worker.azure.").
func evaluateAzure(in string, a *AzurePolicy, c *attest.InstanceClaims) error {
	if !a.SubscriptionList().Allows(c.Account) {
		return attest.DenySetting(attest.ReasonPolicySubscription, in+"subscriptions", "subscription %s is not in %ssubscriptions", c.Account, in)
	}
	return nil
}

// SubscriptionList is azure.subscriptions with azure.anySubscription.
func (a AzurePolicy) SubscriptionList() AllowList {
	return AllowList{Field: "azure.subscriptions", AnyField: "azure.anySubscription", What: "subscriptions whose VMs may attest",
		Items: a.Subscriptions, Any: a.AnySubscription, Open: "azure.anySubscription: a VM of any Azure subscription in the world may attest", Wide: true}
}
