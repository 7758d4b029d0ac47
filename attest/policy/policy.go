// Package policy decides whether verified Claims may have a pool. It is
// authorization only: a verifier has already established that the claims
// are authentic, and nothing here re-checks that.
//
// A policy is a YAML document, decoded strictly (an unknown field is an
// error, so a misspelt requirement can never silently pass):
//
//	apiVersion: nodeproof.io/v1alpha1
//	kind: AttestationPolicy
//	trust:
//	  ekRoots:
//	  - name: vendor-a              # EK certificates chaining here are "ca:vendor-a"
//	    dir: ek-roots/vendor-a      # PEM files; relative to the policy file
//	  ekInventory: ek-inventory.yaml
//	pools:
//	  worker:
//	    evidence: [tpm]
//	    tpm:
//	      ekTrust: [ca:vendor-a, inventory]
//	      allowSHA1: false
//	      requireSecureBoot: true
//	      bootComponents:
//	        shim:       {allow: [<sha256>...], deny: [...]}
//	        bootloader: {allow: [...]}
//	        kernel:     {any: true}     # or allow: [...]
//	      deniedDigests: [<digest>...]
//	      minimumDBX: {entries: 100, contains: [<sha256>...]}
//	      pcrs: {"0": <hex>, "7": <hex>}
//	      kernelCmdline: {require: [...], forbid: [...]}
//	    gcp: {projects: [my-project], zones: [us-central1-a], maxInstanceAge: 1h}
//	    aws: {accounts: ["123456789012"], regions: [us-east-1], requireLiveCheck: false}
//	    serve:
//	      public: true               # the public tier without credentials
//	      token: false               # provisioning tokens (the token tier)
//	      attested: true             # config tokens from attestation
//	      insecurePort: public       # what port 22624 serves: public, none, all
//	      fullWithoutCredentials: false  # the OpenShift MCS's behaviour; migration only
//	      nodeNames: evidence        # or requested
//	    reenrol: afterRelease        # or always (see Pool.Reenrol)
//	    lifetime: {interval: 1h, staleAfter: 3h, taintEffect: NoSchedule}
//
// An allow-list never means "any" when empty: in a pool that takes its
// kind of evidence, tpm.ekTrust, each tpm.bootComponents stage, gcp.projects,
// gcp.zones, aws.accounts and aws.regions must list what is allowed or set
// their explicit any (anyEKTrust, any, anyProject, anyZone, anyAccount,
// anyRegion), which the server logs at start; a policy with an empty one
// does not load, and Evaluate refuses on one too (a Policy built in code).
//
// docs/policy.md is the reference for operators: every field, its default
// and what empty means, with examples a test loads.
package policy

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/nodeproof/nodeproof/attest"
)

// APIVersion and Kind identify a policy document.
const (
	APIVersion = "nodeproof.io/v1alpha1"
	Kind       = "AttestationPolicy"
)

// Policy is a whole policy document.
type Policy struct {
	APIVersion string          `yaml:"apiVersion"`
	Kind       string          `yaml:"kind"`
	Trust      Trust           `yaml:"trust"`
	Pools      map[string]Pool `yaml:"pools"`
}

// Trust says what may vouch for a TPM's endorsement key. It configures the
// verifier (authenticity); pools then choose among these (authorization).
type Trust struct {
	// EKRoots are named sets of TPM-vendor CAs, each a directory of PEM
	// certificates.
	EKRoots []EKRoot `yaml:"ekRoots"`
	// EKInventory is a YAML file of known EK hashes (attest/tpm
	// LoadInventory); empty for none.
	EKInventory string `yaml:"ekInventory"`
}

// EKRoot is one named set of vendor CAs.
type EKRoot struct {
	Name string `yaml:"name"`
	Dir  string `yaml:"dir"`
}

// Pool is what a pool requires.
type Pool struct {
	// Evidence lists the kinds of evidence this pool accepts. Empty accepts
	// none.
	Evidence []attest.Kind `yaml:"evidence"`
	// TPM requirements, for TPM evidence.
	TPM TPMPolicy `yaml:"tpm"`
	// GCP requirements, for GCP instance identity tokens.
	GCP GCPPolicy `yaml:"gcp"`
	// AWS requirements, for AWS instance identity documents.
	AWS AWSPolicy `yaml:"aws"`
	// Serve says what the Machine Config Server releases for this pool and
	// on what credentials.
	Serve Serve `yaml:"serve"`
	// Reenrol says when an identity (an EK, a cloud instance) that already
	// enrolled may enrol again — get a config and a first kubelet
	// certificate once more — with a new kubelet key. "afterRelease"
	// (the default): only after an operator released its node
	// (`nodeproof release NODE`); enrolling again with the kubelet key the
	// enrolment bound, proven, is always allowed (a machine retrying after
	// a crash). "always": any enrolment of the identity with a fresh key
	// replaces the binding's key — a reinstalled machine re-enrols without
	// an operator, and so does anything that can make the identity's
	// evidence: a workload that reaches the cloud metadata server, a
	// privileged pod with the TPM device. See docs/security.md.
	Reenrol string `yaml:"reenrol"`
	// Lifetime says how the pool's nodes keep proving themselves after
	// they enrolled (docs/lifetime.md).
	Lifetime Lifetime `yaml:"lifetime"`
}

// Lifetime is a pool's re-attestation schedule and what an unattested
// node gets.
type Lifetime struct {
	// Interval is how often a node re-attests (the server tells the agent;
	// it adds jitter). Default DefaultReattestInterval.
	Interval Duration `yaml:"interval"`
	// StaleAfter: a node that has not passed an attestation for this long
	// is unattested (tainted, its certificate renewals denied). Default
	// three intervals; at least one.
	StaleAfter Duration `yaml:"staleAfter"`
	// TaintEffect is the effect of the nodeproof.io/unattested taint on an
	// unattested node: NoSchedule (default) or NoExecute. A revoked node is
	// always NoExecute.
	TaintEffect string `yaml:"taintEffect"`
}

// DefaultReattestInterval is Lifetime.Interval when unset.
const DefaultReattestInterval = time.Hour

// Taint effects (Lifetime.TaintEffect).
const (
	TaintNoSchedule = "NoSchedule"
	TaintNoExecute  = "NoExecute"
)

// LifetimeOf returns pool's lifetime with defaults filled in; a pool the
// policy does not name gets the defaults.
func (p *Policy) LifetimeOf(pool string) Lifetime {
	l := p.Pools[pool].Lifetime
	if l.Interval.Duration == 0 {
		l.Interval.Duration = DefaultReattestInterval
	}
	if l.StaleAfter.Duration == 0 {
		l.StaleAfter.Duration = 3 * l.Interval.Duration
	}
	if l.TaintEffect == "" {
		l.TaintEffect = TaintNoSchedule
	}
	return l
}

// Re-enrolment choices (Pool.Reenrol).
const (
	ReenrolAfterRelease = "afterRelease"
	ReenrolAlways       = "always"
)

// ReenrolsAlways reports whether pool re-enrols an enrolled identity with
// a new kubelet key without a release.
func (p *Policy) ReenrolsAlways(pool string) bool {
	return p.Pools[pool].Reenrol == ReenrolAlways
}

// TakesRequestedNames reports whether any pool takes requested node names
// (serve.nodeNames: requested).
func (p *Policy) TakesRequestedNames() bool {
	for pool := range p.Pools {
		if p.ServeFor(pool).NodeNames == "requested" {
			return true
		}
	}
	return false
}

// Serve is a pool's release policy (DESIGN.md, "Tiers").
type Serve struct {
	// Public serves the public tier (MachineConfigs marked safe before node
	// approval, and what a node needs to attest) without credentials.
	// Default on; off refuses unauthenticated fetches.
	Public *bool `yaml:"public"`
	// Token accepts a provisioning token (the token tier) for the full
	// config. Default off: for clusters with no TPM and no cloud identity.
	Token bool `yaml:"token"`
	// Attested accepts config tokens from attestation for the full config.
	// Default on when the pool accepts any evidence.
	Attested *bool `yaml:"attested"`
	// InsecurePort is what the plain-HTTP port (22624) may serve: "public"
	// (default), "none", or "all" (credentials over plain HTTP: only for
	// networks you trust).
	InsecurePort string `yaml:"insecurePort"`
	// FullWithoutCredentials serves the full config, secrets included, to
	// anyone who asks, as the OpenShift MCS does today. For a migration
	// period only; off by default and logged loudly when on.
	FullWithoutCredentials bool `yaml:"fullWithoutCredentials"`
	// NodeNames says where an attested node's name comes from: "evidence"
	// (default: the TPM inventory or the cloud document must name it) or
	// "requested" (the name the agent asks for, when the evidence names
	// none; the approver still checks it).
	NodeNames string `yaml:"nodeNames"`
}

// PublicTier reports whether the public tier is served.
func (s Serve) PublicTier() bool { return s.Public == nil || *s.Public }

// AttestedTier reports whether config tokens are accepted.
func (s Serve) AttestedTier() bool { return s.Attested == nil || *s.Attested }

// Warnings lists what a valid policy allows that a real deployment should
// not: pools open to any cloud project or account, pools that serve
// secrets without credentials. The server logs each at start.
func (p *Policy) Warnings() []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(p.Pools)) {
		pp := p.Pools[name]
		if slices.Contains(pp.Evidence, attest.KindGCP) && pp.GCP.AnyProject {
			out = append(out, fmt.Sprintf("pool %q: gcp.anyProject: an instance of any GCP project in the world may attest", name))
		}
		if slices.Contains(pp.Evidence, attest.KindAWS) && pp.AWS.AnyAccount {
			out = append(out, fmt.Sprintf("pool %q: aws.anyAccount: an instance of any AWS account in the world may attest", name))
		}
		for _, o := range pp.openLists() {
			out = append(out, fmt.Sprintf("pool %q: %s", name, o))
		}
	}
	return out
}

// openLists names the narrower allow-lists a pool opens with an explicit
// any (the cloud-wide ones are Warnings of their own).
func (pp Pool) openLists() []string {
	var out []string
	add := func(kind attest.Kind, on bool, what string) {
		if on && slices.Contains(pp.Evidence, kind) {
			out = append(out, what)
		}
	}
	add(attest.KindTPM, pp.TPM.AnyEKTrust, "tpm.anyEKTrust: an EK any configured trust vouched for may attest")
	add(attest.KindTPM, pp.TPM.BootComponents.Shim.Any, "tpm.bootComponents.shim.any: any shim not denied")
	add(attest.KindTPM, pp.TPM.BootComponents.Bootloader.Any, "tpm.bootComponents.bootloader.any: any boot loader not denied")
	add(attest.KindTPM, pp.TPM.BootComponents.Kernel.Any, "tpm.bootComponents.kernel.any: any kernel not denied")
	add(attest.KindGCP, pp.GCP.AnyZone, "gcp.anyZone: every zone of the listed projects")
	add(attest.KindAWS, pp.AWS.AnyRegion, "aws.anyRegion: every region of the listed accounts")
	return out
}

// ServeFor returns a pool's release policy; a pool the policy does not name
// gets the defaults (public tier only: it accepts no evidence).
func (p *Policy) ServeFor(pool string) Serve {
	if pp, ok := p.Pools[pool]; ok {
		return pp.Serve
	}
	return Serve{}
}

// TPMPolicy is what TPM evidence must show. Every requirement that reads
// the boot state refuses claims in which the event log did not establish
// that field: an empty or partial log never satisfies it.
type TPMPolicy struct {
	// EKTrust lists what may have vouched for the EK ("ca:<name>",
	// "inventory"); required in a pool that takes TPM evidence unless
	// AnyEKTrust.
	EKTrust []string `yaml:"ekTrust"`
	// AnyEKTrust accepts an EK that any trust of the policy's trust:
	// section vouched for (its roots and inventory). Logged at start.
	AnyEKTrust bool `yaml:"anyEKTrust"`
	// AllowSHA1 accepts quotes of the SHA-1 PCR bank. Off: a machine must
	// quote SHA-256 (SHA-1 PCRs can be forged by collision).
	AllowSHA1 bool `yaml:"allowSHA1"`
	// RequireSecureBoot refuses machines that booted without UEFI Secure
	// Boot, or whose log does not say.
	RequireSecureBoot bool `yaml:"requireSecureBoot"`
	// BootComponents constrain the boot chain the event log establishes:
	// the shim, the boot loader, the kernel. Each stage of a pool that
	// takes TPM evidence lists its allowed digests, or says any: true.
	BootComponents BootComponents `yaml:"bootComponents"`
	// DeniedDigests are refused wherever they appear among the boot
	// applications (revoked shims, vulnerable GRUBs).
	DeniedDigests []string `yaml:"deniedDigests"`
	// MinimumDBX requires a dbx at least this current.
	MinimumDBX *MinimumDBX `yaml:"minimumDBX"`
	// PCRs are reference values (hex, in the quoted bank) that quoted PCRs
	// must equal.
	PCRs map[string]string `yaml:"pcrs"`
	// KernelCmdline constrains the measured kernel command line.
	KernelCmdline *KernelCmdline `yaml:"kernelCmdline"`
}

// GCPPolicy is what a GCP instance must be. A pool that takes GCP evidence
// lists its projects, or says anyProject: an empty list never means any
// project in the world.
type GCPPolicy struct {
	// Projects are allowed project IDs (required unless AnyProject).
	Projects []string `yaml:"projects"`
	// AnyProject accepts an instance of any GCP project: anyone with a
	// GCE instance anywhere could then attest. For test setups only;
	// logged as a warning when the server starts.
	AnyProject bool `yaml:"anyProject"`
	// Zones are allowed zones (e.g. us-central1-a); required unless
	// AnyZone.
	Zones []string `yaml:"zones"`
	// AnyZone accepts every zone of the allowed projects. Logged at start.
	AnyZone bool `yaml:"anyZone"`
	// MaxInstanceAge refuses instances created longer ago (a machine being
	// provisioned is minutes old; a token minted months later comes from
	// something running on the instance, not from its first boot). Unset:
	// DefaultGCPMaxInstanceAge, as long as an AWS document is accepted.
	MaxInstanceAge Duration `yaml:"maxInstanceAge"`
}

// AWSPolicy is what an EC2 instance must be. A pool that takes AWS
// evidence lists its accounts, or says anyAccount: an empty list never
// means any account in the world.
type AWSPolicy struct {
	// Accounts are allowed AWS account IDs (required unless AnyAccount).
	Accounts []string `yaml:"accounts"`
	// AnyAccount accepts an instance of any AWS account: anyone with an
	// EC2 instance anywhere could then attest. For test setups only;
	// logged as a warning when the server starts.
	AnyAccount bool `yaml:"anyAccount"`
	// Regions are allowed regions; required unless AnyRegion.
	Regions []string `yaml:"regions"`
	// AnyRegion accepts every region of the allowed accounts. Logged at
	// start.
	AnyRegion bool `yaml:"anyRegion"`
	// RequireLiveCheck refuses documents the EC2 API did not confirm (the
	// instance running, in the expected VPC and tags).
	RequireLiveCheck bool `yaml:"requireLiveCheck"`
	// NodeName is the node name an attested instance gets:
	// "privateDNSName" (the default, what EC2 and the AWS cloud provider
	// name nodes) or "instanceID". Never the name the machine asks for.
	NodeName string `yaml:"nodeName"`
}

// DefaultGCPMaxInstanceAge is GCPPolicy.MaxInstanceAge when unset: the
// same first-boot window as the AWS document age (identity/aws).
const DefaultGCPMaxInstanceAge = time.Hour

// AWS node name choices.
const (
	AWSNodeNamePrivateDNS = "privateDNSName"
	AWSNodeNameInstanceID = "instanceID"
)

// Duration is a time.Duration written as "10m", "1h".
type Duration struct{ time.Duration }

// UnmarshalYAML reads a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	if v < 0 {
		return fmt.Errorf("duration %q is negative", s)
	}
	d.Duration = v
	return nil
}

// BootComponents are allow/deny lists for each boot stage.
type BootComponents struct {
	Shim       DigestList `yaml:"shim"`
	Bootloader DigestList `yaml:"bootloader"`
	Kernel     DigestList `yaml:"kernel"`
}

// DigestList allows and denies digests (hex) for one boot stage. Allow
// requires the stage measured and its digest listed; Any accepts whatever
// was (or was not) measured there, unless denied. An empty Allow without
// Any refuses: it never means any.
type DigestList struct {
	Allow []string `yaml:"allow"`
	Any   bool     `yaml:"any"`
	Deny  []string `yaml:"deny"`
}

// MinimumDBX says how current the UEFI revocation list must be.
type MinimumDBX struct {
	// Entries is the least number of dbx entries.
	Entries int `yaml:"entries"`
	// Contains are SHA-256 hashes (hex) the dbx must revoke.
	Contains []string `yaml:"contains"`
}

// KernelCmdline requires and forbids whole arguments of the kernel
// command line ("lockdown=integrity", "init=/bin/sh").
type KernelCmdline struct {
	Require []string `yaml:"require"`
	Forbid  []string `yaml:"forbid"`
}

// Load reads and checks a policy file. Relative paths in it are resolved
// against the file's directory.
func Load(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	p, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", path, err)
	}
	base := filepath.Dir(path)
	for i := range p.Trust.EKRoots {
		if !filepath.IsAbs(p.Trust.EKRoots[i].Dir) {
			p.Trust.EKRoots[i].Dir = filepath.Join(base, p.Trust.EKRoots[i].Dir)
		}
	}
	if p.Trust.EKInventory != "" && !filepath.IsAbs(p.Trust.EKInventory) {
		p.Trust.EKInventory = filepath.Join(base, p.Trust.EKInventory)
	}
	return p, nil
}

// Parse decodes a policy strictly and validates it.
func Parse(b []byte) (*Policy, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var p Policy
	if err := dec.Decode(&p); err != nil {
		// yaml.v3 names the line and the Go type it wanted: say where the
		// types are written for people.
		return nil, fmt.Errorf("decode: %w (docs/policy.md lists every field and its type)", err)
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

func (p *Policy) validate() error {
	if p.APIVersion != APIVersion || p.Kind != Kind {
		return fmt.Errorf("apiVersion/kind must be %s/%s, not %s/%s", APIVersion, Kind, p.APIVersion, p.Kind)
	}
	if len(p.Pools) == 0 {
		return errors.New("no pools")
	}
	roots := map[string]bool{}
	for _, r := range p.Trust.EKRoots {
		if r.Name == "" || r.Dir == "" {
			return errors.New("trust.ekRoots: every entry needs a name and a dir")
		}
		if roots[r.Name] {
			return fmt.Errorf("trust.ekRoots: %q named twice", r.Name)
		}
		roots[r.Name] = true
	}
	for name, pool := range p.Pools {
		if err := pool.validate(roots, p.Trust.EKInventory != ""); err != nil {
			return fmt.Errorf("pool %q: %w", name, err)
		}
	}
	return nil
}

// allowList checks one allow-list of a pool that takes its evidence: it
// lists what is allowed, or its any field says any; never both, never
// neither (an empty list does not mean any).
func allowList(field string, n int, anyOn bool, anyField, what string) error {
	switch {
	case n == 0 && !anyOn:
		return fmt.Errorf("%s is empty: list the %s (an empty list does not mean any; set %s for that)", field, what, anyField)
	case n > 0 && anyOn:
		return fmt.Errorf("%s and %s: choose one", field, strings.TrimSuffix(anyField, ": true"))
	}
	return nil
}

func (pool Pool) validate(roots map[string]bool, haveInventory bool) error {
	for _, k := range pool.Evidence {
		switch k {
		case attest.KindTPM:
			t := pool.TPM
			if err := errors.Join(
				allowList("tpm.ekTrust", len(t.EKTrust), t.AnyEKTrust, "tpm.anyEKTrust: true", "EK trusts"),
				allowList("tpm.bootComponents.shim.allow", len(t.BootComponents.Shim.Allow), t.BootComponents.Shim.Any, "tpm.bootComponents.shim.any: true", "shims"),
				allowList("tpm.bootComponents.bootloader.allow", len(t.BootComponents.Bootloader.Allow), t.BootComponents.Bootloader.Any, "tpm.bootComponents.bootloader.any: true", "boot loaders"),
				allowList("tpm.bootComponents.kernel.allow", len(t.BootComponents.Kernel.Allow), t.BootComponents.Kernel.Any, "tpm.bootComponents.kernel.any: true", "kernels"),
			); err != nil {
				return err
			}
		case attest.KindGCP:
			if err := errors.Join(
				allowList("gcp.projects", len(pool.GCP.Projects), pool.GCP.AnyProject, "gcp.anyProject: true", "projects whose instances may attest"),
				allowList("gcp.zones", len(pool.GCP.Zones), pool.GCP.AnyZone, "gcp.anyZone: true", "zones"),
			); err != nil {
				return err
			}
		case attest.KindAWS:
			if err := errors.Join(
				allowList("aws.accounts", len(pool.AWS.Accounts), pool.AWS.AnyAccount, "aws.anyAccount: true", "accounts whose instances may attest"),
				allowList("aws.regions", len(pool.AWS.Regions), pool.AWS.AnyRegion, "aws.anyRegion: true", "regions"),
			); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown evidence kind %q", k)
		}
	}
	switch pool.Serve.InsecurePort {
	case "", "public", "none", "all":
	default:
		return fmt.Errorf("serve.insecurePort %q is not public, none or all", pool.Serve.InsecurePort)
	}
	switch pool.AWS.NodeName {
	case "", AWSNodeNamePrivateDNS, AWSNodeNameInstanceID:
	default:
		return fmt.Errorf("aws.nodeName %q is not %s or %s", pool.AWS.NodeName, AWSNodeNamePrivateDNS, AWSNodeNameInstanceID)
	}
	if l := pool.Lifetime; l.StaleAfter.Duration > 0 {
		iv := l.Interval.Duration
		if iv == 0 {
			iv = DefaultReattestInterval
		}
		if l.StaleAfter.Duration < iv {
			return fmt.Errorf("lifetime.staleAfter %s is shorter than the interval %s", l.StaleAfter.Duration, iv)
		}
	}
	switch pool.Lifetime.TaintEffect {
	case "", TaintNoSchedule, TaintNoExecute:
	default:
		return fmt.Errorf("lifetime.taintEffect %q is not %s or %s", pool.Lifetime.TaintEffect, TaintNoSchedule, TaintNoExecute)
	}
	switch pool.Reenrol {
	case "", ReenrolAfterRelease, ReenrolAlways:
	default:
		return fmt.Errorf("reenrol %q is not %s or %s", pool.Reenrol, ReenrolAfterRelease, ReenrolAlways)
	}
	switch pool.Serve.NodeNames {
	case "", "evidence", "requested":
	default:
		return fmt.Errorf("serve.nodeNames %q is not evidence or requested", pool.Serve.NodeNames)
	}
	t := pool.TPM
	for _, tr := range t.EKTrust {
		switch {
		case tr == "inventory":
			if !haveInventory {
				return errors.New("tpm.ekTrust names inventory but trust.ekInventory is empty")
			}
		case strings.HasPrefix(tr, "ca:") && roots[strings.TrimPrefix(tr, "ca:")]:
		default:
			return fmt.Errorf("tpm.ekTrust %q is neither inventory nor ca:<a trust.ekRoots name>", tr)
		}
	}
	lists := map[string][]string{
		"bootComponents.shim.allow": t.BootComponents.Shim.Allow, "bootComponents.shim.deny": t.BootComponents.Shim.Deny,
		"bootComponents.bootloader.allow": t.BootComponents.Bootloader.Allow, "bootComponents.bootloader.deny": t.BootComponents.Bootloader.Deny,
		"bootComponents.kernel.allow": t.BootComponents.Kernel.Allow, "bootComponents.kernel.deny": t.BootComponents.Kernel.Deny,
		"deniedDigests": t.DeniedDigests,
	}
	if t.MinimumDBX != nil {
		lists["minimumDBX.contains"] = t.MinimumDBX.Contains
		if t.MinimumDBX.Entries < 0 {
			return errors.New("tpm.minimumDBX.entries is negative")
		}
	}
	for field, l := range lists {
		for _, d := range l {
			if err := checkHex(d); err != nil {
				return fmt.Errorf("tpm.%s: %w", field, err)
			}
		}
	}
	for idx, v := range t.PCRs {
		i, err := strconv.Atoi(idx)
		if err != nil || i < 0 || i > 23 {
			return fmt.Errorf("tpm.pcrs: %q is not a PCR index 0-23", idx)
		}
		if err := checkHex(v); err != nil {
			return fmt.Errorf("tpm.pcrs[%s]: %w", idx, err)
		}
	}
	return nil
}

func checkHex(s string) error {
	b, err := hex.DecodeString(s)
	if err != nil || (len(b) != 20 && len(b) != 32 && len(b) != 48) {
		return fmt.Errorf("%q is not a hex SHA-1/256/384 digest", s)
	}
	return nil
}

// Evaluate decides whether claims may have pool. It returns nil or an error
// wrapping an *attest.Denial with the first failed requirement's reason.
//
// Requirements, in order:
//   - the pool is in the policy (PoolNotInPolicy) and accepts the claims'
//     kind (EvidenceKindNotAllowed);
//   - for TPM claims, see evaluateTPM.
func (p *Policy) Evaluate(pool string, c *attest.Claims) error { return p.evaluate(pool, c, true) }

// EvaluateReattestation is Evaluate for a node attesting again after its
// enrolment: every requirement but the first-boot window of cloud
// evidence (GCP maxInstanceAge), which a running node is past by design.
func (p *Policy) EvaluateReattestation(pool string, c *attest.Claims) error {
	return p.evaluate(pool, c, false)
}

func (p *Policy) evaluate(pool string, c *attest.Claims, firstBoot bool) error {
	pp, ok := p.Pools[pool]
	if !ok {
		return attest.DenySetting(attest.ReasonPolicyUnknownPool, "pools."+pool, "pool %q is not in the policy: add pools.%s", pool, pool)
	}
	at := "pools." + pool + "." // where this pool's settings are
	if !slices.Contains(pp.Evidence, c.Kind) {
		return attest.DenySetting(attest.ReasonPolicyKindNotAllowed, at+"evidence", "pool %q does not accept %s evidence: %sevidence lists %v", pool, c.Kind, at, pp.Evidence)
	}
	switch c.Kind {
	case attest.KindTPM:
		if c.TPM == nil {
			return attest.Deny(attest.ReasonMalformed, "TPM claims without TPM facts")
		}
		return evaluateTPM(at+"tpm.", &pp.TPM, c.TPM)
	case attest.KindGCP:
		if c.GCP == nil {
			return attest.Deny(attest.ReasonMalformed, "GCP claims without GCP facts")
		}
		return evaluateGCP(at+"gcp.", &pp.GCP, c.GCP, c.VerifiedAt, firstBoot)
	case attest.KindAWS:
		if c.AWS == nil {
			return attest.Deny(attest.ReasonMalformed, "AWS claims without AWS facts")
		}
		return evaluateAWS(at+"aws.", &pp.AWS, c.AWS)
	}
	return attest.Deny(attest.ReasonPolicyKindNotAllowed, "unknown evidence kind %q", c.Kind)
}

// evaluateGCP checks the project (ProjectNotAllowed), the zone
// (ZoneNotAllowed) and the instance's age at verification time
// (InstanceTooOld: more than maxInstanceAge, DefaultGCPMaxInstanceAge when
// unset, after the instance was created).
// Each refusal names the setting (in, e.g. "pools.worker.gcp.").
func evaluateGCP(in string, g *GCPPolicy, c *attest.GCPClaims, at time.Time, firstBoot bool) error {
	if !g.AnyProject && !slices.Contains(g.Projects, c.ProjectID) {
		return attest.DenySetting(attest.ReasonPolicyProject, in+"projects", "project %s is not in %sprojects", c.ProjectID, in)
	}
	if !g.AnyZone && !slices.Contains(g.Zones, c.Zone) {
		return attest.DenySetting(attest.ReasonPolicyZone, in+"zones", "zone %s is not in %szones", c.Zone, in)
	}
	maxAge := g.MaxInstanceAge.Duration
	if maxAge == 0 {
		maxAge = DefaultGCPMaxInstanceAge
	}
	if firstBoot && at.Sub(c.InstanceCreated) > maxAge {
		return attest.DenySetting(attest.ReasonPolicyInstanceAge, in+"maxInstanceAge", "instance created %s, more than %s ago: first-boot evidence is accepted only within %smaxInstanceAge of the instance's creation", c.InstanceCreated.UTC().Format(time.RFC3339), maxAge, in)
	}
	return nil
}

// needsLog reports whether a TPM pool has a rule only an event log can
// satisfy: Secure Boot, a boot component's allow list, a dbx minimum, or
// command-line rules. (Denied digests and PCR values need none: no log
// denies nothing, and PCRs are quoted.)
func needsLog(t *TPMPolicy) bool {
	c := t.BootComponents
	return t.RequireSecureBoot || !c.Shim.Any || !c.Bootloader.Any || !c.Kernel.Any || t.MinimumDBX != nil ||
		(t.KernelCmdline != nil && (len(t.KernelCmdline.Require) > 0 || len(t.KernelCmdline.Forbid) > 0))
}

// evaluateAWS checks the account (AccountNotAllowed), the region
// (RegionNotAllowed) and, if required, that the EC2 API confirmed the
// instance (LiveCheckRequired).
// Each refusal names the setting (in, e.g. "pools.worker.aws.").
func evaluateAWS(in string, a *AWSPolicy, c *attest.AWSClaims) error {
	if !a.AnyAccount && !slices.Contains(a.Accounts, c.AccountID) {
		return attest.DenySetting(attest.ReasonPolicyAccount, in+"accounts", "account %s is not in %saccounts", c.AccountID, in)
	}
	if !a.AnyRegion && !slices.Contains(a.Regions, c.Region) {
		return attest.DenySetting(attest.ReasonPolicyRegion, in+"regions", "region %s is not in %sregions", c.Region, in)
	}
	if a.RequireLiveCheck && !c.LiveChecked {
		return attest.DenySetting(attest.ReasonPolicyLiveCheck, in+"requireLiveCheck", "the EC2 API did not confirm this instance, and %srequireLiveCheck is set (the server's --aws-live-check-region turns the check on)", in)
	}
	return nil
}

// evaluateTPM checks, in order: the PCR bank (SHA1BankNotAllowed), the EK
// trust (EKTrustNotAllowed), that an event log was sent when a rule below
// needs one (EventLogMissing), Secure Boot (SecureBootStateUnknown,
// SecureBootDisabled), denied digests anywhere among boot applications and
// per stage (BootComponentDenied), per-stage allow lists
// (BootComponentNotMeasured, BootComponentNotAllowed), the dbx
// (DBXOutdated), PCR reference values (PCRValueMismatch) and the kernel
// command line (KernelCmdlineNotAllowed). Each refusal names the setting
// (in, e.g. "pools.worker.tpm.").
func evaluateTPM(in string, t *TPMPolicy, c *attest.TPMClaims) error {
	if c.PCRBank != "sha256" && !(c.PCRBank == "sha1" && t.AllowSHA1) {
		return attest.DenySetting(attest.ReasonPolicySHA1, in+"allowSHA1", "quote is of the %s bank; this pool requires sha256 unless %sallowSHA1", c.PCRBank, in)
	}
	if !t.AnyEKTrust && !slices.Contains(t.EKTrust, c.EKTrust) {
		return attest.DenySetting(attest.ReasonPolicyEKTrust, in+"ekTrust", "EK vouched for by %s; %sekTrust accepts %v", c.EKTrust, in, t.EKTrust)
	}
	b := &c.Boot
	if b.LogMissing && needsLog(t) {
		return attest.Deny(attest.ReasonEventLogMissing, "the machine sent no event log, and this pool's boot rules need one: the firmware's log did not reach its kernel (with Secure Boot off, GRUB's linux command boots the kernel without its EFI stub; linuxefi keeps the log)")
	}
	if t.RequireSecureBoot {
		if !b.SecureBootKnown {
			return attest.DenySetting(attest.ReasonPolicySecureBootUnk, in+"requireSecureBoot", "the event log does not establish the Secure Boot state, which %srequireSecureBoot needs", in)
		}
		if !b.SecureBoot {
			return attest.DenySetting(attest.ReasonPolicySecureBootOff, in+"requireSecureBoot", "the machine booted with Secure Boot off; %srequireSecureBoot is set", in)
		}
	}
	for i, app := range b.BootApplications {
		if containsHex(t.DeniedDigests, app) {
			return attest.DenySetting(attest.ReasonPolicyBootDenied, in+"deniedDigests", "boot application %d (%s) is in %sdeniedDigests", i, app, in)
		}
	}
	stages := []struct {
		name   string
		list   DigestList
		digest string
	}{{"shim", t.BootComponents.Shim, b.Shim}, {"bootloader", t.BootComponents.Bootloader, b.Bootloader}, {"kernel", t.BootComponents.Kernel, b.Kernel}}
	for _, s := range stages {
		stage := in + "bootComponents." + s.name + "."
		if s.digest != "" && containsHex(s.list.Deny, s.digest) {
			return attest.DenySetting(attest.ReasonPolicyBootDenied, stage+"deny", "%s %s is in %sdeny", s.name, s.digest, stage)
		}
		if s.list.Any {
			continue
		}
		if len(s.list.Allow) == 0 {
			return attest.DenySetting(attest.ReasonPolicyBootNotAllowed, stage+"allow", "the pool allows no %s: %sallow is empty (an empty list allows none; %sany: true allows any)", s.name, stage, stage)
		}
		if s.digest == "" {
			return attest.DenySetting(attest.ReasonPolicyBootMissing, stage+"allow", "no %s was measured, and %sallow allows only listed ones", s.name, stage)
		}
		if !containsHex(s.list.Allow, s.digest) {
			return attest.DenySetting(attest.ReasonPolicyBootNotAllowed, stage+"allow", "%s %s is not in %sallow", s.name, s.digest, stage)
		}
	}
	if m := t.MinimumDBX; m != nil {
		if !b.DBXKnown {
			return attest.DenySetting(attest.ReasonPolicyDBX, in+"minimumDBX", "the event log does not establish the dbx, which %sminimumDBX needs", in)
		}
		if b.DBXEntries < m.Entries {
			return attest.DenySetting(attest.ReasonPolicyDBX, in+"minimumDBX", "dbx has %d entries; %sminimumDBX.entries requires %d", b.DBXEntries, in, m.Entries)
		}
		for _, h := range m.Contains {
			if !dbxRevokes(b.DBXSHA256s, h) {
				return attest.DenySetting(attest.ReasonPolicyDBX, in+"minimumDBX", "dbx does not revoke %s, which %sminimumDBX.contains requires", h, in)
			}
		}
	}
	for _, idx := range sortedPCRKeys(t.PCRs) {
		i, _ := strconv.Atoi(idx)
		got, ok := c.PCRs[i]
		if !ok || !strings.EqualFold(got, t.PCRs[idx]) {
			return attest.DenySetting(attest.ReasonPolicyPCRValue, in+"pcrs", "PCR %d is %s; %spcrs wants %s", i, got, in, t.PCRs[idx])
		}
	}
	if k := t.KernelCmdline; k != nil && (len(k.Require) > 0 || len(k.Forbid) > 0) {
		if !b.KernelCmdlineKnown {
			return attest.DenySetting(attest.ReasonPolicyKernelCmdline, in+"kernelCmdline", "the event log does not establish the kernel command line, which %skernelCmdline needs", in)
		}
		// Words without GRUB's quotes: where GRUB puts them is not
		// measured (see attest/tpm's grubCmdlineConsistent), so a quote
		// glued to a forbidden word must not hide it.
		args := strings.Fields(strings.ReplaceAll(b.KernelCmdline, `"`, ""))
		for _, r := range k.Require {
			if !slices.Contains(args, r) {
				return attest.DenySetting(attest.ReasonPolicyKernelCmdline, in+"kernelCmdline.require", "kernel command line lacks %q, which %skernelCmdline.require requires", r, in)
			}
		}
		for _, f := range k.Forbid {
			if slices.Contains(args, f) {
				return attest.DenySetting(attest.ReasonPolicyKernelCmdline, in+"kernelCmdline.forbid", "kernel command line has %q, which %skernelCmdline.forbid forbids", f, in)
			}
		}
	}
	return nil
}

func containsHex(list []string, digest string) bool {
	return slices.ContainsFunc(list, func(s string) bool { return strings.EqualFold(s, digest) })
}

// dbxRevokes reports whether the concatenated 32-byte dbx hashes hold the
// hex SHA-256 want.
func dbxRevokes(hashes []byte, want string) bool {
	w, err := hex.DecodeString(want)
	if err != nil || len(w) != 32 {
		return false
	}
	for i := 0; i+32 <= len(hashes); i += 32 {
		if bytes.Equal(hashes[i:i+32], w) {
			return true
		}
	}
	return false
}

func sortedPCRKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return x - y
	})
	return keys
}
