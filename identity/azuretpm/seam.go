package azuretpm

import "github.com/nodeproof/nodeproof/attest"

// Seam is v as an attest.Verifier, the server's one view of every kind:
// its messages are this package's ChallengeRequest and Evidence.
func (v *Verifier) Seam() attest.Verifier {
	return attest.Seam(attest.KindAzureVTPM, func(in attest.ChallengeInput, req *ChallengeRequest) (any, *attest.Session, error) {
		return v.Challenge(in.Pool, in.KubeletKeySHA256, req)
	}, v.Verify)
}
