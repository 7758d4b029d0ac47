package attest

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// TestClaimsLegacyInstance: claims recorded by versions that kept the
// instance per cloud ("gcp", "aws") decode into Instance, field by field;
// claims written now round-trip.
func TestClaimsLegacyInstance(t *testing.T) {
	created := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, record string
		want         *InstanceClaims
	}{
		{"gcp record", `{"kind":"gcp","identity":"gcp:123/us-central1-a/42","gcp":{"projectID":"proj","projectNumber":"123","zone":"us-central1-a","instanceID":"42","instanceName":"w-0","instanceCreated":"2026-03-01T12:00:00Z","serviceAccount":"sa@proj.iam.gserviceaccount.com"}}`,
			&InstanceClaims{Cloud: CloudGCP, Account: "proj", AccountNumber: "123", Location: "us-central1-a", ID: "42", Name: "w-0", Created: created, ServiceAccount: "sa@proj.iam.gserviceaccount.com"}},
		{"gce-vtpm record", `{"kind":"gce-vtpm","identity":"gcp:123/us-central1-a/42","tpm":{"akName":"00","pcrBank":"sha256","pcrs":null,"resetCount":0,"restartCount":0,"clock":0,"boot":{"logEvents":0,"secureBootKnown":false,"secureBoot":false,"dbxKnown":false,"dbxEntries":0,"exitBootServices":false,"kernelCmdlineKnown":false},"ekSHA256":"","ekTrust":"gce-ak-certificate"},"gcp":{"projectID":"proj","projectNumber":"123","zone":"us-central1-a","instanceID":"42","instanceName":"w-0","instanceCreated":"0001-01-01T00:00:00Z"}}`,
			&InstanceClaims{Cloud: CloudGCP, Account: "proj", AccountNumber: "123", Location: "us-central1-a", ID: "42", Name: "w-0"}},
		{"aws record", `{"kind":"aws","identity":"aws:123456789012/eu-west-1/i-0abc","gcp":null,"aws":{"accountID":"123456789012","region":"eu-west-1","availabilityZone":"eu-west-1a","instanceID":"i-0abc","instanceType":"m5.large","imageID":"ami-1","privateIP":"10.0.0.5","pendingTime":"2026-03-01T12:00:00Z","privateDNSName":"ip-10-0-0-5.eu-west-1.compute.internal","liveChecked":true}}`,
			&InstanceClaims{Cloud: CloudAWS, Account: "123456789012", Location: "eu-west-1", AvailabilityZone: "eu-west-1a", ID: "i-0abc", Type: "m5.large", Image: "ami-1", PrivateIP: "10.0.0.5", Created: created, PrivateDNSName: "ip-10-0-0-5.eu-west-1.compute.internal", LiveChecked: true}},
		{"tpm record", `{"kind":"tpm","identity":"tpm-ek:ab"}`, nil},
		{"current record", `{"kind":"aws","identity":"aws:1/r/i","instance":{"cloud":"aws","account":"1","location":"r","id":"i","created":"2026-03-01T12:00:00Z","liveChecked":true}}`,
			&InstanceClaims{Cloud: CloudAWS, Account: "1", Location: "r", ID: "i", Created: created, LiveChecked: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Claims
			if err := json.Unmarshal([]byte(tc.record), &c); err != nil {
				t.Fatal(err)
			}
			if c.Kind == "" || c.Identity == "" {
				t.Errorf("kind %q identity %q: the other members were not decoded", c.Kind, c.Identity)
			}
			if !reflect.DeepEqual(c.Instance, tc.want) {
				t.Errorf("instance\n got %+v\nwant %+v", c.Instance, tc.want)
			}
			b, err := json.Marshal(&c)
			if err != nil {
				t.Fatal(err)
			}
			var again Claims
			if err := json.Unmarshal(b, &again); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(again, c) {
				t.Errorf("round trip of %s:\n got %+v\nwant %+v", b, again, c)
			}
		})
	}
}
