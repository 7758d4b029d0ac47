package agent

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws"
	"github.com/nodeproof/nodeproof/identity/azuretpm"
	"github.com/nodeproof/nodeproof/identity/gcevtpm"
	"github.com/nodeproof/nodeproof/identity/nitrotpm"
	"github.com/nodeproof/nodeproof/mcs/api"
)

// GCEVTPMEvidence is a GCE Shielded VM's vTPM: the AK Google provisioned
// (template and certificate in NV), a quote over the server's nonce and
// the kubelet key, and the event log. gcevtpm.NewCollector refuses a vTPM
// whose AK has no certificate (ErrNoCertificate).
type GCEVTPMEvidence struct{ Collector *gcevtpm.Collector }

// Kind implements Evidence.
func (GCEVTPMEvidence) Kind() attest.Kind { return attest.KindGCEVTPM }

// Attest implements Evidence.
func (e GCEVTPMEvidence) Attest(ctx context.Context, c *Client, pool, nodeName string, kubeletPKIX []byte) (*api.VerifyResponse, error) {
	keySHA, err := attest.KeySHA256(kubeletPKIX)
	if err != nil {
		return nil, err
	}
	return c.attest(ctx, func() (*api.ChallengeRequest, error) {
		return challengeRequest(attest.KindGCEVTPM, pool, nodeName, kubeletPKIX, e.Collector.Request()), nil
	}, func(ch *api.ChallengeResponse) (*api.VerifyRequest, error) {
		gc, err := challengeOf[gcevtpm.Challenge](ch, attest.KindGCEVTPM)
		if err != nil {
			return nil, err
		}
		ev, err := e.Collector.Answer(gc, keySHA)
		if err != nil {
			return nil, fmt.Errorf("answer the challenge with the GCE vTPM: %w", err)
		}
		return verifyRequest(attest.KindGCEVTPM, ch, ev), nil
	})
}

// AzureVTPMEvidence is an Azure Trusted Launch VM's vTPM: the AK Azure
// provisioned (persistent handle 0x81000003) and its certificate (NV
// 0x01C101D0), a quote over the server's nonce and the kubelet key, the
// event log, and IMDS's attested document asked for with a nonce of the
// same two (it names the VM's subscription, which the certificate does
// not). azuretpm.NewCollector refuses a TPM without the certificate
// (ErrNotAzure) or the AK (ErrNoAK).
type AzureVTPMEvidence struct{ Collector *azuretpm.Collector }

// Kind implements Evidence.
func (AzureVTPMEvidence) Kind() attest.Kind { return attest.KindAzureVTPM }

// Attest implements Evidence.
func (e AzureVTPMEvidence) Attest(ctx context.Context, c *Client, pool, nodeName string, kubeletPKIX []byte) (*api.VerifyResponse, error) {
	keySHA, err := attest.KeySHA256(kubeletPKIX)
	if err != nil {
		return nil, err
	}
	return c.attest(ctx, func() (*api.ChallengeRequest, error) {
		return challengeRequest(attest.KindAzureVTPM, pool, nodeName, kubeletPKIX, e.Collector.Request()), nil
	}, func(ch *api.ChallengeResponse) (*api.VerifyRequest, error) {
		ac, err := challengeOf[azuretpm.Challenge](ch, attest.KindAzureVTPM)
		if err != nil {
			return nil, err
		}
		ev, err := e.Collector.Answer(ac, keySHA)
		if err != nil {
			return nil, fmt.Errorf("answer the challenge with the Azure vTPM: %w", err)
		}
		return verifyRequest(attest.KindAzureVTPM, ch, ev), nil
	})
}

// NitroTPMEvidence is an EC2 instance's NitroTPM: an attestation document
// the Nitro hypervisor signs over the server's nonce and the AK's public
// key, a quote of the SHA-384 bank by that AK, the event log, and the
// instance identity document read over IMDSv2 (which names the account
// and Region the attestation document does not).
type NitroTPMEvidence struct {
	Collector *nitrotpm.Collector
	// IMDS is the metadata client (nil: aws.NewIMDSClient(""), the
	// instance's own, IMDSv2 only).
	IMDS *imds.Client
}

// Kind implements Evidence.
func (NitroTPMEvidence) Kind() attest.Kind { return attest.KindNitroTPM }

// Attest implements Evidence.
func (e NitroTPMEvidence) Attest(ctx context.Context, c *Client, pool, nodeName string, kubeletPKIX []byte) (*api.VerifyResponse, error) {
	keySHA, err := attest.KeySHA256(kubeletPKIX)
	if err != nil {
		return nil, err
	}
	client := e.IMDS
	if client == nil {
		client = aws.NewIMDSClient("")
	}
	return c.attest(ctx, func() (*api.ChallengeRequest, error) {
		return challengeRequest(attest.KindNitroTPM, pool, nodeName, kubeletPKIX, e.Collector.Request()), nil
	}, func(ch *api.ChallengeResponse) (*api.VerifyRequest, error) {
		nc, err := challengeOf[nitrotpm.Challenge](ch, attest.KindNitroTPM)
		if err != nil {
			return nil, err
		}
		id, err := aws.Collect(ctx, client)
		if err != nil {
			return nil, fmt.Errorf("identity document from IMDS: %w", err)
		}
		ev, err := e.Collector.Answer(nc, keySHA, *id)
		if err != nil {
			return nil, fmt.Errorf("answer the challenge with the NitroTPM: %w", err)
		}
		return verifyRequest(attest.KindNitroTPM, ch, ev), nil
	})
}
