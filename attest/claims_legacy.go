package attest

import (
	"encoding/json"
	"time"
)

// UnmarshalJSON decodes claims, and those recorded by versions that kept
// the instance per cloud ("gcp": {...}, "aws": {...}; the stores keep
// claims as JSON) into Instance. Instance wins when a record has both.
func (c *Claims) UnmarshalJSON(b []byte) error {
	type plain Claims // without this method
	var v struct {
		plain
		GCP *legacyGCP `json:"gcp"`
		AWS *legacyAWS `json:"aws"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*c = Claims(v.plain)
	switch {
	case c.Instance != nil:
	case v.GCP != nil:
		c.Instance = v.GCP.instance()
	case v.AWS != nil:
		c.Instance = v.AWS.instance()
	}
	return nil
}

// legacyGCP is a GCP instance as claims recorded it before InstanceClaims.
type legacyGCP struct {
	ProjectID       string    `json:"projectID"`
	ProjectNumber   string    `json:"projectNumber"`
	Zone            string    `json:"zone"`
	InstanceID      string    `json:"instanceID"`
	InstanceName    string    `json:"instanceName"`
	InstanceCreated time.Time `json:"instanceCreated"`
	ServiceAccount  string    `json:"serviceAccount,omitempty"`
}

func (g *legacyGCP) instance() *InstanceClaims {
	return &InstanceClaims{Cloud: CloudGCP, Account: g.ProjectID, AccountNumber: g.ProjectNumber, Location: g.Zone,
		ID: g.InstanceID, Name: g.InstanceName, Created: g.InstanceCreated, ServiceAccount: g.ServiceAccount}
}

// legacyAWS is an EC2 instance as claims recorded it before
// InstanceClaims.
type legacyAWS struct {
	AccountID        string    `json:"accountID"`
	Region           string    `json:"region"`
	AvailabilityZone string    `json:"availabilityZone"`
	InstanceID       string    `json:"instanceID"`
	InstanceType     string    `json:"instanceType"`
	ImageID          string    `json:"imageID"`
	PrivateIP        string    `json:"privateIP"`
	PendingTime      time.Time `json:"pendingTime"`
	PrivateDNSName   string    `json:"privateDNSName,omitempty"`
	LiveChecked      bool      `json:"liveChecked"`
}

func (a *legacyAWS) instance() *InstanceClaims {
	return &InstanceClaims{Cloud: CloudAWS, Account: a.AccountID, Location: a.Region, AvailabilityZone: a.AvailabilityZone,
		ID: a.InstanceID, Type: a.InstanceType, Image: a.ImageID, PrivateIP: a.PrivateIP, Created: a.PendingTime,
		PrivateDNSName: a.PrivateDNSName, LiveChecked: a.LiveChecked}
}
