package microsoft

import (
	"encoding/json"

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

// generation is the generation of the CA with fingerprint fp in variable
// ("" when fp is none of them).
func generation(fp, variable string) int {
	for _, r := range table {
		if r.sha256 == fp && r.variable == variable {
			return r.year
		}
	}
	return 0
}

// TransitionOf reads where b's machine stands. It judges only what the
// boot state established from replayed PCR 7 events: the certificates of
// KEK and db (BootState.KEKCerts, DBCerts) and, for each boot application
// the firmware verified, the db authorities that may have verified it
// (BootState.AppVerifications): a fingerprint is one of the CAs only when
// it is that CA's exactly and in that CA's variable.
func TransitionOf(b *attest.BootState) Transition {
	t := Transition{DB: Unknown, KEK: Unknown, Chain: Unknown}
	if b == nil {
		return t
	}
	if b.DBCertsKnown {
		t.DB = generations(b.DBCerts, DB)
	}
	if b.KEKCertsKnown {
		t.KEK = generations(b.KEKCerts, KEK)
	}
	seen := map[int]bool{}
	for i, v := range b.AppVerifications {
		if v.Verifier != attest.VerifierFirmware || i >= len(b.BootApplications) {
			continue
		}
		for _, s := range v.Signers {
			seen[generation(s, DB)] = true
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
func generations(fps []string, variable string) string {
	var old, new bool
	for _, fp := range fps {
		switch generation(fp, variable) {
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

// Holds reports whether fps (a variable's certificates, by fingerprint)
// hold the CA named name.
func Holds(fps []string, name string) bool {
	for _, r := range table {
		if r.name != name {
			continue
		}
		for _, fp := range fps {
			if fp == r.sha256 {
				return true
			}
		}
	}
	return false
}

// TransitionOfRecorded is TransitionOf of recorded claims (JSON, as a
// node's binding status keeps them): unknown throughout when there are
// none, they do not decode or they are not a TPM's.
func TransitionOfRecorded(claims []byte) Transition {
	var c attest.Claims
	if len(claims) == 0 || json.Unmarshal(claims, &c) != nil || c.TPM == nil {
		return Transition{DB: Unknown, KEK: Unknown, Chain: Unknown}
	}
	return TransitionOf(&c.TPM.Boot)
}
