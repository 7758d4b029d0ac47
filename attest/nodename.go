package attest

import "regexp"

// MaxNodeNameLength is the longest node name Kubernetes accepts.
const MaxNodeNameLength = 253

// nodeNameRE is a DNS-1123 subdomain: lower-case labels of letters, digits
// and inner hyphens, joined by dots.
var nodeNameRE = regexp.MustCompile(`\A[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\z`)

// ValidNodeName reports whether name is a name Kubernetes allows a Node: a
// DNS-1123 subdomain of at most MaxNodeNameLength characters (as
// k8s.io/apimachinery's IsDNS1123Subdomain). It is the one node-name rule:
// a name a machine asks for (mcs), a name it reports about (mcs), a
// kubelet CSR's common name (approver), an EK inventory's names, and the
// store's keys all pass it.
func ValidNodeName(name string) bool {
	return len(name) <= MaxNodeNameLength && nodeNameRE.MatchString(name)
}
