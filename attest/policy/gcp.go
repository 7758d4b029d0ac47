package policy

import (
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// GCPPolicy is what a GCP instance must be. A pool that takes GCP evidence
// lists its projects, or says anyProject: an empty list never means any
// project in the world.
type GCPPolicy struct {
	// Projects are allowed project IDs (required unless AnyProject).
	Projects []string `yaml:"projects"`
	// AnyProject accepts an instance of any GCP project: anyone with a
	// GCE instance anywhere could then attest. For test setups only;
	// logged as a warning when the server starts.
	AnyProject bool `yaml:"anyProject"`
	// Zones are allowed zones (e.g. us-central1-a); required unless
	// AnyZone.
	Zones []string `yaml:"zones"`
	// AnyZone accepts every zone of the allowed projects. Logged at start.
	AnyZone bool `yaml:"anyZone"`
	// MaxInstanceAge refuses instances created longer ago (a machine being
	// provisioned is minutes old; a token minted months later comes from
	// something running on the instance, not from its first boot). Unset:
	// DefaultGCPMaxInstanceAge, as long as an AWS document is accepted.
	MaxInstanceAge Duration `yaml:"maxInstanceAge"`
}

// DefaultGCPMaxInstanceAge is GCPPolicy.MaxInstanceAge when unset: the
// same first-boot window as the AWS document age (identity/aws).
const DefaultGCPMaxInstanceAge = time.Hour

// evaluateGCP checks the project (ProjectNotAllowed), the zone
// (ZoneNotAllowed) and the instance's age at verification time
// (InstanceTooOld: more than maxInstanceAge, DefaultGCPMaxInstanceAge when
// unset, after the instance was created).
// Each refusal names the setting (in, e.g. "pools.worker.gcp.").
func evaluateGCP(in string, g *GCPPolicy, c *attest.InstanceClaims, at time.Time, firstBoot bool) error {
	if !g.ProjectList().Allows(c.Account) {
		return attest.DenySetting(attest.ReasonPolicyProject, in+"projects", "project %s is not in %sprojects", c.Account, in)
	}
	if !g.ZoneList().Allows(c.Location) {
		return attest.DenySetting(attest.ReasonPolicyZone, in+"zones", "zone %s is not in %szones", c.Location, in)
	}
	maxAge := g.MaxInstanceAge.Duration
	if maxAge == 0 {
		maxAge = DefaultGCPMaxInstanceAge
	}
	if firstBoot && at.Sub(c.Created) > maxAge {
		return attest.DenySetting(attest.ReasonPolicyInstanceAge, in+"maxInstanceAge", "instance created %s, more than %s ago: first-boot evidence is accepted only within %smaxInstanceAge of the instance's creation", c.Created.UTC().Format(time.RFC3339), maxAge, in)
	}
	return nil
}

// ProjectList is gcp.projects with gcp.anyProject.
func (g GCPPolicy) ProjectList() AllowList {
	return AllowList{Field: "gcp.projects", AnyField: "gcp.anyProject", What: "projects whose instances may attest",
		Items: g.Projects, Any: g.AnyProject, Open: "gcp.anyProject: an instance of any GCP project in the world may attest", Wide: true}
}

// ZoneList is gcp.zones with gcp.anyZone.
func (g GCPPolicy) ZoneList() AllowList {
	return AllowList{Field: "gcp.zones", AnyField: "gcp.anyZone", What: "zones",
		Items: g.Zones, Any: g.AnyZone, Open: "gcp.anyZone: every zone of the listed projects"}
}
