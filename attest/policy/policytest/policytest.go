// Package policytest builds attestation policies for tests, demos and
// benches: the pools they need, written as policy.Policy values and
// rendered as the YAML an operator would write (only the fields set), then
// loaded back through policy.Parse, so a policy built here is one the
// server accepts. No test copies a policy document by hand.
//
//	doc, err := policytest.New().EKRoot("swtpm-localca", roots).
//		Pool("worker", policytest.TPM("ca:swtpm-localca").SecureBoot().GCP("nodeproof-test").AWS("123456789012").Requested()).
//		Pool("master", policytest.Public().Private()).
//		YAML()
package policytest

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/policy"
)

// Common names of the tests' trust roots and cloud identities.
const (
	// GCPProject and AWSAccount are the fakes' (identity/gcp/gcptest,
	// identity/aws/awstest) default project and account.
	GCPProject = "nodeproof-test"
	AWSAccount = "123456789012"
	// AzureSubscription is identity/azuretpm/azuretpmtest's subscription.
	AzureSubscription = "8d2e6c4b-1a3f-4e5d-b7c9-2f0a1e3d5b6c"
)

// Builder is a policy being built.
type Builder struct {
	p policy.Policy
}

// New is a policy with no trust and no pools.
func New() *Builder {
	return &Builder{p: policy.Policy{APIVersion: policy.APIVersion, Kind: policy.Kind, Pools: map[string]policy.Pool{}}}
}

// EKRoot trusts the vendor CAs in dir as "ca:<name>".
func (b *Builder) EKRoot(name, dir string) *Builder {
	b.p.Trust.EKRoots = append(b.p.Trust.EKRoots, policy.EKRoot{Name: name, Dir: dir})
	return b
}

// EKInventory trusts the EKs listed in the inventory file at path.
func (b *Builder) EKInventory(path string) *Builder {
	b.p.Trust.EKInventory = path
	return b
}

// Pool adds (or replaces) a pool.
func (b *Builder) Pool(name string, p *Pool) *Builder {
	b.p.Pools[name] = p.p
	return b
}

// Policy is the policy as loaded from its YAML (what the server reads).
func (b *Builder) Policy() (*policy.Policy, error) {
	doc, err := b.YAML()
	if err != nil {
		return nil, err
	}
	return policy.Parse(doc)
}

// TB is what Must needs of a test (testing.TB fits).
type TB interface {
	Helper()
	Fatal(args ...any)
}

// Must is Policy for a test: a policy that does not load fails it.
func (b *Builder) Must(t TB) *policy.Policy {
	t.Helper()
	p, err := b.Policy()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// YAML renders the policy (the fields set, in the order of the policy's
// types) and checks that policy.Parse loads it.
func (b *Builder) YAML() ([]byte, error) {
	doc, err := policy.Marshal(&b.p)
	if err != nil {
		return nil, err
	}
	if _, err := policy.Parse(doc); err != nil {
		return nil, fmt.Errorf("policytest: the policy built does not load: %w\n%s", err, doc)
	}
	return doc, nil
}

// Write writes the policy to dir/policy.yaml and returns the path.
func (b *Builder) Write(dir string) (string, error) {
	doc, err := b.YAML()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "policy.yaml")
	return path, os.WriteFile(path, doc, 0o600)
}

// Pool is a pool being built; each method sets one requirement and
// returns the pool.
type Pool struct {
	p policy.Pool
}

// Public is a pool that takes no evidence: the public tier only (the
// server's default).
func Public() *Pool { return &Pool{} }

// TPM is a pool taking TPM evidence vouched for by trust ("ca:<root>",
// "inventory"; none: any trust the policy has), any shim, boot loader and
// kernel, any command line, grub.cfg and initramfs.
func TPM(trust ...string) *Pool {
	p := &Pool{}
	return p.TPM(trust...)
}

// GCP is a pool taking GCP evidence from projects (none: GCPProject), in
// any zone.
func GCP(projects ...string) *Pool { return (&Pool{}).GCP(projects...) }

// AWS is a pool taking AWS evidence from accounts (none: AWSAccount), in
// any region.
func AWS(accounts ...string) *Pool { return (&Pool{}).AWS(accounts...) }

// TPM adds TPM evidence (see the function TPM).
func (p *Pool) TPM(trust ...string) *Pool {
	p.takes(attest.KindTPM)
	t := &p.p.TPM
	if len(trust) == 0 {
		t.AnyEKTrust = true
	}
	t.EKTrust = append(t.EKTrust, trust...)
	any := policy.DigestList{Any: true}
	t.BootComponents = policy.BootComponents{Shim: any, Bootloader: any, Kernel: any}
	p.anyAfterKernel()
	return p
}

// anyAfterKernel accepts any command line and anything GRUB ran or read,
// where the pool says nothing of them yet.
func (p *Pool) anyAfterKernel() {
	t := &p.p.TPM
	if t.KernelCmdline == nil {
		t.KernelCmdline = &policy.KernelCmdline{Any: true}
	}
	if t.Grub == nil {
		t.Grub = &policy.GrubRules{Any: true}
	}
}

// GCP adds GCP evidence (see the function GCP).
func (p *Pool) GCP(projects ...string) *Pool {
	p.takes(attest.KindGCP)
	if len(projects) == 0 {
		projects = []string{GCPProject}
	}
	p.p.GCP.Projects, p.p.GCP.AnyZone = append(p.p.GCP.Projects, projects...), true
	return p
}

// AWS adds AWS evidence (see the function AWS).
func (p *Pool) AWS(accounts ...string) *Pool {
	p.takes(attest.KindAWS)
	if len(accounts) == 0 {
		accounts = []string{AWSAccount}
	}
	p.p.AWS.Accounts, p.p.AWS.AnyRegion = append(p.p.AWS.Accounts, accounts...), true
	return p
}

// GCEVTPM adds GCE vTPM evidence from projects (none: GCPProject), in any
// zone (Zones narrows it), and any shim, boot loader and kernel unless the
// pool's boot is set already.
func (p *Pool) GCEVTPM(projects ...string) *Pool {
	p.takes(attest.KindGCEVTPM)
	if len(projects) == 0 {
		projects = []string{GCPProject}
	}
	p.p.GCP.Projects, p.p.GCP.AnyZone = append(p.p.GCP.Projects, projects...), len(p.p.GCP.Zones) == 0
	p.anyBoot()
	return p
}

// NitroTPM adds NitroTPM evidence from accounts (none: AWSAccount), in any
// region, and any shim, boot loader and kernel (SHA-384 digests when
// listed) unless the pool's boot is set already.
func (p *Pool) NitroTPM(accounts ...string) *Pool {
	p.takes(attest.KindNitroTPM)
	if len(accounts) == 0 {
		accounts = []string{AWSAccount}
	}
	p.p.AWS.Accounts, p.p.AWS.AnyRegion = append(p.p.AWS.Accounts, accounts...), len(p.p.AWS.Regions) == 0
	p.anyBoot()
	return p
}

// AzureVTPM adds Azure Trusted Launch vTPM evidence from subscriptions
// (none: AzureSubscription), and any shim, boot loader and kernel unless
// the pool's boot is set already. Azure signs no VM name: such a pool
// needs Requested for its machines to enrol.
func (p *Pool) AzureVTPM(subscriptions ...string) *Pool {
	p.takes(attest.KindAzureVTPM)
	if len(subscriptions) == 0 {
		subscriptions = []string{AzureSubscription}
	}
	p.p.Azure.Subscriptions = append(p.p.Azure.Subscriptions, subscriptions...)
	p.anyBoot()
	return p
}

// Zones allows only these GCP zones.
func (p *Pool) Zones(zones ...string) *Pool {
	p.p.GCP.Zones, p.p.GCP.AnyZone = zones, false
	return p
}

// Regions allows only these AWS regions.
func (p *Pool) Regions(regions ...string) *Pool {
	p.p.AWS.Regions, p.p.AWS.AnyRegion = regions, false
	return p
}

// anyBoot allows any boot components where none are set, and any command
// line, grub.cfg and initramfs.
func (p *Pool) anyBoot() {
	p.anyAfterKernel()
	b := &p.p.TPM.BootComponents
	for _, d := range []policy.DigestList{b.Shim, b.Bootloader, b.Kernel} {
		if d.Any || len(d.Allow) > 0 || len(d.SignedBy) > 0 {
			return
		}
	}
	any := policy.DigestList{Any: true}
	*b = policy.BootComponents{Shim: any, Bootloader: any, Kernel: any}
}

func (p *Pool) takes(k attest.Kind) {
	for _, have := range p.p.Evidence {
		if have == k {
			return
		}
	}
	p.p.Evidence = append(p.p.Evidence, k)
}

// SecureBoot requires UEFI Secure Boot on.
func (p *Pool) SecureBoot() *Pool { p.p.TPM.RequireSecureBoot = true; return p }

// Boot allows exactly these shim, boot loader and kernel digests (hex); an
// empty one allows any at that stage.
func (p *Pool) Boot(shim, bootloader, kernel string) *Pool {
	stage := func(d string) policy.DigestList {
		if d == "" {
			return policy.DigestList{Any: true}
		}
		return policy.DigestList{Allow: []string{d}}
	}
	p.p.TPM.BootComponents = policy.BootComponents{Shim: stage(shim), Bootloader: stage(bootloader), Kernel: stage(kernel)}
	return p
}

// SignedBy requires a stage ("shim", "bootloader", "kernel") verified by
// one of certs (SHA-256 fingerprints or PEM), beside its digests if Boot
// listed any (a stage that was any no longer is).
func (p *Pool) SignedBy(stage string, certs ...string) *Pool {
	c := &p.p.TPM.BootComponents
	d := map[string]*policy.DigestList{"shim": &c.Shim, "bootloader": &c.Bootloader, "kernel": &c.Kernel}[stage]
	if d == nil {
		panic("policytest: no boot stage " + stage)
	}
	d.Any, d.SignedBy = false, append(d.SignedBy, certs...)
	return p
}

// DeniedSigners refuses boots in which one of these certificates (PEM
// or SHA-256 fingerprints) verified something (tpm.deniedSigners).
func (p *Pool) DeniedSigners(certs ...string) *Pool {
	p.p.TPM.DeniedSigners = certs
	return p
}

// DeniedDigests refuses boots that measured one of these digests
// (tpm.deniedDigests).
func (p *Pool) DeniedDigests(digests ...string) *Pool {
	p.p.TPM.DeniedDigests = digests
	return p
}

// MinimumSBAT requires the shim's SbatLevel at these generations.
func (p *Pool) MinimumSBAT(gens map[string]int) *Pool { p.p.TPM.MinimumSBAT = gens; return p }

// MOKs refuses boots verified by a machine-owner key not among allow
// (none: any MOK-verified boot).
func (p *Pool) MOKs(allow ...string) *Pool {
	p.p.TPM.MachineOwnerKeys = &policy.MachineOwnerKeys{Allow: allow}
	return p
}

// ReferenceSet accepts another boot chain beside bootComponents.
func (p *Pool) ReferenceSet(r policy.ReferenceSet) *Pool {
	p.p.TPM.ReferenceSets = append(p.p.TPM.ReferenceSets, r)
	return p
}

// Audit puts these rules (policy.AuditRules) in audit mode.
func (p *Pool) Audit(rules ...string) *Pool {
	p.p.TPM.Audit = append(p.p.TPM.Audit, rules...)
	return p
}

// Cmdline requires these kernel command-line arguments.
func (p *Pool) Cmdline(require ...string) *Pool {
	p.p.TPM.KernelCmdline = &policy.KernelCmdline{Require: require}
	return p
}

// ExactCmdline accepts exactly these kernel command lines (the kernel's
// path, then the arguments), but for words matching variable.
func (p *Pool) ExactCmdline(lines []string, variable ...string) *Pool {
	p.p.TPM.KernelCmdline = &policy.KernelCmdline{Exact: lines, Variable: variable}
	return p
}

// Grub accepts exactly these files GRUB read and commands it ran.
func (p *Pool) Grub(files []policy.GrubFile, commands []string) *Pool {
	p.p.TPM.Grub = &policy.GrubRules{Files: files, Commands: commands}
	return p
}

// EK accepts endorsement keys of this kind (attest.EKKinds).
func (p *Pool) EK(kind string) *Pool { p.p.TPM.EK = kind; return p }

// MinimumKernel refuses kernels older than version; versions maps kernel
// digests to their versions.
func (p *Pool) MinimumKernel(version string, versions map[string]string) *Pool {
	p.p.TPM.MinimumKernel = &policy.MinimumKernel{Version: version, Versions: versions}
	return p
}

// PCR requires PCR i to be value (hex, in the quoted bank).
func (p *Pool) PCR(i int, value string) *Pool {
	if p.p.TPM.PCRs == nil {
		p.p.TPM.PCRs = map[string]string{}
	}
	p.p.TPM.PCRs[fmt.Sprint(i)] = value
	return p
}

// MaxInstanceAge bounds a GCP instance's age at its first attestation.
func (p *Pool) MaxInstanceAge(d time.Duration) *Pool {
	p.p.GCP.MaxInstanceAge = policy.Duration{Duration: d}
	return p
}

// AWSNodeName says how an AWS instance is named (policy.AWSNodeName…).
func (p *Pool) AWSNodeName(how string) *Pool { p.p.AWS.NodeName = how; return p }

// Requested takes the node name the agent asks for when the evidence
// names none (serve.nodeNames: requested).
func (p *Pool) Requested() *Pool { p.p.Serve.NodeNames = "requested"; return p }

// Private serves no public tier (serve.public: false).
func (p *Pool) Private() *Pool {
	off := false
	p.p.Serve.Public = &off
	return p
}

// Token serves the full config for the provisioning token (serve.token).
func (p *Pool) Token() *Pool { p.p.Serve.Token = true; return p }

// Reenrol sets reenrol (policy.ReenrolAlways, policy.ReenrolAfterRelease).
func (p *Pool) Reenrol(how string) *Pool { p.p.Reenrol = how; return p }

// Lifetime sets how often nodes re-attest and when they go stale.
func (p *Pool) Lifetime(interval, staleAfter time.Duration) *Pool {
	p.p.Lifetime.Interval, p.p.Lifetime.StaleAfter = policy.Duration{Duration: interval}, policy.Duration{Duration: staleAfter}
	return p
}

// Edit changes the pool in ways the methods above do not.
func (p *Pool) Edit(fn func(*policy.Pool)) *Pool { fn(&p.p); return p }
