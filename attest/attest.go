// Package attest is the shared vocabulary of nodeproof's evidence checks:
// the kinds of evidence, the claims a verifier vouches for, the session that
// ties a challenge to its answer, the binding of a kubelet key into evidence,
// and the one typed refusal, Denial, that every check returns.
//
// Authenticity and authorization are separate steps. A Verifier (attest/tpm,
// identity/gcp, identity/aws) returns Claims only when every check in its
// doc comment passed; attest/policy then decides whether those claims may
// have a pool. Neither logs: callers write one line per decision.
package attest

// Kind names a kind of evidence.
type Kind string

// The kinds of evidence nodeproof understands.
const (
	KindTPM Kind = "tpm"
	KindGCP Kind = "gcp"
	KindAWS Kind = "aws"
	// KindGCEVTPM: a GCE Shielded or Confidential VM's vTPM, whose
	// attestation key Google certifies (identity/gcevtpm).
	KindGCEVTPM Kind = "gce-vtpm"
	// KindNitroTPM: an EC2 instance's NitroTPM, whose AK a Nitro
	// attestation document binds, beside the instance identity document
	// (identity/nitrotpm).
	KindNitroTPM Kind = "aws-nitrotpm"
	// KindAzureVTPM: an Azure Trusted Launch VM's vTPM, whose AK Azure
	// certifies, beside the IMDS attested document naming the VM
	// (identity/azuretpm).
	KindAzureVTPM Kind = "azure-vtpm"
)

// AllKinds returns every kind of evidence nodeproof understands, in the
// order they are declared above (a fresh slice each call).
func AllKinds() []Kind {
	return []Kind{KindTPM, KindGCP, KindAWS, KindGCEVTPM, KindNitroTPM, KindAzureVTPM}
}
