package policy

import (
	"fmt"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/uefivar/microsoft"
)

// MicrosoftCA2023 is the rule of a fleet's move from Microsoft's 2011
// Secure Boot CAs (Microsoft Corporation KEK CA 2011, Microsoft Windows
// Production PCA 2011, Microsoft Corporation UEFI CA 2011: expired in
// 2026) to the 2023 CAs, judged from the KEK and db the firmware measured
// into PCR 7 and from the db authorities that verified the boot chain
// (attest/uefivar/microsoft holds the real certificates). Each field set
// is a requirement; at least one is set.
type MicrosoftCA2023 struct {
	// DB requires db to hold Microsoft UEFI CA 2023, which signs shims
	// from now on: a machine without it cannot boot a shim signed by it
	// alone.
	DB bool `yaml:"db"`
	// KEK requires KEK to hold Microsoft Corporation KEK 2K CA 2023,
	// which signs db and dbx updates from now on.
	KEK bool `yaml:"kek"`
	// Chain refuses a boot chain the firmware verified through a 2011 CA
	// (or an authority the log leaves ambiguous with one): a 2023 CA, or
	// the platform owner's own db key, passes.
	Chain bool `yaml:"chain"`
	// From, when set, is when the rule starts to refuse (RFC 3339); until
	// then what it would refuse is reported as an audit, whatever the
	// pool audits: a date announced to the fleet.
	From *time.Time `yaml:"from"`
}

// microsoftCA2023 checks m against b, by cas (Microsoft's CAs and the
// policy's trust.secureBootCAs): KEK and db measured and read
// (SecureBootCAOutdated naming what the log lacks), db holding Microsoft
// UEFI CA 2023 or an extra 2023 db CA (m.DB), KEK holding Microsoft
// Corporation KEK 2K CA 2023 or an extra 2023 KEK CA (m.KEK), no 2011 CA among the firmware's verifications of the boot chain
// (m.Chain; a chain the log shows no firmware verification of is refused:
// unknown is not 2023).
func microsoftCA2023(in string, m *MicrosoftCA2023, cas microsoft.Set, b *attest.BootState) error {
	deny := func(field, format string, args ...any) error {
		return attest.DenySetting(attest.ReasonPolicySecureBootCA, in+"microsoftCA2023."+field, format, args...)
	}
	t := cas.TransitionOf(b)
	if m.DB {
		if !b.DBCertsKnown {
			return deny("db", "the log does not establish db's certificates, which %smicrosoftCA2023.db needs", in)
		}
		if !cas.HoldsShimCA2023(b.DBCerts) {
			return deny("db", "db (Microsoft CAs: %s) lacks %s, which signs shims from now on", t.DB, microsoft.UEFICA2023)
		}
	}
	if m.KEK {
		if !b.KEKCertsKnown {
			return deny("kek", "the log does not establish KEK's certificates, which %smicrosoftCA2023.kek needs", in)
		}
		if !cas.HoldsKEKCA2023(b.KEKCerts) {
			return deny("kek", "KEK (Microsoft CAs: %s) lacks %s, which signs db and dbx updates from now on", t.KEK, microsoft.KEKCA2023)
		}
	}
	if m.Chain {
		switch t.Chain {
		case microsoft.Gen2023, microsoft.Other:
		case microsoft.Unknown:
			return deny("chain", "the log shows no firmware verification of the boot chain, which %smicrosoftCA2023.chain needs", in)
		default:
			return deny("chain", "the firmware verified the boot chain through a 2011 Microsoft CA (%s)", t.Chain)
		}
	}
	return nil
}

// check is the rule's validation: it requires something.
func (m *MicrosoftCA2023) check(in string) error {
	if !m.DB && !m.KEK && !m.Chain {
		return fmt.Errorf("%smicrosoftCA2023 requires nothing: set db, kek or chain (or remove it)", in)
	}
	return nil
}

// SecureBootCAs is the set a node's move to the 2023 CAs is judged by:
// Microsoft's, and the policy's trust.secureBootCAs.
func (p *Policy) SecureBootCAs() microsoft.Set {
	var s microsoft.Set
	if p == nil {
		return s
	}
	for _, c := range p.Trust.SecureBootCAs {
		v := microsoft.DB
		if strings.EqualFold(c.Variable, microsoft.KEK) {
			v = microsoft.KEK
		}
		s.Extra = append(s.Extra, microsoft.Extra{Name: c.Name, Variable: v, Year: c.Year, SHA256: strings.ToLower(c.SHA256)})
	}
	return s
}

// checkSecureBootCAs checks trust.secureBootCAs: each named, in db or
// KEK, of 2011 or 2023, with a SHA-256 fingerprint.
func checkSecureBootCAs(cas []SecureBootCA) error {
	for i, c := range cas {
		at := fmt.Sprintf("trust.secureBootCAs[%d]", i)
		switch {
		case c.Name == "":
			return fmt.Errorf("%s: a name is required", at)
		case c.Variable != "db" && c.Variable != "KEK":
			return fmt.Errorf("%s (%s): variable %q: want db or KEK", at, c.Name, c.Variable)
		case c.Year != 2011 && c.Year != 2023:
			return fmt.Errorf("%s (%s): year %d: want 2011 or 2023", at, c.Name, c.Year)
		}
		if err := checkHex(c.SHA256); err != nil {
			return fmt.Errorf("%s (%s): sha256: %w", at, c.Name, err)
		}
	}
	return nil
}
