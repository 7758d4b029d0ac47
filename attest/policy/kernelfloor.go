package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/nodeproof/nodeproof/attest"
)

// MinimumKernel is a floor under the kernel that is not a digest pin: a
// signer rule admits every kernel its signer ever signed, older ones
// with known holes included; this refuses those older than Version. The
// event log holds only a kernel's digest, so Versions says which digest
// is which version — read from the kernel images themselves by `policy
// learn --efi`, before any machine boots them. A kernel whose digest is
// not listed is refused too: its version is unknown (docs/policy.md says
// what this can and cannot stop).
type MinimumKernel struct {
	// Version is the oldest version accepted, as the kernel image names
	// itself (`uname -r`: "6.1.0-56-amd64"). Compared part by part:
	// numbers as numbers, the rest as text.
	Version string `yaml:"version"`
	// Versions maps each known kernel's digest — its Authenticode digest
	// as measured into PCR 4, in the quoted bank, hex — to its version.
	Versions map[string]string `yaml:"versions"`
}

// checkMinimumKernel refuses a kernel in the boot chain's kernel stage
// (attest.BootState.Kernels) that is older than m.Version or whose
// version m does not know; and a boot with no kernel measured.
func checkMinimumKernel(in string, m *MinimumKernel, b *attest.BootState) error {
	at := in + "minimumKernel"
	kernels := b.Kernels()
	if len(kernels) == 0 {
		return attest.DenySetting(attest.ReasonPolicyKernelVersion, at, "no kernel was measured into PCR 4 (with Secure Boot off GRUB loads it itself), which %s needs to judge its version", at)
	}
	for _, k := range slices.Compact(slices.Clone(kernels)) {
		v, ok := m.versionOf(k)
		switch {
		case !ok:
			return attest.DenySetting(attest.ReasonPolicyKernelVersion, at+".versions", "kernel %s is not in %s.versions: its version is unknown (add it with `nodeproof policy learn --efi VMLINUZ`)", k, at)
		case CompareVersions(v, m.Version) < 0:
			return attest.DenySetting(attest.ReasonPolicyKernelVersion, at+".version", "kernel %s is %s, older than %s.version %s: a rollback", k, v, at, m.Version)
		}
	}
	return nil
}

func (m *MinimumKernel) versionOf(digest string) (string, bool) {
	for d, v := range m.Versions {
		if strings.EqualFold(d, digest) {
			return v, true
		}
	}
	return "", false
}

// CompareVersions compares two kernel versions part by part (runs of
// digits as numbers, other runs as text): -1, 0 or 1. "6.1.0-56-amd64"
// is newer than "6.1.0-52-amd64", "6.12.0" than "6.9.1".
func CompareVersions(a, b string) int {
	pa, pb := versionParts(a), versionParts(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		x, y := pa[i], pb[i]
		nx, ex := strconv.ParseUint(x, 10, 64)
		ny, ey := strconv.ParseUint(y, 10, 64)
		switch {
		case ex == nil && ey == nil:
			if nx != ny {
				if nx < ny {
					return -1
				}
				return 1
			}
		case x != y:
			return strings.Compare(x, y)
		}
	}
	switch {
	case len(pa) < len(pb):
		return -1
	case len(pa) > len(pb):
		return 1
	}
	return 0
}

func versionParts(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		j := i + 1
		digit := unicode.IsDigit(rune(s[i]))
		for j < len(s) && unicode.IsDigit(rune(s[j])) == digit {
			j++
		}
		out = append(out, s[i:j])
		i = j
	}
	return out
}

// checkVersions checks a minimumKernel: a version, digests that are
// digests, versions that are not empty.
func (m *MinimumKernel) check() error {
	if strings.TrimSpace(m.Version) == "" {
		return fmt.Errorf("tpm.minimumKernel.version is empty")
	}
	for d, v := range m.Versions {
		if err := checkHex(d); err != nil {
			return fmt.Errorf("tpm.minimumKernel.versions: %w", err)
		}
		if strings.TrimSpace(v) == "" {
			return fmt.Errorf("tpm.minimumKernel.versions[%s] is empty", d)
		}
	}
	return nil
}
