package render

import (
	"errors"
	"testing"
)

// TestNegotiate is the negotiation table of the package documentation, one
// named case per row.
func TestNegotiate(t *testing.T) {
	const ign = "application/vnd.coreos.ignition+json"
	cases := []struct {
		name   string
		accept string
		want   Version
		err    bool
	}{
		{name: "no Accept header", accept: "", want: V2_2},
		{name: "curl", accept: "*/*", want: V2_2},
		{name: "browser", accept: "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", want: V2_2},
		{name: "text/plain", accept: "text/plain", want: V2_2},
		{name: "not a media type", accept: "an-invalid-accept-header", want: V2_2},
		{name: "only commas and spaces", accept: " , ,, ", want: V2_2},
		{name: "ignition type without version", accept: ign, want: V2_2},
		{name: "version not X.Y.Z is ignored", accept: ign + ";version=3.5", want: V2_2},
		{name: "version=1 is ignored", accept: ign + ";version=1", want: V2_2},
		{name: "Ignition 2.x real header", accept: ign + ";version=3.5.0, */*;q=0.1", want: V3_5},
		{name: "Ignition 2.x asking 3.4", accept: ign + ";version=3.4.0, */*;q=0.1", want: V3_4},
		{name: "Ignition 2.x asking 3.3", accept: ign + ";version=3.3.0, */*;q=0.1", want: V3_3},
		{name: "Ignition 2.x asking 3.2", accept: ign + ";version=3.2.0, */*;q=0.1", want: V3_2},
		{name: "Ignition 2.x asking 3.1", accept: ign + ";version=3.1.0, */*;q=0.1", want: V3_1},
		{name: "Ignition 0.x real header", accept: ign + "; version=2.4.0, " + ign + "; version=1; q=0.5, */*; q=0.1", want: V2_2},
		{name: "2.2.0", accept: ign + ";version=2.2.0", want: V2_2},
		{name: "2.4.0", accept: ign + ";version=2.4.0", want: V2_2},
		{name: "patch level within minor", accept: ign + ";version=3.4.7", want: V3_4},
		{name: "newer 3.x gets newest", accept: ign + ";version=3.6.0", want: V3_5},
		{name: "much newer 3.x gets newest", accept: ign + ";version=3.99.0", want: V3_5},
		{name: "3.6.0 experimental gets newest", accept: ign + ";version=3.6.0-experimental", want: V3_5},
		{name: "3.5.0 pre-release is below 3.5.0", accept: ign + ";version=3.5.0-rc1", want: V3_4},
		{name: "3.0.0 is not served", accept: ign + ";version=3.0.0", err: true},
		{name: "2.1.0 is not served", accept: ign + ";version=2.1.0", err: true},
		{name: "1.0.0 is not served", accept: ign + ";version=1.0.0", err: true},
		{name: "4.0.0 is not served", accept: ign + ";version=4.0.0, */*;q=0.1", err: true},
		{name: "unsupported then supported", accept: ign + ";version=4.0.0, " + ign + ";version=3.2.0;q=0.5", want: V3_2},
		{name: "higher q wins", accept: ign + ";version=3.1.0;q=0.2, " + ign + ";version=3.4.0;q=0.9", want: V3_4},
		{name: "equal q keeps header order", accept: ign + ";version=3.2.0, " + ign + ";version=3.4.0", want: V3_2},
		{name: "invalid q counts as 1", accept: ign + ";version=3.1.0;q=bogus, " + ign + ";version=3.4.0;q=0.9", want: V3_1},
		{name: "q=0 is still considered", accept: ign + ";version=3.3.0;q=0", want: V3_3},
		{name: "spaces around parameters", accept: "  " + ign + " ;  version=3.2.0 ; q=1  ", want: V3_2},
		{name: "first valid version parameter counts", accept: ign + ";version=x;version=3.3.0;version=3.1.0", want: V3_3},
		{name: "only the subtype is compared", accept: "foo/vnd.coreos.ignition+json;version=3.3.0", want: V3_3},
		{name: "subtype is case-sensitive", accept: "application/VND.COREOS.IGNITION+JSON;version=3.3.0", want: V2_2},
		{name: "version key is case-sensitive", accept: ign + ";Version=3.3.0", want: V2_2},
		{name: "unsupported ignition entry, other types", accept: ign + ";version=3.0.0, */*;q=0.1", err: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Negotiate(c.accept)
			if c.err {
				if !errors.Is(err, ErrUnsupportedVersion) {
					t.Fatalf("Negotiate(%q) = %v, %v; want ErrUnsupportedVersion", c.accept, got, err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("Negotiate(%q) = %v, %v; want %v", c.accept, got, err, c.want)
			}
		})
	}
}

func TestVersionString(t *testing.T) {
	want := []string{"2.2.0", "3.1.0", "3.2.0", "3.3.0", "3.4.0", "3.5.0"}
	for i, v := range SupportedVersions() {
		if v.String() != want[i] || !v.Valid() {
			t.Errorf("%d: %q valid=%v", i, v.String(), v.Valid())
		}
	}
	if Version(0).Valid() || Version(99).Valid() {
		t.Error("invalid versions reported valid")
	}
}
