package azuretpm

import (
	"encoding/hex"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
)

// Instance is what a verified Azure vTPM attestation establishes about the
// VM besides its boot: the subscription the attested document names and
// the VM ID both it and the AK certificate name. (attest.Claims will carry
// it in its shared instance description; until then, InstanceOf.)
type Instance struct {
	SubscriptionID string `json:"subscriptionID"`
	VMID           string `json:"vmID"`
}

// Identity is the instance's identity in Claims:
// "azure:<subscription id>/<vm id>".
func (i Instance) Identity() string { return "azure:" + i.SubscriptionID + "/" + i.VMID }

// InstanceOf returns the instance of claims Verify made (Kind azure-vtpm),
// read back from their Identity; false for any other claims.
func InstanceOf(c *attest.Claims) (Instance, bool) {
	if c == nil || c.Kind != attest.KindAzureVTPM {
		return Instance{}, false
	}
	rest, ok := strings.CutPrefix(c.Identity, "azure:")
	if !ok {
		return Instance{}, false
	}
	sub, vm, ok := strings.Cut(rest, "/")
	if !ok || !uuidRE.MatchString(sub) || !uuidRE.MatchString(vm) {
		return Instance{}, false
	}
	return Instance{SubscriptionID: sub, VMID: vm}, true
}

// IMDSNonce is the nonce a node asks IMDS to sign into the attested
// document for a session: the first 16 bytes of
// attest.BindingDigest(session nonce, kubelet key hash), in hex (32
// characters: the most IMDS takes). It makes the document fresh for that
// session and that kubelet key, as the quote's qualifying data does.
func IMDSNonce(nonce, kubeletKeySHA256 []byte) string {
	return hex.EncodeToString(attest.BindingDigest(nonce, kubeletKeySHA256)[:16])
}
