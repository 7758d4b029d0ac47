package attest

import (
	"errors"
	"strings"
	"testing"
)

// TestParseIdentity: the verifiers' own forms pass; near misses are
// refused, saying the form (and the canonical spelling when there is one).
func TestParseIdentity(t *testing.T) {
	ek := strings.Repeat("ab", 32)
	sub, vm := "1c6b0b2e-7e1a-4c0e-9d1f-3a2b4c5d6e7f", "8f2e7c1a-0b3d-4e5f-a6b7-c8d9e0f1a2b3"
	cases := []struct {
		name string
		in   string
		kind Kind   // first kind, when accepted
		say  string // in the refusal
	}{
		{"tpm", "tpm-ek:" + ek, KindTPM, ""},
		{"gcp", "gcp:123456789012/us-central1-a/4567890123456789", KindGCP, ""},
		{"aws", "aws:123456789012/us-east-1/i-0123456789abcdef0", KindAWS, ""},
		{"aws gov region", "aws:123456789012/us-gov-west-1/i-01234567", KindAWS, ""},
		{"azure", "azure:" + sub + "/" + vm, KindAzureVTPM, ""},
		{"azure upper-case", "azure:" + strings.ToUpper(sub) + "/" + vm, "", "azure:" + sub + "/" + vm},
		{"azure upper-case prefix", "Azure:" + sub + "/" + vm + " ", "", "azure:" + sub + "/" + vm},
		{"azure braces", "azure:{" + sub + "}/" + vm, "", "azure:<subscription id>/<vm id>"},
		{"azure one part", "azure:" + vm, "", "azure:<subscription id>/<vm id>"},
		{"azure VM name", "azure:" + sub + "/worker-1", "", "lower-case UUIDs"},
		{"upper-case hash", "tpm-ek:" + strings.ToUpper(ek), "", "tpm-ek:" + ek},
		{"surrounding space", " tpm-ek:" + ek + "\n", "", "tpm-ek:" + ek},
		{"upper-case prefix", "TPM-EK:" + ek, "", "tpm-ek:" + ek},
		{"short hash", "tpm-ek:" + ek[:62], "", "64 lower-case hex"},
		{"gcp project ID", "gcp:my-project/us-central1-a/4567890123456789", "", "project by its number"},
		{"gcp two parts", "gcp:123456789012/4567890123456789", "", "gcp:<project number>/<zone>/<instance id>"},
		{"gcp leading zero", "gcp:0123/us-central1-a/45", "", "gcp:<project number>"},
		{"aws bad instance", "aws:123456789012/us-east-1/0123456789abcdef0", "", "aws:<12-digit account>"},
		{"typo prefix", "tmp-ek:" + ek, "", "identities are"},
		{"empty", "", "", "identities are"},
		{"a node name", "worker-1", "", "identities are"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			kinds, err := ParseIdentity(c.in)
			if c.kind != "" {
				if err != nil || len(kinds) == 0 || kinds[0] != c.kind {
					t.Fatalf("ParseIdentity(%q) = %v, %v; want %s", c.in, kinds, err, c.kind)
				}
				return
			}
			if !errors.Is(err, ErrIdentityMalformed) || !strings.Contains(err.Error(), c.say) {
				t.Fatalf("ParseIdentity(%q) = %v, %v; want ErrIdentityMalformed saying %q", c.in, kinds, err, c.say)
			}
		})
	}
}
