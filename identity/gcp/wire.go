package gcp

// The wire format of GCP evidence: JSON, the same envelope as the other
// kinds. The node needs nothing from the server but the audience, and
// sends back nothing but the token Google's metadata server minted for it.

// ChallengeRequest is the node's first message. GCP evidence needs nothing
// from the node before the challenge (the kubelet key hash travels in the
// common envelope); the type exists so every kind has the same two steps.
type ChallengeRequest struct{}

// Challenge is the server's answer: the audience the node must ask its
// metadata server to mint an identity token for. It is
// AudiencePrefix + AudiencePath + base64url(BindingDigest(nonce, kubelet
// key hash)), so the token serves one session and one kubelet key.
type Challenge struct {
	Audience string `json:"audience"`
}

// Evidence is the node's second message: the identity token, a compact
// JWS exactly as the metadata server returned it (format=full).
type Evidence struct {
	Token string `json:"token"`
}

// Bounds on what crosses the network, checked before any parsing.
const (
	// MaxTokenSize bounds an identity token. Google's full-format tokens
	// are about 1 KiB (a few hundred bytes more with license IDs).
	MaxTokenSize = 16 << 10
	// MaxAudienceSize bounds the audience a node asks for and a verifier
	// issues.
	MaxAudienceSize = 2048
	// maxClaimString bounds each string claim we keep.
	maxClaimString = 256
)

// AudiencePath is the path under AudiencePrefix that names GCP sessions.
const AudiencePath = "/attest/v1/gcp/"
