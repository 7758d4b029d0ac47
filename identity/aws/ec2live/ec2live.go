// Package ec2live is the server's optional EC2 live check of AWS evidence:
// Checker implements identity/aws's LiveChecker (Options.Live) by asking the
// EC2 API about the instance a verified document names, and NewClient
// builds the EC2 client it calls with the AWS SDK's default credential
// chain. It is its own package so that only the server links the EC2 API
// client and the SDK's configuration and credential providers; the node
// agent imports identity/aws to collect evidence and must not.
package ec2live

import (
	"context"
	"errors"
	"fmt"
	"slices"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/identity/aws"
)

var _ aws.LiveChecker = (*Checker)(nil)

// NewClient returns a client calling EC2 in region with the AWS SDK's
// default credential chain (config.LoadDefaultConfig), in its order: the
// environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN),
// the shared config and credentials files (AWS_PROFILE, AWS_CONFIG_FILE,
// AWS_SHARED_CREDENTIALS_FILE), web identity (IRSA: AWS_ROLE_ARN and
// AWS_WEB_IDENTITY_TOKEN_FILE), ECS container credentials, then the EC2
// instance role. Credentials are resolved at the first live check, cached,
// and refreshed before they expire. endpoint, when set, replaces the
// region's EC2 endpoint.
func NewClient(ctx context.Context, region, endpoint string) (*ec2.Client, error) {
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(region))
	if err != nil {
		return nil, fmt.Errorf("ec2live: AWS SDK configuration: %w", err)
	}
	return ec2.NewFromConfig(cfg, func(o *ec2.Options) {
		if endpoint != "" {
			o.BaseEndpoint = awssdk.String(endpoint)
		}
	}), nil
}

// Checker is an aws.LiveChecker that calls DescribeInstances for the
// instance ID, with the credentials and Region of Client. Its checks, each
// refused with InstanceNotRunning:
//   - Client's Region is the document's (one EC2 endpoint serves one Region);
//   - the instance exists for Client's credentials and is reported once;
//   - its reservation belongs to the document's account (so credentials
//     that see several accounts cannot confirm an instance of another);
//   - its state is running (not pending, stopping, stopped, terminated);
//   - its Availability Zone and primary private IP are the document's;
//   - its VPC is one of VPCs, when VPCs is set;
//   - it carries every tag of Tags with exactly that value, when set.
//
// Errors that say the instance ID does not exist or is malformed are
// refusals; every other API or transport error is returned as is (not a
// Denial).
type Checker struct {
	// Client calls EC2; required. It needs ec2:DescribeInstances.
	Client *ec2.Client
	// VPCs, when non-empty, are the VPC IDs an instance may be in.
	VPCs []string
	// Tags, when non-empty, must all be on the instance with these values.
	Tags map[string]string
}

// Check implements aws.LiveChecker.
func (l *Checker) Check(ctx context.Context, c *attest.InstanceClaims) (string, error) {
	if l == nil || l.Client == nil {
		return "", errors.New("ec2live: Checker has no Client")
	}
	if c == nil {
		return "", errors.New("ec2live: live check without claims")
	}
	if r := l.Client.Options().Region; r != "" && r != c.Location {
		return "", attest.Deny(attest.ReasonInstanceNotLive, "the EC2 live check serves region %s, the instance is in %s", r, c.Location)
	}
	out, err := l.Client.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{c.ID}})
	if err != nil {
		var ae smithy.APIError
		if errors.As(err, &ae) {
			switch ae.ErrorCode() {
			case "InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed":
				return "", attest.Deny(attest.ReasonInstanceNotLive, "EC2 does not know instance %s: %s", c.ID, ae.ErrorCode())
			}
		}
		return "", fmt.Errorf("ec2live: DescribeInstances: %w", err)
	}
	var (
		found *types.Instance
		owner string
		n     int
	)
	for _, r := range out.Reservations {
		for i := range r.Instances {
			if deref(r.Instances[i].InstanceId) == c.ID {
				found, owner = &r.Instances[i], deref(r.OwnerId)
				n++
			}
		}
	}
	switch {
	case n == 0:
		return "", attest.Deny(attest.ReasonInstanceNotLive, "EC2 does not report instance %s", c.ID)
	case n > 1:
		return "", attest.Deny(attest.ReasonInstanceNotLive, "EC2 reports instance %s %d times", c.ID, n)
	}
	if owner != c.Account {
		return "", attest.Deny(attest.ReasonInstanceNotLive, "instance %s belongs to account %q, the document says %s", c.ID, owner, c.Account)
	}
	state := types.InstanceStateName("")
	if found.State != nil {
		state = found.State.Name
	}
	if state != types.InstanceStateNameRunning {
		return "", attest.Deny(attest.ReasonInstanceNotLive, "instance %s is %q, not running", c.ID, state)
	}
	var az string
	if found.Placement != nil {
		az = deref(found.Placement.AvailabilityZone)
	}
	if az != c.AvailabilityZone {
		return "", attest.Deny(attest.ReasonInstanceNotLive, "instance %s is in %q, the document says %s", c.ID, az, c.AvailabilityZone)
	}
	if ip := deref(found.PrivateIpAddress); ip != c.PrivateIP {
		return "", attest.Deny(attest.ReasonInstanceNotLive, "instance %s has private IP %q, the document says %s", c.ID, ip, c.PrivateIP)
	}
	if len(l.VPCs) > 0 && !slices.Contains(l.VPCs, deref(found.VpcId)) {
		return "", attest.Deny(attest.ReasonInstanceNotLive, "instance %s is in VPC %q, not an allowed one", c.ID, deref(found.VpcId))
	}
	for k, want := range l.Tags {
		got, ok := tagValue(found.Tags, k)
		if !ok {
			return "", attest.Deny(attest.ReasonInstanceNotLive, "instance %s has no tag %q", c.ID, k)
		}
		if got != want {
			return "", attest.Deny(attest.ReasonInstanceNotLive, "instance %s tag %q is %q, want %q", c.ID, k, got, want)
		}
	}
	return deref(found.PrivateDnsName), nil
}

func tagValue(tags []types.Tag, key string) (string, bool) {
	for _, t := range tags {
		if deref(t.Key) == key {
			return deref(t.Value), true
		}
	}
	return "", false
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
