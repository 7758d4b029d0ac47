package mcs

import (
	"testing"

	"github.com/nodeproof/nodeproof/attest"
)

// TestSummarize: one line per attestation, the same for every cloud's
// instance (no case per cloud), then the boot a TPM's quote tells.
func TestSummarize(t *testing.T) {
	tpmFacts := &attest.TPMClaims{EKSHA256: "0123456789abcdef0123", EKKind: attest.EKKindRSA2048, EKTrust: "ca:vendor", PCRBank: "sha256",
		PCRs: map[int]string{8: "88", 9: "99"}, Boot: attest.BootState{SecureBootKnown: true, SecureBoot: true, BootApplications: []string{"s", "b", "k"}}}
	for _, tc := range []struct {
		name string
		c    *attest.Claims
		want string
	}{
		{"gcp", &attest.Claims{Kind: attest.KindGCP, Instance: &attest.InstanceClaims{Cloud: attest.CloudGCP, Account: "proj", Location: "us-central1-a", ID: "42", Name: "w-0"}},
			"gcp gcp account=proj location=us-central1-a instance=42 (w-0)"},
		{"aws, live-checked", &attest.Claims{Kind: attest.KindAWS, Instance: &attest.InstanceClaims{Cloud: attest.CloudAWS, Account: "123456789012", Location: "us-east-1", ID: "i-0abc", LiveChecked: true}},
			"aws aws account=123456789012 location=us-east-1 instance=i-0abc live"},
		{"a NitroTPM", &attest.Claims{Kind: attest.KindNitroTPM, TPM: tpmFacts, Instance: &attest.InstanceClaims{Cloud: attest.CloudAWS, Account: "123456789012", Location: "us-east-1", ID: "i-0abc"}},
			"aws-nitrotpm aws account=123456789012 location=us-east-1 instance=i-0abc trust=ca:vendor bank=sha256 secureBoot=on kernel=k pcr8=88 pcr9=99"},
		{"an Azure vTPM (no location)", &attest.Claims{Kind: attest.KindAzureVTPM, TPM: tpmFacts, Instance: &attest.InstanceClaims{Cloud: attest.CloudAzure, Account: "8d10da13-8125-4ba9-a717-bf7490507b3d", ID: "5c6f1a2e-0d4b-4a39-9b6e-2c4f0e7d9a11"}},
			"azure-vtpm azure account=8d10da13-8125-4ba9-a717-bf7490507b3d instance=5c6f1a2e-0d4b-4a39-9b6e-2c4f0e7d9a11 trust=ca:vendor bank=sha256 secureBoot=on kernel=k pcr8=88 pcr9=99"},
		{"bare metal", &attest.Claims{Kind: attest.KindTPM, TPM: tpmFacts},
			"tpm ek=0123456789abcdef… (rsa-2048) trust=ca:vendor bank=sha256 secureBoot=on kernel=k pcr8=88 pcr9=99"},
		{"a unified kernel image, systemd in the initrd", &attest.Claims{Kind: attest.KindTPM, TPM: &attest.TPMClaims{EKSHA256: "0123456789abcdef0123", EKKind: attest.EKKindRSA2048, EKTrust: "inventory", PCRBank: "sha256",
			PCRs: map[int]string{8: "00", 9: "99"}, Boot: attest.BootState{SecureBootKnown: true, SecureBoot: true, BootApplications: []string{"fedcba9876543210ff"},
				UKISectionsKnown: true, SystemdPhases: []string{"enter-initrd", "leave-initrd"}}}},
			"tpm ek=0123456789abcdef… (rsa-2048) trust=inventory bank=sha256 secureBoot=on kernel= pcr8=00 pcr9=99 uki=fedcba9876543210 phases=enter-initrd,leave-initrd"},
		{"neither", &attest.Claims{Kind: attest.KindTPM, Identity: "tpm-ek:ab"}, "tpm tpm-ek:ab"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := summarize(tc.c); got != tc.want {
				t.Errorf("\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}
