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
