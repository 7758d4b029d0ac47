package attest

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// ErrIdentityMalformed: a string that is not an evidence identity as the
// verifiers write one (ParseIdentity).
var ErrIdentityMalformed = errors.New("not an evidence identity")

// uuidPattern is a UUID as Azure writes its subscription and VM IDs in
// the attested document: lower-case hex, 8-4-4-4-12.
const uuidPattern = `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`

var (
	tpmIdentityRE   = regexp.MustCompile(`^tpm-ek:[0-9a-f]{64}$`)
	gcpIdentityRE   = regexp.MustCompile(`^gcp:(0|[1-9][0-9]{0,31})/([a-z](?:[a-z0-9-]{0,61}[a-z0-9])?)/(0|[1-9][0-9]{0,31})$`)
	awsIdentityRE   = regexp.MustCompile(`^aws:([0-9]{12})/([a-z]{2,8}(?:-[a-z]+)+-[0-9]{1,3})/(i-[0-9a-f]{8,17})$`)
	azureIdentityRE = regexp.MustCompile(`^azure:` + uuidPattern + `/` + uuidPattern + `$`)
)

// ParseIdentity checks that s is an evidence identity in the one form the
// verifiers write — "tpm-ek:<SHA-256 of the EK, 64 lower-case hex>"
// (KindTPM), "gcp:<project number>/<zone>/<instance id>" (KindGCP and
// KindGCEVTPM: one machine, one identity), "aws:<account>/<region>/<instance
// id>" (KindAWS and KindNitroTPM), "azure:<subscription id>/<vm id>" (both
// lower-case UUIDs: KindAzureVTPM) — and returns the kinds that write it. A
// string that is almost one (upper-case hex, surrounding space, a GCP
// project ID instead of its number, a missing part) is
// ErrIdentityMalformed, and the error says what the form is (and the
// canonical spelling, when one follows from s): a ban keyed by any other
// spelling would match no machine.
func ParseIdentity(s string) ([]Kind, error) {
	switch {
	case tpmIdentityRE.MatchString(s):
		return []Kind{KindTPM}, nil
	case gcpIdentityRE.MatchString(s):
		return []Kind{KindGCP, KindGCEVTPM}, nil
	case awsIdentityRE.MatchString(s):
		return []Kind{KindAWS, KindNitroTPM}, nil
	case azureIdentityRE.MatchString(s):
		return []Kind{KindAzureVTPM}, nil
	}
	if c := strings.ToLower(strings.TrimSpace(s)); c != s && (tpmIdentityRE.MatchString(c) || awsIdentityRE.MatchString(c) || gcpIdentityRE.MatchString(c) || azureIdentityRE.MatchString(c)) {
		return nil, fmt.Errorf("%w: %q is not in its canonical form; it is written %s", ErrIdentityMalformed, s, c)
	}
	prefix, rest, _ := strings.Cut(s, ":")
	switch strings.ToLower(strings.TrimSpace(prefix)) {
	case "tpm-ek":
		return nil, fmt.Errorf("%w: %q: a TPM's identity is tpm-ek: and the SHA-256 of its EK's public key, 64 lower-case hex digits (nodeproof inspect lists them)", ErrIdentityMalformed, s)
	case "gcp":
		parts := strings.Split(rest, "/")
		if len(parts) == 3 && parts[0] != "" && strings.Trim(parts[0], "0123456789") != "" {
			return nil, fmt.Errorf("%w: %q: a GCP identity names the project by its number, not its ID %q (gcloud projects describe %s --format='value(projectNumber)')", ErrIdentityMalformed, s, parts[0], parts[0])
		}
		return nil, fmt.Errorf("%w: %q: a GCP identity is gcp:<project number>/<zone>/<instance id>", ErrIdentityMalformed, s)
	case "aws":
		return nil, fmt.Errorf("%w: %q: an AWS identity is aws:<12-digit account>/<region>/<i-instance id>", ErrIdentityMalformed, s)
	case "azure":
		return nil, fmt.Errorf("%w: %q: an Azure identity is azure:<subscription id>/<vm id>, both lower-case UUIDs (8-4-4-4-12 hex digits)", ErrIdentityMalformed, s)
	}
	return nil, fmt.Errorf("%w: %q: identities are tpm-ek:<hex>, gcp:<project number>/<zone>/<instance id>, aws:<account>/<region>/<instance id> or azure:<subscription id>/<vm id>", ErrIdentityMalformed, s)
}
