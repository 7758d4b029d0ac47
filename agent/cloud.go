package agent

import (
	"context"
	"fmt"

	"cloud.google.com/go/compute/metadata"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/gcp"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// GCPEvidence is a GCE instance identity token, minted by the metadata
// server for the audience the server's challenge names (it binds the
// session and the kubelet key).
type GCPEvidence struct {
	// Metadata is the metadata client (nil: the library's default, which
	// honours GCE_METADATA_HOST).
	Metadata *metadata.Client
}

// Kind implements Evidence.
func (GCPEvidence) Kind() attest.Kind { return attest.KindGCP }

// Attest implements Evidence.
func (e GCPEvidence) Attest(ctx context.Context, c *Client, pool, nodeName string, kubeletPKIX []byte) (*api.VerifyResponse, error) {
	return c.attest(ctx, func() (*api.ChallengeRequest, error) {
		return challengeRequest(attest.KindGCP, pool, nodeName, kubeletPKIX, &gcp.ChallengeRequest{}), nil
	}, func(ch *api.ChallengeResponse) (*api.VerifyRequest, error) {
		gc, err := challengeOf[gcp.Challenge](ch, attest.KindGCP)
		if err != nil {
			return nil, err
		}
		ev, err := gcp.Collect(ctx, e.Metadata, gc.Audience)
		if err != nil {
			return nil, fmt.Errorf("identity token from the metadata server: %w", err)
		}
		return verifyRequest(attest.KindGCP, ch, ev), nil
	})
}

// AWSEvidence is the EC2 instance identity document and its PKCS7
// signature, read over IMDSv2. The document carries no nonce: the server
// accepts one enrolment per instance within the document's age window.
type AWSEvidence struct {
	// IMDS is the metadata client (nil: aws.NewIMDSClient(""), the
	// instance's own, IMDSv2 only; aws.NewIMDSClient(url) for tests).
	IMDS *imds.Client
}

// Kind implements Evidence.
func (AWSEvidence) Kind() attest.Kind { return attest.KindAWS }

// Attest implements Evidence.
func (e AWSEvidence) Attest(ctx context.Context, c *Client, pool, nodeName string, kubeletPKIX []byte) (*api.VerifyResponse, error) {
	client := e.IMDS
	if client == nil {
		client = aws.NewIMDSClient("")
	}
	return c.attest(ctx, func() (*api.ChallengeRequest, error) {
		return challengeRequest(attest.KindAWS, pool, nodeName, kubeletPKIX, &aws.ChallengeRequest{}), nil
	}, func(ch *api.ChallengeResponse) (*api.VerifyRequest, error) {
		ev, err := aws.Collect(ctx, client)
		if err != nil {
			return nil, fmt.Errorf("identity document from IMDS: %w", err)
		}
		return verifyRequest(attest.KindAWS, ch, ev), nil
	})
}
