package render

import "fmt"

// Version is an Ignition config spec version the server can serve.
type Version int

// The spec versions a Renderer serves. Internally every config is held as
// spec 3.5 (what current MCOs store in rendered MachineConfigs) and
// translated down on demand.
const (
	V2_2 Version = iota + 1
	V3_1
	V3_2
	V3_3
	V3_4
	V3_5
)

// Newest is the newest spec version served; a client asking for a newer
// 3.x gets this one.
const Newest = V3_5

// SupportedVersions lists every version a Renderer serves, oldest first.
func SupportedVersions() []Version {
	return []Version{V2_2, V3_1, V3_2, V3_3, V3_4, V3_5}
}

// String is the spec version as Ignition writes it, e.g. "3.5.0".
func (v Version) String() string {
	switch v {
	case V2_2:
		return "2.2.0"
	case V3_1:
		return "3.1.0"
	case V3_2:
		return "3.2.0"
	case V3_3:
		return "3.3.0"
	case V3_4:
		return "3.4.0"
	case V3_5:
		return "3.5.0"
	}
	return fmt.Sprintf("Version(%d)", int(v))
}

// Valid reports whether v is one of SupportedVersions.
func (v Version) Valid() bool { return v >= V2_2 && v <= V3_5 }

// major is the spec major version: 2 or 3.
func (v Version) major() int {
	if v == V2_2 {
		return 2
	}
	return 3
}
