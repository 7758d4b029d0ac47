package policy_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
)

// TestAddRevocations: revocations added to a pool learned from a real
// machine (Debian 12 under OVMF with Secure Boot: Microsoft's UEFI CA
// verified the shim, Debian's CA GRUB and the kernel; SbatLevel shim 4,
// grub 5) refuse it when they name what it booted, with the reason of
// the rule each became, and leave it admitted when they do not.
func TestAddRevocations(t *testing.T) {
	debian := learned(t, "debian-12-ovmf-secure-boot")
	doc, _, err := policy.Learn(nil, "worker", debian)
	if err != nil {
		t.Fatal(err)
	}
	grub := debian.Boot.BootApplications[attest.StageBootloader]
	other := hex.EncodeToString(sha256Of("an image nobody booted"))
	if len(debian.Boot.DBXSHA256s) < 32 {
		t.Fatal("the Debian log's dbx holds no hash")
	}
	inDBX := hex.EncodeToString(debian.Boot.DBXSHA256s[:32])
	now := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		r     policy.Revocations
		want  attest.Reason // "" admitted
		notes []string      // each in some note
	}{
		{"GRUB's digest revoked", policy.Revocations{DeniedDigests: []string{other, strings.ToUpper(grub)}}, attest.ReasonPolicyBootDenied,
			[]string{"deniedDigests: 2 revoked image digest(s) added"}},
		{"Debian's CA revoked", policy.Revocations{DeniedSigners: []string{debianCA}}, attest.ReasonPolicyBootSignerDenied,
			[]string{"deniedSigners: 1 revoked certificate(s) added", "bootComponents.bootloader.signedBy lists " + debianCA, "bootComponents.kernel.signedBy lists " + debianCA}},
		{"an SbatLevel above the shim's", policy.Revocations{MinimumSBAT: map[string]int{"shim": 4, "grub": 6}}, attest.ReasonPolicySBAT,
			[]string{"minimumSBAT.grub: raised from 5 to 6"}},
		{"the SbatLevel the shim applies", policy.Revocations{MinimumSBAT: map[string]int{"shim": 4, "grub": 5}}, "", nil},
		{"a dbx hash the node's dbx lacks required", policy.Revocations{DeniedDigests: []string{other}, RequireDBX: []string{other}}, attest.ReasonPolicyDBX,
			[]string{"minimumDBX.contains: 1 hash(es) added"}},
		{"a dbx hash the node's dbx holds required", policy.Revocations{RequireDBX: []string{inDBX}}, "", nil},
		{"revocations of what this machine did not boot", policy.Revocations{DeniedDigests: []string{other}, DeniedSigners: []string{otherKey}, MinimumSBAT: map[string]int{"shim": 2}}, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, notes, err := policy.AddRevocations(doc, "worker", tc.r)
			if err != nil {
				t.Fatal(err)
			}
			_, err = mustParse(t, out).Decide("worker", claimsOf(debian), policy.Options{Now: now})
			if r, _ := attest.ReasonOf(err); r != tc.want {
				t.Fatalf("decided %v; want %q\n%s", err, tc.want, out)
			}
			all := strings.Join(notes, "\n")
			for _, n := range tc.notes {
				if !strings.Contains(all, n) {
					t.Errorf("the notes do not say %q:\n%s", n, all)
				}
			}
			// Once is enough: the same revocations again change nothing.
			again, _, err := policy.AddRevocations(out, "worker", tc.r)
			if err != nil || !bytes.Equal(again, out) {
				t.Errorf("applied twice: %v\n%s\nonce:\n%s", err, again, out)
			}
		})
	}

	// minimumSBAT is raised, never lowered; a component it did not name
	// joins.
	raised, _, err := policy.AddRevocations(doc, "worker", policy.Revocations{MinimumSBAT: map[string]int{"grub": 7}})
	if err != nil {
		t.Fatal(err)
	}
	kept, notes, err := policy.AddRevocations(raised, "worker", policy.Revocations{MinimumSBAT: map[string]int{"grub": 3, "grub.debian": 2}})
	if err != nil {
		t.Fatal(err)
	}
	if m := mustParse(t, kept).Pools["worker"].TPM.MinimumSBAT; m["grub"] != 7 || m["shim"] != 4 || m["grub.debian"] != 2 {
		t.Errorf("minimumSBAT %v; want grub 7 kept, shim 4, grub.debian 2", m)
	}
	if !strings.Contains(strings.Join(notes, "\n"), "minimumSBAT.grub: 7 kept (not lowered to 3)") {
		t.Errorf("notes %q do not say grub was kept", notes)
	}

	for _, tc := range []struct {
		name, pool string
		doc        []byte
		r          policy.Revocations
	}{
		{"a pool the policy lacks", "master", doc, policy.Revocations{DeniedDigests: []string{other}}},
		{"a digest that is not a SHA-256", "worker", doc, policy.Revocations{DeniedDigests: []string{other[:40]}}},
		{"a signer that is not a fingerprint", "worker", doc, policy.Revocations{DeniedSigners: []string{"CN=Debian"}}},
		{"a pool whose boot no TPM rule judges", "cloud", []byte("apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\npools:\n  cloud:\n    evidence: [gcp]\n    gcp: {projects: [p]}\n"), policy.Revocations{DeniedDigests: []string{other}}},
		{"a generation below 1", "worker", doc, policy.Revocations{MinimumSBAT: map[string]int{"grub": 0, "shim": 9}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if out, _, err := policy.AddRevocations(tc.doc, tc.pool, tc.r); err == nil {
				t.Fatalf("added:\n%s", out)
			}
		})
	}
}

func sha256Of(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }
