package microsoft

import (
	"encoding/json"
	"slices"

	"github.com/nodeproof/nodeproof/attest"
)

// Where a machine stands in the move from Microsoft's 2011 Secure Boot CAs
// (expired in 2026) to the 2023 CAs, as its PCR 7 measurements show.
// The values of Transition's fields:
const (
	// Gen2011 and Gen2023: only that generation's CAs; Both: both.
	Gen2011 = "2011"
	Gen2023 = "2023"
	Both    = "2011+2023"
	// None: the variable holds none of Microsoft's CAs (the platform
	// owner's own keys only).
	None = "none"
	// Other: the chain was verified by a certificate that is not one of
	// Microsoft's CAs (the platform owner's own db key).
	Other = "other"
	// Unknown: not measured, or not readable (a machine without Secure
	// Boot, a log without PCR 7, firmware verifications the log does not
	// show).
	Unknown = "unknown"
)

// Transition says, for one machine: which generations of Microsoft's CAs
// its db and KEK hold, and through which its firmware verified its boot
// chain.
type Transition struct {
	// DB and KEK are Gen2011, Gen2023, Both, None or Unknown.
	DB  string `json:"db"`
	KEK string `json:"kek"`
	// Chain is the generation of the CAs that verified the boot
	// applications the firmware verified (the shim): Gen2011, Gen2023,
	// Both (several applications, or an authority the log leaves
	// ambiguous between the two), Other (a db certificate not
	// Microsoft's; with a Microsoft CA beside it, that CA's generation)
	// or Unknown.
	Chain string `json:"chain"`
}

// Extra is a CA a Set counts beside Microsoft's own: one the table does
// not hold yet (Microsoft Option ROM UEFI CA 2023), or, in a lab, the
// lab's own key standing in for a 2023 CA. A db CA of 2023 counts as one
// that signs boot applications (the rule's db requirement).
type Extra struct {
	// Name names it in messages.
	Name string
	// Variable is KEK or DB; Year 2011 or 2023.
	Variable string
	Year     int
	// SHA256 is its fingerprint (hex, of the DER).
	SHA256 string
}

// Set is the CAs a transition is judged by: Microsoft's (the table) and
// any extras (a policy's trust.secureBootCAs). The zero Set is
// Microsoft's alone.
type Set struct {
	Extra []Extra
}

// generation is the generation of the CA with fingerprint fp in variable
// (0 when fp is none of them).
func (s Set) generation(fp, variable string) int {
	for _, r := range table {
		if r.sha256 == fp && r.variable == variable {
			return r.year
		}
	}
	for _, e := range s.Extra {
		if e.SHA256 == fp && e.Variable == variable {
			return e.Year
		}
	}
	return 0
}

// TransitionOf is Set{}.TransitionOf: Microsoft's CAs alone.
func TransitionOf(b *attest.BootState) Transition { return Set{}.TransitionOf(b) }

// TransitionOf reads where b's machine stands. It judges only what the
// boot state established from replayed PCR 7 events: the certificates of
// KEK and db (BootState.KEKCerts, DBCerts) and, for each boot application
// the firmware verified, the db authorities that may have verified it
// (BootState.AppVerifications): a fingerprint is one of the CAs only when
// it is that CA's exactly and in that CA's variable.
func (s Set) TransitionOf(b *attest.BootState) Transition {
	t := Transition{DB: Unknown, KEK: Unknown, Chain: Unknown}
	if b == nil {
		return t
	}
	if b.DBCertsKnown {
		t.DB = s.generations(b.DBCerts, DB)
	}
	if b.KEKCertsKnown {
		t.KEK = s.generations(b.KEKCerts, KEK)
	}
	seen := map[int]bool{}
	for i, v := range b.AppVerifications {
		if v.Verifier != attest.VerifierFirmware || i >= len(b.BootApplications) {
			continue
		}
		for _, fp := range v.Signers {
			seen[s.generation(fp, DB)] = true
		}
	}
	switch {
	case seen[2011] && seen[2023]:
		t.Chain = Both
	case seen[2011]:
		t.Chain = Gen2011
	case seen[2023]:
		t.Chain = Gen2023
	case seen[0]:
		t.Chain = Other
	}
	return t
}

// generations is which generations fps (a variable's certificates) hold.
func (s Set) generations(fps []string, variable string) string {
	var old, new bool
	for _, fp := range fps {
		switch s.generation(fp, variable) {
		case 2011:
			old = true
		case 2023:
			new = true
		}
	}
	switch {
	case old && new:
		return Both
	case old:
		return Gen2011
	case new:
		return Gen2023
	}
	return None
}

// The CAs a rule names (CA.Name).
const (
	UEFICA2023 = "Microsoft UEFI CA 2023"
	KEKCA2023  = "Microsoft Corporation KEK 2K CA 2023"
)

// TransitionOfRecorded is TransitionOf of recorded claims (JSON, as a
// node's binding status keeps them): unknown throughout when there are
// none, they do not decode or they are not a TPM's.
func (s Set) TransitionOfRecorded(claims []byte) Transition {
	var c attest.Claims
	if len(claims) == 0 || json.Unmarshal(claims, &c) != nil || c.TPM == nil {
		return Transition{DB: Unknown, KEK: Unknown, Chain: Unknown}
	}
	return s.TransitionOf(&c.TPM.Boot)
}

// HoldsShimCA2023 reports whether db (its certificates, by fingerprint)
// holds a 2023 CA that signs shims: Microsoft UEFI CA 2023, or an extra
// db CA of 2023.
func (s Set) HoldsShimCA2023(db []string) bool { return s.holds2023(db, DB, UEFICA2023) }

// HoldsKEKCA2023 reports whether KEK holds Microsoft Corporation KEK 2K
// CA 2023 or an extra KEK CA of 2023.
func (s Set) HoldsKEKCA2023(kek []string) bool { return s.holds2023(kek, KEK, KEKCA2023) }

// holds2023 reports whether fps (variable's certificates) hold
// Microsoft's CA named name, or an extra CA of 2023 in variable.
func (s Set) holds2023(fps []string, variable, name string) bool {
	for _, r := range table {
		if r.name == name && slices.Contains(fps, r.sha256) {
			return true
		}
	}
	for _, e := range s.Extra {
		if e.Variable == variable && e.Year == 2023 && slices.Contains(fps, e.SHA256) {
			return true
		}
	}
	return false
}
