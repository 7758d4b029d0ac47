package render

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/coreos/go-semver/semver"
)

// ErrUnsupportedVersion is returned by Negotiate when the Accept header
// names Ignition spec versions and none of them can be served (e.g. 3.0.0,
// 2.1.0 or 4.0.0). The server answers such a request with 400, as the
// OpenShift MCS does.
var ErrUnsupportedVersion = errors.New("unsupported Ignition spec version in Accept header")

// ignitionSubtype is the media subtype Ignition uses in its Accept header:
// application/vnd.coreos.ignition+json;version=X.Y.Z.
const ignitionSubtype = "vnd.coreos.ignition+json"

// acceptEntry is one media range of an Accept header, reduced to what the
// negotiation looks at.
type acceptEntry struct {
	subtype string
	version *semver.Version // nil: absent or not a full semver (e.g. "1", "3.5")
	q       float32
}

// parseAccept splits an Accept header the way the MCS does: entries are
// separated by ",", parameters by ";", whitespace around both is trimmed;
// an entry without "/" is dropped; of the parameters only the first
// parseable "version" (a full semver) and the first parseable "q" count,
// keys are case-sensitive; q defaults to 1 (q=0 is not special). The entries
// come back stably sorted by descending q.
func parseAccept(header string) []acceptEntry {
	var out []acceptEntry
	for _, raw := range strings.Split(header, ",") {
		parts := strings.Split(strings.TrimSpace(raw), ";")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		_, subtype, ok := strings.Cut(parts[0], "/")
		if !ok {
			continue
		}
		e := acceptEntry{subtype: subtype, q: 1}
		var haveQ bool
		for _, p := range parts[1:] {
			key, val, ok := strings.Cut(p, "=")
			if !ok {
				continue
			}
			switch {
			case key == "version" && e.version == nil:
				if v, err := semver.NewVersion(val); err == nil {
					e.version = v
				}
			case key == "q" && !haveQ:
				if q, err := strconv.ParseFloat(val, 32); err == nil {
					e.q, haveQ = float32(q), true
				}
			}
		}
		out = append(out, e)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].q > out[j].q })
	return out
}

// servable maps a requested Ignition spec version to the one served:
// [2.2.0, 3.0.0) → 2.2; [3.N.0, 3.N+1.0) → 3.N for N = 1…4;
// [3.5.0, 4.0.0) → 3.5 (newer 3.x than supported gets the newest). Anything
// else (below 2.2.0, 3.0.x, 4.0.0 and up) is not servable.
func servable(v *semver.Version) (Version, bool) {
	lt := func(s string) bool { return v.LessThan(*semver.New(s)) }
	switch {
	case !lt("3.5.0") && lt("4.0.0"):
		return V3_5, true
	case !lt("3.4.0") && lt("3.5.0"):
		return V3_4, true
	case !lt("3.3.0") && lt("3.4.0"):
		return V3_3, true
	case !lt("3.2.0") && lt("3.3.0"):
		return V3_2, true
	case !lt("3.1.0") && lt("3.2.0"):
		return V3_1, true
	case !lt("2.2.0") && lt("3.0.0"):
		return V2_2, true
	}
	return 0, false
}

// Negotiate picks the Ignition spec version to serve for an Accept header,
// with the OpenShift MCS's rules (see the package documentation for the
// table). It returns ErrUnsupportedVersion (wrapped) when the header names
// Ignition versions and none is servable; the server answers 400.
func Negotiate(accept string) (Version, error) {
	var unsupported []string
	for _, e := range parseAccept(accept) {
		if e.subtype != ignitionSubtype || e.version == nil {
			continue
		}
		if v, ok := servable(e.version); ok {
			return v, nil
		}
		unsupported = append(unsupported, e.version.String())
	}
	if len(unsupported) > 0 {
		return 0, fmt.Errorf("%w: %s", ErrUnsupportedVersion, strings.Join(unsupported, ", "))
	}
	return V2_2, nil
}
