package policy

import (
	"bytes"
	"errors"
	"github.com/nodeproof/nodeproof/internal/attacktable"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

const (
	shimOK   = "40d6cae02973789080cf4c3a9ad11b5a0a4d8bba4438ab96e276cc784454dee7"
	grubOK   = "e8a268c431da72caaae407f729f602b9dbf5d1d43492d4a51cc2b688a08586e3"
	kernelOK = "e4c0382f98feaebfd43923a85fd6da9a20e1a48524a4d5928c31850ca1a96a6e"
	revoked  = "1111111111111111111111111111111111111111111111111111111111111111"
	pcr7     = "5fd54361d580eb7592adb8deb236ff35444ceeac7148f24b3de63c041f12b3da"
)

const strictPolicy = `
apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
trust:
  ekRoots:
  - {name: vendor, dir: roots}
  ekInventory: inventory.yaml
pools:
  worker:
    evidence: [tpm]
    tpm:
      ekTrust: [ca:vendor, inventory]
      requireSecureBoot: true
      bootComponents:
        shim: {allow: [` + shimOK + `]}
        bootloader: {any: true}
        kernel: {any: true, deny: [` + revoked + `]}
      deniedDigests: [` + revoked + `]
      minimumDBX: {entries: 2, contains: [` + revoked + `]}
      pcrs: {"7": ` + pcr7 + `}
      kernelCmdline: {require: [ro], forbid: [init=/bin/sh]}
      grub: {any: true}
  infra:
    evidence: [tpm]
    tpm:
      anyEKTrust: true
      allowSHA1: true
      bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}
      kernelCmdline: {any: true}
      grub: {any: true}
  lab:
    evidence: [gcp]
    gcp: {anyProject: true, anyZone: true}
`

// goodClaims satisfies the worker pool of strictPolicy.
func goodClaims() *attest.Claims {
	return &attest.Claims{
		Kind: attest.KindTPM,
		TPM: &attest.TPMClaims{
			EKTrust: "ca:vendor", EKKind: attest.EKKindRSA2048, PCRBank: "sha256", PCRs: map[int]string{7: pcr7},
			Boot: attest.BootState{
				SecureBootKnown: true, SecureBoot: true, DBXKnown: true, DBXEntries: 3,
				DBXSHA256s:         append(bytes.Repeat([]byte{0x22}, 32), bytes.Repeat([]byte{0x11}, 32)...),
				BootApplications:   []string{shimOK, grubOK, kernelOK},
				KernelCmdlineKnown: true, KernelCmdline: "/vmlinuz root=/dev/sda1 ro console=ttyS0",
			},
		},
	}
}

func TestEvaluate(t *testing.T) {
	p, err := Parse([]byte(strictPolicy))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		pool   string
		mutate func(c *attest.Claims)
		want   attest.Reason // "" = allowed
	}{
		{"honest machine", "worker", func(*attest.Claims) {}, ""},
		{"unknown pool", "nosuch", func(*attest.Claims) {}, attest.ReasonPolicyUnknownPool},
		{"TPM evidence for a GCP-only pool", "lab", func(*attest.Claims) {}, attest.ReasonPolicyKindNotAllowed},
		{"SHA-1 only", "worker", func(c *attest.Claims) { c.TPM.PCRBank = "sha1" }, attest.ReasonPolicySHA1},
		{"SHA-1 where the pool allows it", "infra", func(c *attest.Claims) { c.TPM.PCRBank = "sha1" }, ""},
		{"EK vouched for by another vendor", "worker", func(c *attest.Claims) { c.TPM.EKTrust = "ca:other" }, attest.ReasonPolicyEKTrust},
		{"Secure Boot off", "worker", func(c *attest.Claims) { c.TPM.Boot.SecureBoot = false }, attest.ReasonPolicySecureBootOff},
		{"empty event log", "worker", func(c *attest.Claims) { c.TPM.Boot = attest.BootState{} }, attest.ReasonPolicySecureBootUnk},
		{"no event log at all", "worker", func(c *attest.Claims) { c.TPM.Boot = attest.BootState{LogMissing: true} }, attest.ReasonEventLogMissing},
		{"no event log, a pool that needs none", "infra", func(c *attest.Claims) { c.TPM.Boot = attest.BootState{LogMissing: true} }, ""},
		{"revoked boot application", "worker", func(c *attest.Claims) {
			c.TPM.Boot.BootApplications = append(c.TPM.Boot.BootApplications, revoked)
		}, attest.ReasonPolicyBootDenied},
		{"revoked kernel", "worker", func(c *attest.Claims) {
			c.TPM.Boot.BootApplications[2] = strings.ToUpper(revoked)
		}, attest.ReasonPolicyBootDenied},
		{"revoked digest among the other images", "worker", func(c *attest.Claims) {
			c.TPM.Boot.OtherImages = []string{revoked}
		}, attest.ReasonPolicyBootDenied},
		{"revoked digest among the files GRUB read", "worker", func(c *attest.Claims) {
			c.TPM.Boot.GrubFiles = []attest.MeasuredFile{{Path: "/initrd.img", Digest: revoked}}
		}, attest.ReasonPolicyBootDenied},
		{"unlisted shim", "worker", func(c *attest.Claims) { c.TPM.Boot.BootApplications[0] = grubOK }, attest.ReasonPolicyBootNotAllowed},
		{"partial log without PCR 4", "worker", func(c *attest.Claims) {
			c.TPM.Boot.BootApplications = nil
		}, attest.ReasonPolicyBootMissing},
		{"the TPM's ECC EK", "worker", func(c *attest.Claims) { c.TPM.EKKind = attest.EKKindECCP256 }, attest.ReasonPolicyEKKind},
		{"claims with no EK kind", "worker", func(c *attest.Claims) { c.TPM.EKKind = "" }, attest.ReasonPolicyEKKind},
		{"old dbx", "worker", func(c *attest.Claims) { c.TPM.Boot.DBXEntries = 1 }, attest.ReasonPolicyDBX},
		{"dbx lacks a required revocation", "worker", func(c *attest.Claims) { c.TPM.Boot.DBXSHA256s = c.TPM.Boot.DBXSHA256s[:32] }, attest.ReasonPolicyDBX},
		{"dbx not measured", "worker", func(c *attest.Claims) { c.TPM.Boot.DBXKnown = false }, attest.ReasonPolicyDBX},
		{"PCR 7 differs", "worker", func(c *attest.Claims) { c.TPM.PCRs[7] = revoked }, attest.ReasonPolicyPCRValue},
		{"PCR 7 not quoted", "worker", func(c *attest.Claims) { delete(c.TPM.PCRs, 7) }, attest.ReasonPolicyPCRValue},
		{"init=/bin/sh", "worker", func(c *attest.Claims) { c.TPM.Boot.KernelCmdline += " init=/bin/sh" }, attest.ReasonPolicyKernelCmdline},
		{"init=/bin/sh in GRUB's quotes", "worker", func(c *attest.Claims) { c.TPM.Boot.KernelCmdline += ` "init=/bin/sh"` }, attest.ReasonPolicyKernelCmdline},
		{"read-write root", "worker", func(c *attest.Claims) { c.TPM.Boot.KernelCmdline = "/vmlinuz rw" }, attest.ReasonPolicyKernelCmdline},
		{"command line not measured", "worker", func(c *attest.Claims) { c.TPM.Boot.KernelCmdlineKnown = false }, attest.ReasonPolicyKernelCmdline},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := goodClaims()
			tc.mutate(c)
			err := p.Evaluate(tc.pool, c)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			got, ok := attest.ReasonOf(err)
			if !ok || got != tc.want {
				t.Fatalf("got %v (reason %q), want reason %s", err, got, tc.want)
			}
			checkSetting(t, err, tpmSettings[tc.name])
		})
	}
}

// tpmSettings is the setting each refusal of TestEvaluate names: what an
// operator changes to allow it ("-": none should).
var tpmSettings = map[string]string{
	"unknown pool":                              "pools.nosuch",
	"TPM evidence for a GCP-only pool":          "pools.lab.evidence",
	"SHA-1 only":                                "pools.worker.tpm.allowSHA1",
	"EK vouched for by another vendor":          "pools.worker.tpm.ekTrust",
	"Secure Boot off":                           "pools.worker.tpm.requireSecureBoot",
	"empty event log":                           "pools.worker.tpm.requireSecureBoot",
	"revoked boot application":                  "pools.worker.tpm.deniedDigests",
	"revoked kernel":                            "pools.worker.tpm.deniedDigests",
	"revoked digest among the other images":     "pools.worker.tpm.deniedDigests",
	"revoked digest among the files GRUB read":  "pools.worker.tpm.deniedDigests",
	"the TPM's ECC EK":                          "pools.worker.tpm.ek",
	"claims with no EK kind":                    "pools.worker.tpm.ek",
	"unlisted shim":                             "pools.worker.tpm.bootComponents.shim.allow",
	"partial log without PCR 4":                 "pools.worker.tpm.bootComponents.shim.allow",
	"old dbx":                                   "pools.worker.tpm.minimumDBX",
	"dbx lacks a required revocation":           "pools.worker.tpm.minimumDBX",
	"dbx not measured":                          "pools.worker.tpm.minimumDBX",
	"PCR 7 differs":                             "pools.worker.tpm.pcrs",
	"PCR 7 not quoted":                          "pools.worker.tpm.pcrs",
	"init=/bin/sh":                              "pools.worker.tpm.kernelCmdline.forbid",
	"init=/bin/sh in GRUB's quotes":             "pools.worker.tpm.kernelCmdline.forbid",
	"read-write root":                           "pools.worker.tpm.kernelCmdline.require",
	"command line not measured":                 "pools.worker.tpm.kernelCmdline",
	"no event log at all":                       "-", // the machine's boot loses its log: no setting should lift it
	"GCP project not allowed":                   "pools.gce.gcp.projects",
	"GCP zone not allowed":                      "pools.gce.gcp.zones",
	"GCP instance too old":                      "pools.gce.gcp.maxInstanceAge",
	"GCP token for the AWS pool":                "pools.ec2.evidence",
	"EC2 account not allowed":                   "pools.ec2.aws.accounts",
	"EC2 region not allowed":                    "pools.ec2.aws.regions",
	"EC2 without the live check":                "pools.ec2.aws.requireLiveCheck",
	"GCP token claims without an instance":      "-",
	"GCP token claims naming an EC2 instance":   "-",
	"EC2 document claims naming a GCP instance": "-",
}

// checkSetting: a refusal an operator can lift with a setting names it,
// as a typed field and in the detail the machine and the log show.
func checkSetting(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		t.Fatalf("the test names no setting for %v", err)
	}
	if want == "-" {
		if s := attest.SettingOf(err); s != "" {
			t.Errorf("refusal %v names setting %q; none should lift it", err, s)
		}
		return
	}
	var d *attest.Denial
	if !errors.As(err, &d) || d.Setting != want || !strings.Contains(d.Detail, want) {
		t.Errorf("refusal %v names setting %q; want %q, in its detail too", err, attest.SettingOf(err), want)
	}
}

func TestParseRefuses(t *testing.T) {
	head := "apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\n"
	const anyBoot = "bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}"
	cases := []struct {
		name, doc, want string
	}{
		{"misspelt requirement", head + "pools:\n  w:\n    evidence: [tpm]\n    tpm: {requireSecureBot: true}\n", "requireSecureBot"},
		{"unknown top-level field", head + "pool: {}\n", "pool"},
		{"wrong kind", "apiVersion: nodeproof.io/v1alpha1\nkind: Policy\npools: {w: {}}\n", "kind"},
		{"no pools", head, "no pools"},
		{"unknown evidence kind", head + "pools:\n  w: {evidence: [azure]}\n", "azure"},
		{"unknown AWS node name choice", head + "pools:\n  w: {evidence: [aws], aws: {accounts: [\"1\"], anyRegion: true, nodeName: hostname}}\n", "aws.nodeName"},
		{"a GCP pool without projects", head + "pools:\n  w: {evidence: [gcp], gcp: {anyZone: true}}\n", `pool "w": gcp.projects is empty`},
		{"a GCP pool with an empty project list", head + "pools:\n  w: {evidence: [gcp], gcp: {projects: [], anyZone: true}}\n", `pool "w": gcp.projects is empty`},
		{"a GCP pool with projects and anyProject", head + "pools:\n  w: {evidence: [gcp], gcp: {projects: [a], anyProject: true, anyZone: true}}\n", "choose one"},
		{"a GCP pool without zones", head + "pools:\n  w: {evidence: [gcp], gcp: {projects: [a]}}\n", `pool "w": gcp.zones is empty`},
		{"a GCP pool with zones and anyZone", head + "pools:\n  w: {evidence: [gcp], gcp: {projects: [a], zones: [z], anyZone: true}}\n", "choose one"},
		{"an AWS pool without accounts", head + "pools:\n  w: {evidence: [aws], aws: {anyRegion: true}}\n", `pool "w": aws.accounts is empty`},
		{"an AWS pool with accounts and anyAccount", head + "pools:\n  w: {evidence: [aws], aws: {accounts: [\"1\"], anyAccount: true, anyRegion: true}}\n", "choose one"},
		{"an AWS pool without regions", head + "pools:\n  w: {evidence: [aws], aws: {accounts: [\"1\"]}}\n", `pool "w": aws.regions is empty`},
		{"a TPM pool without EK trust", head + "pools:\n  w: {evidence: [tpm], tpm: {" + anyBoot + "}}\n", `pool "w": tpm.ekTrust is empty`},
		{"a TPM pool with EK trust and anyEKTrust", head + "trust: {ekInventory: i.yaml}\npools:\n  w: {evidence: [tpm], tpm: {ekTrust: [inventory], anyEKTrust: true, " + anyBoot + "}}\n", "choose one"},
		{"a TPM pool without a shim list", head + "pools:\n  w: {evidence: [tpm], tpm: {anyEKTrust: true, bootComponents: {bootloader: {any: true}, kernel: {any: true}}}}\n", `pool "w": tpm.bootComponents.shim.allow is empty`},
		{"a TPM pool without a boot loader list", head + "pools:\n  w: {evidence: [tpm], tpm: {anyEKTrust: true, bootComponents: {shim: {any: true}, kernel: {any: true}}}}\n", `tpm.bootComponents.bootloader.allow is empty`},
		{"a TPM pool with an empty kernel list", head + "pools:\n  w: {evidence: [tpm], tpm: {anyEKTrust: true, bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {allow: []}}}}\n", `tpm.bootComponents.kernel.allow is empty`},
		{"a TPM pool with a kernel list and any", head + "pools:\n  w: {evidence: [tpm], tpm: {anyEKTrust: true, bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true, allow: [" + kernelOK + "]}}}}\n", "choose one"},
		{"bad digest", head + "pools:\n  w: {tpm: {deniedDigests: [abc]}}\n", "abc"},
		{"PCR out of range", head + "pools:\n  w: {tpm: {pcrs: {\"24\": " + pcr7 + "}}}\n", "24"},
		{"unknown EK root", head + "pools:\n  w: {tpm: {ekTrust: [ca:nobody]}}\n", "ca:nobody"},
		{"inventory not configured", head + "pools:\n  w: {tpm: {ekTrust: [inventory]}}\n", "inventory"},
		{"unknown insecure port mode", head + "pools:\n  w: {serve: {insecurePort: open}}\n", "open"},
		{"unknown node name source", head + "pools:\n  w: {serve: {nodeNames: hostname}}\n", "hostname"},
		{"duplicate root name", head + "trust: {ekRoots: [{name: a, dir: x}, {name: a, dir: y}]}\npools: {w: {}}\n", "twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

func TestLoadResolvesRelativePaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(strictPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Trust.EKRoots[0].Dir; got != filepath.Join(dir, "roots") {
		t.Errorf("root dir %q", got)
	}
	if got := p.Trust.EKInventory; got != filepath.Join(dir, "inventory.yaml") {
		t.Errorf("inventory %q", got)
	}
}

func TestEvaluateCloud(t *testing.T) {
	doc := `
apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
pools:
  gce:
    evidence: [gcp]
    gcp: {projects: [prod], zones: [us-central1-a], maxInstanceAge: 1h}
  gceAnyZone:
    evidence: [gcp]
    gcp: {projects: [prod], anyZone: true}
  ec2AnyRegion:
    evidence: [aws]
    aws: {accounts: ["111122223333"], anyRegion: true}
  ec2:
    evidence: [aws]
    aws: {accounts: ["111122223333"], regions: [us-east-1], requireLiveCheck: true}
`
	p, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	gcp := func() *attest.Claims {
		return &attest.Claims{Kind: attest.KindGCP, VerifiedAt: now, Instance: &attest.InstanceClaims{Cloud: attest.CloudGCP, Account: "prod", Location: "us-central1-a", Created: now.Add(-5 * time.Minute)}}
	}
	aws := func() *attest.Claims {
		return &attest.Claims{Kind: attest.KindAWS, Instance: &attest.InstanceClaims{Cloud: attest.CloudAWS, Account: "111122223333", Location: "us-east-1", LiveChecked: true}}
	}
	cases := []struct {
		name   string
		pool   string
		claims *attest.Claims
		mutate func(c *attest.Claims)
		want   attest.Reason
	}{
		{"GCP instance", "gce", gcp(), func(*attest.Claims) {}, ""},
		{"GCP project not allowed", "gce", gcp(), func(c *attest.Claims) { c.Instance.Account = "dev" }, attest.ReasonPolicyProject},
		{"GCP zone not allowed", "gce", gcp(), func(c *attest.Claims) { c.Instance.Location = "europe-west1-b" }, attest.ReasonPolicyZone},
		{"GCP instance too old", "gce", gcp(), func(c *attest.Claims) { c.Instance.Created = now.Add(-2 * time.Hour) }, attest.ReasonPolicyInstanceAge},
		{"GCP token for the AWS pool", "ec2", gcp(), func(*attest.Claims) {}, attest.ReasonPolicyKindNotAllowed},
		{"EC2 instance", "ec2", aws(), func(*attest.Claims) {}, ""},
		{"EC2 account not allowed", "ec2", aws(), func(c *attest.Claims) { c.Instance.Account = "444455556666" }, attest.ReasonPolicyAccount},
		{"EC2 region not allowed", "ec2", aws(), func(c *attest.Claims) { c.Instance.Location = "eu-west-1" }, attest.ReasonPolicyRegion},
		{"EC2 without the live check", "ec2", aws(), func(c *attest.Claims) { c.Instance.LiveChecked = false }, attest.ReasonPolicyLiveCheck},
		{"GCP token claims without an instance", "gce", gcp(), func(c *attest.Claims) { c.Instance = nil }, attest.ReasonMalformed},
		{"GCP token claims naming an EC2 instance", "gce", gcp(), func(c *attest.Claims) { c.Instance.Cloud = attest.CloudAWS }, attest.ReasonMalformed},
		{"EC2 document claims naming a GCP instance", "ec2", aws(), func(c *attest.Claims) { c.Instance.Cloud = attest.CloudGCP }, attest.ReasonMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.mutate(tc.claims)
			err := p.Evaluate(tc.pool, tc.claims)
			got, _ := attest.ReasonOf(err)
			if (tc.want == "") != (err == nil) || got != tc.want {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if err != nil {
				checkSetting(t, err, tpmSettings[tc.name])
			}
		})
	}
	if _, err := Parse([]byte(strings.Replace(doc, "1h", "soon", 1))); err == nil {
		t.Fatal("a bad duration parsed")
	}
}

// TestWarnings: the pools open to any cloud project or account are named,
// so the server can say so at start; the others are not.
func TestWarnings(t *testing.T) {
	p, err := Parse([]byte(`apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
pools:
  lab: {evidence: [gcp, aws], gcp: {anyProject: true, zones: [z]}, aws: {anyAccount: true, regions: [r]}}
  prod: {evidence: [gcp, aws], gcp: {projects: [p], zones: [z]}, aws: {accounts: ["1"], regions: [r]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	w := p.Warnings()
	if len(w) != 2 || !strings.Contains(w[0], `pool "lab": gcp.anyProject`) || !strings.Contains(w[1], `pool "lab": aws.anyAccount`) {
		t.Fatalf("warnings %q", w)
	}
	c := &attest.Claims{Kind: attest.KindGCP, Instance: &attest.InstanceClaims{Cloud: attest.CloudGCP, Account: "anyone", Location: "z", Created: time.Now()}, VerifiedAt: time.Now()}
	if err := p.Evaluate("lab", c); err != nil {
		t.Fatalf("anyProject refused a project: %v", err)
	}
	if r, _ := attest.ReasonOf(p.Evaluate("prod", c)); r != attest.ReasonPolicyProject {
		t.Fatalf("a listed pool took another project: %v", r)
	}
}

// TestEvaluateFailsClosed: a Policy built in code, without Parse's
// checks, still refuses on an empty allow-list rather than accepting any.
func TestEvaluateFailsClosed(t *testing.T) {
	now := time.Now()
	anyBoot := BootComponents{Shim: DigestList{Any: true}, Bootloader: DigestList{Any: true}, Kernel: DigestList{Any: true}}
	tpmClaims := goodClaims()
	tests := []struct {
		name   string
		pool   Pool
		claims *attest.Claims
		want   attest.Reason
	}{
		{"no EK trust listed", Pool{Evidence: []attest.Kind{attest.KindTPM}, TPM: TPMPolicy{BootComponents: anyBoot}}, tpmClaims, attest.ReasonPolicyEKTrust},
		{"no kernel listed", Pool{Evidence: []attest.Kind{attest.KindTPM}, TPM: TPMPolicy{AnyEKTrust: true,
			BootComponents: BootComponents{Shim: DigestList{Any: true}, Bootloader: DigestList{Any: true}}}}, tpmClaims, attest.ReasonPolicyBootNotAllowed},
		{"no zone listed", Pool{Evidence: []attest.Kind{attest.KindGCP}, GCP: GCPPolicy{Projects: []string{"p"}}},
			&attest.Claims{Kind: attest.KindGCP, VerifiedAt: now, Instance: &attest.InstanceClaims{Cloud: attest.CloudGCP, Account: "p", Location: "z", Created: now}}, attest.ReasonPolicyZone},
		{"no region listed", Pool{Evidence: []attest.Kind{attest.KindAWS}, AWS: AWSPolicy{Accounts: []string{"1"}}},
			&attest.Claims{Kind: attest.KindAWS, VerifiedAt: now, Instance: &attest.InstanceClaims{Cloud: attest.CloudAWS, Account: "1", Location: "r"}}, attest.ReasonPolicyRegion},
		{"no project listed", Pool{Evidence: []attest.Kind{attest.KindGCP}, GCP: GCPPolicy{AnyZone: true}},
			&attest.Claims{Kind: attest.KindGCP, VerifiedAt: now, Instance: &attest.InstanceClaims{Cloud: attest.CloudGCP, Account: "p", Location: "z", Created: now}}, attest.ReasonPolicyProject},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &Policy{Pools: map[string]Pool{"w": tc.pool}}
			if r, _ := attest.ReasonOf(p.Evaluate("w", tc.claims)); r != tc.want {
				t.Fatalf("reason %q, want %q", r, tc.want)
			}
		})
	}
}

// TestOpenListsWarned: every explicit any is named in the warnings the
// server logs at start, with its pool.
func TestOpenListsWarned(t *testing.T) {
	p, err := Parse([]byte(`apiVersion: nodeproof.io/v1alpha1
kind: AttestationPolicy
trust: {ekInventory: i.yaml}
pools:
  open:
    evidence: [tpm, gcp, aws]
    tpm: {anyEKTrust: true, bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}}
    gcp: {projects: [p], anyZone: true}
    aws: {accounts: ["1"], anyRegion: true}
  closed:
    evidence: [tpm]
    tpm: {ekTrust: [inventory], bootComponents: {shim: {allow: [` + shimOK + `]}, bootloader: {allow: [` + grubOK + `]}, kernel: {allow: [` + kernelOK + `]}},
      kernelCmdline: {exact: ["/vmlinuz ro"]}, grub: {files: [{path: /initrd.img, digest: ` + kernelOK + `}]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	w := strings.Join(p.Warnings(), "\n")
	for _, want := range []string{"tpm.anyEKTrust", "tpm.bootComponents.shim.any", "tpm.bootComponents.bootloader.any", "tpm.bootComponents.kernel.any",
		"tpm.kernelCmdline.any", "tpm.grub.any", "gcp.anyZone", "aws.anyRegion"} {
		if !strings.Contains(w, `pool "open": `+want) {
			t.Errorf("warnings lack %s:\n%s", want, w)
		}
	}
	if strings.Contains(w, `pool "closed"`) {
		t.Errorf("a pool with every list explicit is warned about:\n%s", w)
	}
}

// TestPolicyParseAttacks: a policy file reads as one whole document —
// never its first part only, never one of two spellings of a key.
func TestPolicyParseAttacks(t *testing.T) {
	head := "apiVersion: nodeproof.io/v1alpha1\nkind: AttestationPolicy\n"
	const anyBoot = "bootComponents: {shim: {any: true}, bootloader: {any: true}, kernel: {any: true}}, kernelCmdline: {any: true}, grub: {any: true}"
	open := head + "pools:\n  w: {evidence: [tpm], serve: {insecurePort: public}, tpm: {anyEKTrust: true, " + anyBoot + "}}\n"
	if _, err := Parse([]byte(open)); err != nil {
		t.Fatalf("the open policy alone: %v", err)
	}
	cases := []struct{ attack, doc string }{
		{"policy file: an open policy, ---, then the strict one", open + "---\n" + head + "pools:\n  w: {evidence: [gcp], gcp: {projects: [a], anyZone: true}}\n"},
		{"policy file: a pool's key given twice", head + "pools:\n  w: {evidence: [tpm], evidence: [gcp], tpm: {anyEKTrust: true, " + anyBoot + "}}\n"},
		{"policy file: a trailing document of junk after ---", open + "---\nfoo: [\n"},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.doc))
		got := "refused"
		if err == nil {
			got = "accepted (part of the file in force)"
		}
		attacktable.Check(t, "policy", c.attack, "refused", got)
	}
}
