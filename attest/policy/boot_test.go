package policy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
)

// The signers the real logs name (firmware-testdata/expected: their
// certificates' SHA-256, read with go-eventlog alone).
const (
	microsoftUEFICA = "48e99b991f57fc52f76149599bff0a58c47154229b9f8d603ac40d3500248507"
	debianCA        = "079646974bce09b1f04da67bd722d1fb0947ae4c4010bccdbba52d5b23cbf1a2"
	redHatCA5       = "40175d4c7c5ab4bd753a493f47952f1d8dcf1c219b836968a693e48bd4766135"
	otherKey        = "1111111111111111111111111111111111111111111111111111111111111111"
)

// bootPolicy is a policy of one TPM pool "w" whose tpm section is body
// (YAML, indented under tpm:), its EK trust ca:vendor unless body starts
// with one of its own.
func bootPolicy(t *testing.T, body string) *policy.Policy {
	t.Helper()
	trust := "trust:\n  ekRoots: [{name: vendor, dir: /x}]\n  ekInventory: inv.yaml\n"
	if !strings.HasPrefix(body, "ekTrust:") {
		body = "ekTrust: [ca:vendor]\n" + body
	}
	if !strings.HasPrefix(body, "kernelCmdline:") && !strings.Contains(body, "\nkernelCmdline:") {
		body += "kernelCmdline: {any: true}\n"
	}
	if !strings.HasPrefix(body, "grub:") && !strings.Contains(body, "\ngrub:") {
		body += "grub: {any: true}\n"
	}
	doc := "apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\n" + trust + "pools:\n  w:\n    evidence: [tpm]\n    tpm:\n" + indent(body, "      ")
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	return p
}

func indent(s, by string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		out = append(out, by+l)
	}
	return strings.Join(out, "\n") + "\n"
}

// signers is bootComponents with a signedBy for each stage.
func signers(shim, grub, kernel string) string {
	return fmt.Sprintf("bootComponents:\n  shim: {signedBy: [%s]}\n  bootloader: {signedBy: [%s]}\n  kernel: {signedBy: [%s]}\n", shim, grub, kernel)
}

// TestBootRules: signer rules, SBAT minimums, the machine-owner key
// constraint, reference sets with their dates and audit mode, on real
// firmware logs (Debian 12's live boot under OVMF with Secure Boot:
// Microsoft's UEFI CA verified the shim, Debian's CA from MokListRT GRUB
// and the kernel, SbatLevel shim 4, grub 5; RHEL 8: the shim's built-in
// Red Hat CA, no SbatLevel).
func TestBootRules(t *testing.T) {
	debian, rhel := learned(t, "debian-12-ovmf-secure-boot"), learned(t, "rhel8-uefi")
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	past, future := now.Add(-time.Hour).Format(time.RFC3339), now.Add(24*time.Hour).Format(time.RFC3339)
	// Debian's kernel digest, and a digest of another kernel.
	kernelA, kernelB := debian.Boot.Kernels()[0], strings.Repeat("ab", 32)
	// The Debian boot with a MokList of more than the vendor certificate:
	// a machine-owner key enrolled.
	mokEnrolled := debian
	st := *debian.Boot.ShimState
	st.MokListOnly = ""
	mokEnrolled.Boot.ShimState = &st

	type audit struct {
		rule   string
		reason attest.Reason
	}
	cases := []struct {
		name    string
		machine policy.Learned
		tpm     string
		want    attest.Reason // "" admitted
		audits  []audit
	}{
		{"signers of every stage", debian, signers(microsoftUEFICA, debianCA, debianCA), "", nil},
		{"a signer among several listed", debian, signers(otherKey+", "+microsoftUEFICA, debianCA, otherKey+", "+debianCA), "", nil},
		{"the kernel signed by a key not listed", debian, signers(microsoftUEFICA, debianCA, otherKey), attest.ReasonPolicyBootSigner, nil},
		{"the shim's signer is the firmware's db entry, not the vendor's", debian, signers(debianCA, debianCA, debianCA), attest.ReasonPolicyBootSigner, nil},
		{"signer and digest both hold", debian, signers(microsoftUEFICA, debianCA, debianCA) + "  # \n", "", nil},
		{"signer holds, digest not listed", debian,
			"bootComponents:\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {signedBy: [" + debianCA + "], allow: [" + kernelB + "]}\n", attest.ReasonPolicyBootNotAllowed, nil},
		{"digest listed, signer not", debian,
			"bootComponents:\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {signedBy: [" + otherKey + "], allow: [" + kernelA + "]}\n", attest.ReasonPolicyBootSigner, nil},
		{"the shim's built-in certificate (RHEL 8)", rhel, signers(microsoftUEFICA, redHatCA5, redHatCA5), "", nil},
		{"a signer rule on a boot with Secure Boot off", learned(t, "ubuntu-2104-no-secure-boot"),
			"bootComponents:\n  shim: {signedBy: [" + microsoftUEFICA + "]}\n  bootloader: {any: true}\n  kernel: {any: true}\n", attest.ReasonBootSignerUnknown, nil},

		{"SBAT at the minimum", debian, anyChain + "minimumSBAT: {shim: 4, grub: 5}\n", "", nil},
		{"SBAT below the minimum", debian, anyChain + "minimumSBAT: {grub: 6}\n", attest.ReasonPolicySBAT, nil},
		{"SBAT of a component the level does not name", debian, anyChain + "minimumSBAT: {fwupd: 2}\n", attest.ReasonPolicySBAT, nil},
		{"SBAT not measured (RHEL 8's shim 15)", rhel, anyChain + "minimumSBAT: {shim: 1}\n", attest.ReasonPolicySBAT, nil},

		{"a denied signer verified GRUB and the kernel (Debian's CA)", debian, anyChain + "deniedSigners: [" + debianCA + "]\n", attest.ReasonPolicyBootSignerDenied, nil},
		{"a denied signer verified the shim (Microsoft's UEFI CA)", debian, anyChain + "deniedSigners: [" + otherKey + ", " + microsoftUEFICA + "]\n", attest.ReasonPolicyBootSignerDenied, nil},
		{"a denied signer refuses even where signedBy lists it", debian, signers(microsoftUEFICA, debianCA, debianCA) + "deniedSigners: [" + debianCA + "]\n", attest.ReasonPolicyBootSignerDenied, nil},
		{"a denied signer the shim's built-in certificate (RHEL 8)", rhel, anyChain + "deniedSigners: [" + redHatCA5 + "]\n", attest.ReasonPolicyBootSignerDenied, nil},
		{"a denied signer this boot did not use", debian, anyChain + "deniedSigners: [" + otherKey + ", " + redHatCA5 + "]\n", "", nil},
		{"audit: deniedSigners", debian, anyChain + "deniedSigners: [" + debianCA + "]\naudit: [deniedSigners]\n", "",
			[]audit{{"deniedSigners", attest.ReasonPolicyBootSignerDenied}}},

		{"no MOK: MokList is the vendor certificate alone", debian, anyChain + "machineOwnerKeys: {allow: []}\n", "", nil},
		{"the shim's built-in certificate is no MOK", rhel, anyChain + "machineOwnerKeys: {allow: []}\n", "", nil},
		{"a MokList authority with keys enrolled, none listed", mokEnrolled, anyChain + "machineOwnerKeys: {allow: []}\n", attest.ReasonPolicyMOK, nil},
		{"a MokList authority with keys enrolled, listed", mokEnrolled, anyChain + "machineOwnerKeys: {allow: [" + debianCA + "]}\n", "", nil},

		{"a second reference set admits the new kernel", debian,
			"bootComponents:\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {allow: [" + kernelB + "]}\nreferenceSets:\n- name: release-2\n  notAfter: " + future + "\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {allow: [" + kernelA + "]}\n", "", nil},
		{"a reference set past its notAfter", debian,
			"bootComponents:\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {allow: [" + kernelB + "]}\nreferenceSets:\n- name: release-1\n  notAfter: " + past + "\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {allow: [" + kernelA + "]}\n", attest.ReasonPolicyReferenceSetExpired, nil},
		{"a reference set that does not match either", debian,
			"bootComponents:\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {allow: [" + kernelB + "]}\nreferenceSets:\n- name: release-2\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {signedBy: [" + otherKey + "]}\n", attest.ReasonPolicyBootNotAllowed, nil},
		{"bootComponents' deny holds in every set", debian,
			"bootComponents:\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {allow: [" + kernelB + "], deny: [" + kernelA + "]}\nreferenceSets:\n- name: release-2\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {any: true}\n", attest.ReasonPolicyBootDenied, nil},

		{"audit: the kernel's digest rule", debian,
			"bootComponents:\n  shim: {signedBy: [" + microsoftUEFICA + "]}\n  bootloader: {signedBy: [" + debianCA + "]}\n  kernel: {allow: [" + kernelB + "]}\naudit: [bootComponents.kernel]\n", "",
			[]audit{{"bootComponents.kernel", attest.ReasonPolicyBootNotAllowed}}},
		{"audit of the kernel does not lift the boot loader", debian,
			"bootComponents:\n  shim: {any: true}\n  bootloader: {signedBy: [" + otherKey + "]}\n  kernel: {allow: [" + kernelB + "]}\naudit: [bootComponents.kernel]\n", attest.ReasonPolicyBootSigner, nil},
		{"an audited stage before a refusing one: the refusal is the refusing stage's", debian,
			"bootComponents:\n  shim: {any: true}\n  bootloader: {signedBy: [" + otherKey + "]}\n  kernel: {allow: [" + kernelB + "]}\naudit: [bootComponents.bootloader]\n", attest.ReasonPolicyBootNotAllowed, nil},
		{"audit: a matching reference set reports nothing", debian,
			"bootComponents:\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {allow: [" + kernelB + "]}\nreferenceSets:\n- name: release-2\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {signedBy: [" + debianCA + "]}\naudit: [bootComponents]\n", "", nil},
		{"audit: SBAT and MOK rules", mokEnrolled, anyChain + "minimumSBAT: {grub: 9}\nmachineOwnerKeys: {allow: []}\naudit: [minimumSBAT, machineOwnerKeys]\n", "",
			[]audit{{"minimumSBAT", attest.ReasonPolicySBAT}, {"machineOwnerKeys", attest.ReasonPolicyMOK}}},
		{"audit one rule, another refuses", debian, anyChain + "minimumSBAT: {grub: 9}\nminimumDBX: {entries: 100}\naudit: [minimumSBAT]\n", attest.ReasonPolicyDBX, nil},
		{"audit never lifts the EK's trust", debian, "ekTrust: [inventory]\n" + anyChain + "audit: [bootComponents]\n", attest.ReasonPolicyEKTrust, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := bootPolicy(t, c.tpm)
			d, err := p.Decide("w", claimsOf(c.machine), policy.Options{Now: now})
			if r, _ := attest.ReasonOf(err); r != c.want {
				t.Fatalf("decided %v; want %q", err, c.want)
			}
			if err != nil {
				return
			}
			var got []audit
			for _, a := range d.Audits {
				got = append(got, audit{a.Rule, a.Reason})
				if a.Setting == "" || a.Message == "" {
					t.Errorf("audit %+v: no setting or message", a)
				}
			}
			if !slices.Equal(got, c.audits) {
				t.Errorf("audits %+v; want %+v", got, c.audits)
			}
		})
	}
}

const anyChain = "bootComponents:\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel: {any: true}\n"

// TestPoolAudit: pools.NAME.audit audits every boot rule: a machine each
// of them would refuse is admitted with one report per rule; the claims'
// time is the clock when none is given.
func TestPoolAudit(t *testing.T) {
	debian := learned(t, "debian-12-ovmf-secure-boot")
	doc := `apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
trust: {ekRoots: [{name: vendor, dir: /x}]}
pools:
  w:
    evidence: [tpm]
    audit: true
    tpm:
      ekTrust: [ca:vendor]
      bootComponents:
        shim: {signedBy: [` + otherKey + `]}
        bootloader: {any: true}
        kernel: {any: true}
      referenceSets:
      - {name: old, notAfter: 2020-01-01T00:00:00Z, shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}
      minimumSBAT: {grub: 9}
      minimumDBX: {entries: 100}
      kernelCmdline: {any: true}
      grub: {any: true}
`
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	c := claimsOf(debian)
	c.VerifiedAt = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d, err := p.Decide("w", c, policy.Options{})
	if err != nil {
		t.Fatalf("an audit pool refused: %v", err)
	}
	var rules []string
	for _, a := range d.Audits {
		rules = append(rules, a.Rule+"/"+string(a.Reason))
	}
	// The shim's signer rule is audited, so bootComponents matches but
	// for it (the expired set is not needed, and not reported).
	want := []string{"bootComponents.shim/BootSignerNotAllowed", "minimumSBAT/SBATLevelOutdated", "minimumDBX/DBXOutdated"}
	if !slices.Equal(rules, want) {
		t.Errorf("audits %v; want %v", rules, want)
	}
	if err := p.Evaluate("w", c); err != nil {
		t.Errorf("Evaluate of the audit pool: %v", err)
	}
	if s := policy.FormatAudits(d.Audits, 80); len(s) != 80 {
		t.Errorf("FormatAudits cut to 80: %d bytes", len(s))
	}
	if s := policy.FormatAudits(d.Audits, 4096); strings.Count(s, "\n") != 2 || !strings.HasPrefix(s, "bootComponents.shim: BootSignerNotAllowed: ") {
		t.Errorf("FormatAudits: %q", s)
	}
	if w := strings.Join(p.Warnings(), "\n"); !strings.Contains(w, "audit: true") {
		t.Errorf("warnings do not say the pool audits: %q", w)
	}
}

// TestSignedByCertificate: a signedBy entry may be the PEM certificate,
// read as its SHA-256 fingerprint; what is neither does not load.
func TestSignedByCertificate(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "release signer"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	pemText := strings.TrimSpace(string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	sum := sha256.Sum256(der)
	body := "bootComponents:\n  shim: {any: true}\n  bootloader: {any: true}\n  kernel:\n    signedBy:\n    - |\n" + indent(pemText, "      ") + "    - " + strings.ToUpper(debianCA) + "\n"
	p := bootPolicy(t, body)
	got := p.Pools["w"].TPM.BootComponents.Kernel.SignedBy
	if !slices.Equal(got, []string{hex.EncodeToString(sum[:]), debianCA}) {
		t.Errorf("signedBy read as %v", got)
	}
	const chain = "bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: %s}\n"
	for name, bad := range map[string]string{
		"not hex":             fmt.Sprintf(chain, "{signedBy: [nothex]}"),
		"a SHA-1 fingerprint": fmt.Sprintf(chain, "{signedBy: ["+strings.Repeat("ab", 20)+"]}"),
		"a broken PEM":        fmt.Sprintf(chain, `{signedBy: ["-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"]}`),
		"signedBy beside any": fmt.Sprintf(chain, "{any: true, signedBy: ["+debianCA+"]}"),
		"a MOK not hex":       anyChain + "machineOwnerKeys: {allow: [x]}\n",
		"an unknown audit":    anyChain + "audit: [ekTrust]\n",
		"a set without name":  anyChain + "referenceSets: [{kernel: {any: true}, shim: {any: true}, bootloader: {any: true}}]\n",
		"an empty set stage":  anyChain + "referenceSets: [{name: a, kernel: {}, shim: {any: true}, bootloader: {any: true}}]\n",
		"two sets, one name":  anyChain + "referenceSets: [{name: a, kernel: {any: true}, shim: {any: true}, bootloader: {any: true}}, {name: a, kernel: {any: true}, shim: {any: true}, bootloader: {any: true}}]\n",
		"SBAT generation 0":   anyChain + "minimumSBAT: {grub: 0}\n",
	} {
		doc := "apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\ntrust: {ekRoots: [{name: v, dir: /x}]}\npools:\n  w:\n    evidence: [tpm]\n    tpm:\n      ekTrust: [ca:v]\n" + indent(bad, "      ")
		if _, err := policy.Parse([]byte(doc)); err == nil {
			t.Errorf("%s: loaded\n%s", name, doc)
		}
	}
}
