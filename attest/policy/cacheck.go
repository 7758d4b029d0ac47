package policy

import (
	"fmt"
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

// microsoftCA2023 checks m against b: KEK and db measured and read
// (SecureBootCAOutdated naming what the log lacks), db holding Microsoft
// UEFI CA 2023 (m.DB), KEK holding Microsoft Corporation KEK 2K CA 2023
// (m.KEK), no 2011 CA among the firmware's verifications of the boot chain
// (m.Chain; a chain the log shows no firmware verification of is refused:
// unknown is not 2023).
func microsoftCA2023(in string, m *MicrosoftCA2023, b *attest.BootState) error {
	deny := func(field, format string, args ...any) error {
		return attest.DenySetting(attest.ReasonPolicySecureBootCA, in+"microsoftCA2023."+field, format, args...)
	}
	t := microsoft.TransitionOf(b)
	if m.DB {
		if !b.DBCertsKnown {
			return deny("db", "the log does not establish db's certificates, which %smicrosoftCA2023.db needs", in)
		}
		if !microsoft.Holds(b.DBCerts, microsoft.UEFICA2023) {
			return deny("db", "db (Microsoft CAs: %s) lacks %s, which signs shims from now on", t.DB, microsoft.UEFICA2023)
		}
	}
	if m.KEK {
		if !b.KEKCertsKnown {
			return deny("kek", "the log does not establish KEK's certificates, which %smicrosoftCA2023.kek needs", in)
		}
		if !microsoft.Holds(b.KEKCerts, microsoft.KEKCA2023) {
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
