package microsoft_test

import (
	"crypto"
	"testing"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/tpm"
	"github.com/nodeproof/nodeproof/attest/uefivar/microsoft"
	firmwaretestdata "github.com/nodeproof/nodeproof/firmware-testdata"
)

// TestTransitionOfRealLogs: where real machines stand, read from their
// logs' PCR 7 by the verifier's own state machine.
func TestTransitionOfRealLogs(t *testing.T) {
	for _, tc := range []struct {
		log  string
		want microsoft.Transition
	}{
		// A RHEL 8 machine: the 2011 set, the shim verified by UEFI CA 2011.
		{"rhel8-uefi", microsoft.Transition{DB: "2011", KEK: "2011", Chain: "2011"}},
		// Debian 12 under OVMF with its Microsoft variables.
		{"debian-12-ovmf-secure-boot", microsoft.Transition{DB: "2011", KEK: "2011", Chain: "2011"}},
		// A GCE TDX VM of 2024: both sets enrolled.
		{"ubuntu-2404-intel-tdx", microsoft.Transition{DB: "2011+2023", KEK: "2011+2023", Chain: "unknown"}},
		// Container-Optimized OS: Google's own keys, no Microsoft CA.
		{"cos-125-intel-tdx-secure-boot", microsoft.Transition{DB: "none", KEK: "none", Chain: "other"}},
		// Secure Boot off under OVMF: the variables measured empty.
		{"debian-12-ovmf-no-secure-boot", microsoft.Transition{DB: "none", KEK: "none", Chain: "unknown"}},
		// A log from before the variables were measured this way.
		{"debian-10", microsoft.Transition{DB: "unknown", KEK: "unknown", Chain: "unknown"}},
	} {
		t.Run(tc.log, func(t *testing.T) {
			bs, err := tpm.LogBootState(firmwaretestdata.MustLog(tc.log), crypto.SHA256)
			if err != nil {
				t.Fatal(err)
			}
			if got := microsoft.TransitionOf(&bs); got != tc.want {
				t.Errorf("TransitionOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestTransitionOf: the chain's generation from the firmware's
// verifications only (the shim's are not the firmware's db), a
// fingerprint counted only in its own variable, ambiguity kept.
func TestTransitionOf(t *testing.T) {
	cas, err := microsoft.CAs()
	if err != nil {
		t.Fatal(err)
	}
	fp := map[string]string{}
	for _, c := range cas {
		fp[c.Name] = c.SHA256
	}
	uefi2011, uefi2023, kek2023 := fp["Microsoft Corporation UEFI CA 2011"], fp["Microsoft UEFI CA 2023"], fp["Microsoft Corporation KEK 2K CA 2023"]
	own := "1111111111111111111111111111111111111111111111111111111111111111"
	boot := func(db, kek []string, verifications ...attest.AppVerification) *attest.BootState {
		b := &attest.BootState{DBCerts: db, DBCertsKnown: true, KEKCerts: kek, KEKCertsKnown: true, AppVerifications: verifications}
		for range verifications {
			b.BootApplications = append(b.BootApplications, "aa")
		}
		return b
	}
	fw := func(signers ...string) attest.AppVerification {
		return attest.AppVerification{Verifier: attest.VerifierFirmware, Signers: signers}
	}
	for _, tc := range []struct {
		name string
		boot *attest.BootState
		want microsoft.Transition
	}{
		{"moved: the shim verified by UEFI CA 2023", boot([]string{uefi2023}, []string{kek2023}, fw(uefi2023)), microsoft.Transition{DB: "2023", KEK: "2023", Chain: "2023"}},
		{"db holds both, the shim still 2011-signed", boot([]string{uefi2011, uefi2023}, []string{kek2023}, fw(uefi2011)), microsoft.Transition{DB: "2011+2023", KEK: "2023", Chain: "2011"}},
		{"an authority the log leaves ambiguous", boot([]string{uefi2011, uefi2023}, nil, fw(uefi2011, uefi2023)), microsoft.Transition{DB: "2011+2023", KEK: "none", Chain: "2011+2023"}},
		{"the shim verified the next stages: not the firmware's", boot([]string{uefi2023}, nil, fw(uefi2023), attest.AppVerification{Verifier: attest.VerifierShim, Signers: []string{uefi2011}}), microsoft.Transition{DB: "2023", KEK: "none", Chain: "2023"}},
		{"the owner's own key", boot([]string{own}, []string{own}, fw(own)), microsoft.Transition{DB: "none", KEK: "none", Chain: "other"}},
		{"a KEK CA in db is not a db CA", boot([]string{kek2023}, nil), microsoft.Transition{DB: "none", KEK: "none", Chain: "unknown"}},
		{"nothing measured", &attest.BootState{}, microsoft.Transition{DB: "unknown", KEK: "unknown", Chain: "unknown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := microsoft.TransitionOf(tc.boot); got != tc.want {
				t.Errorf("TransitionOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestSetExtra: a CA a Set adds (a lab's key standing in for a 2023 CA)
// counts as its generation in its own variable only, and a 2023 db CA
// among them holds the place of Microsoft UEFI CA 2023.
func TestSetExtra(t *testing.T) {
	lab := "2222222222222222222222222222222222222222222222222222222222222222"
	cas, err := microsoft.CAs()
	if err != nil {
		t.Fatal(err)
	}
	uefi2011 := cas[2].SHA256
	s := microsoft.Set{Extra: []microsoft.Extra{{Name: "lab db CA", Variable: microsoft.DB, Year: 2023, SHA256: lab}}}
	b := &attest.BootState{DBCerts: []string{uefi2011, lab}, DBCertsKnown: true, KEKCerts: []string{lab}, KEKCertsKnown: true,
		BootApplications: []string{"aa"}, AppVerifications: []attest.AppVerification{{Verifier: attest.VerifierFirmware, Signers: []string{lab}}}}
	if got, want := s.TransitionOf(b), (microsoft.Transition{DB: "2011+2023", KEK: "none", Chain: "2023"}); got != want {
		t.Errorf("with the lab CA: %+v, want %+v", got, want)
	}
	if got, want := microsoft.TransitionOf(b), (microsoft.Transition{DB: "2011", KEK: "none", Chain: "other"}); got != want {
		t.Errorf("Microsoft's alone: %+v, want %+v", got, want)
	}
	if !s.HoldsShimCA2023(b.DBCerts) || (microsoft.Set{}).HoldsShimCA2023(b.DBCerts) || s.HoldsKEKCA2023(b.KEKCerts) {
		t.Error("HoldsShimCA2023 / HoldsKEKCA2023 do not follow the set")
	}
}
