package attest

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

var nodeNames = []struct {
	name string
	in   string
	ok   bool
}{
	{"a short name", "worker-0", true},
	{"a fully qualified name", "ip-10-0-1-2.us-east-2.compute.internal", true},
	{"digits only", "0", true},
	{"the longest", strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61), true},
	{"one too long", strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 62), false},
	{"empty", "", false},
	{"upper case", "Worker-0", false},
	{"a leading hyphen", "-worker", false},
	{"a trailing hyphen", "worker-", false},
	{"an empty label", "worker..example", false},
	{"a trailing dot", "worker.", false},
	{"an underscore", "worker_0", false},
	{"a slash", "worker/0", false},
	{"a colon (a CN's prefix left on)", "system:node:worker-0", false},
	{"a newline after", "worker-0\n", false},
	{"a newline before", "\nworker-0", false},
	{"a space", "worker 0", false},
	{"a non-ASCII letter", "wörker", false},
}

// TestValidNodeName: the rule, case by case.
func TestValidNodeName(t *testing.T) {
	for _, tc := range nodeNames {
		t.Run(tc.name, func(t *testing.T) {
			if got := ValidNodeName(tc.in); got != tc.ok {
				t.Fatalf("ValidNodeName(%q) = %v, want %v", tc.in, got, tc.ok)
			}
		})
	}
}

// TestValidNodeNameIsKubernetes: the rule is Kubernetes' own for a Node's
// name (apimachinery's IsDNS1123Subdomain), on every case above.
func TestValidNodeNameIsKubernetes(t *testing.T) {
	for _, tc := range nodeNames {
		if ours, theirs := ValidNodeName(tc.in), len(validation.IsDNS1123Subdomain(tc.in)) == 0; ours != theirs {
			t.Errorf("%s: %q: ValidNodeName %v, IsDNS1123Subdomain %v", tc.name, tc.in, ours, theirs)
		}
	}
}

// FuzzValidNodeName holds the rule to Kubernetes' on any input.
func FuzzValidNodeName(f *testing.F) {
	for _, tc := range nodeNames {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ours, theirs := ValidNodeName(s), len(validation.IsDNS1123Subdomain(s)) == 0; ours != theirs {
			t.Fatalf("%q: ValidNodeName %v, IsDNS1123Subdomain %v", s, ours, theirs)
		}
	})
}
