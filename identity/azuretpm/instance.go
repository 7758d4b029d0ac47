package azuretpm

import (
	"encoding/hex"

	"github.com/nodeproof/nodeproof/attest"
)

// Identity is an Azure VM's identity in Claims:
// "azure:<subscription id>/<vm id>" (attest.ParseIdentity's form).
func Identity(subscriptionID, vmID string) string { return "azure:" + subscriptionID + "/" + vmID }

// IMDSNonce is the nonce a node asks IMDS to sign into the attested
// document for a session: the first 16 bytes of
// attest.BindingDigest(session nonce, kubelet key hash), in hex (32
// characters: the most IMDS takes). It makes the document fresh for that
// session and that kubelet key, as the quote's qualifying data does.
func IMDSNonce(nonce, kubeletKeySHA256 []byte) string {
	return hex.EncodeToString(attest.BindingDigest(nonce, kubeletKeySHA256)[:16])
}
