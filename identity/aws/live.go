package aws

import (
	"context"

	"github.com/nodeproof/nodeproof/attest"
)

// LiveChecker confirms a verified document's instance with the EC2 API.
// identity/aws/ec2live implements it with the AWS SDK's EC2 client, kept out
// of this package so that the node agent, which only collects evidence,
// does not link the EC2 API client.
type LiveChecker interface {
	// Check confirms the instance with the EC2 API; returns the private DNS name it has.
	//
	// A refusal is an *attest.Denial (InstanceNotRunning); any other error
	// means the API could not be asked and the caller should try again.
	Check(ctx context.Context, c *attest.InstanceClaims) (privateDNSName string, err error)
}
