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
//	        kernel:     {signedBy: [<sha256 fingerprint or PEM>...]}  # or allow: [...], any: true
//	      deniedDigests: [<digest>...]
//	      minimumDBX: {entries: 100, contains: [<sha256>...]}
//	      minimumSBAT: {shim: 4, grub: 5}
//	      machineOwnerKeys: {allow: [<sha256 fingerprint>...]}
//	      referenceSets: [{name: r2, notAfter: 2027-01-31T00:00:00Z, kernel: {signedBy: [...]}, ...}]
//	      audit: [bootComponents.kernel]   # rules that admit and report
//	      pcrs: {"0": <hex>, "7": <hex>}
//	      kernelCmdline: {require: [...], forbid: [...]}
//	    gcp: {projects: [my-project], zones: [us-central1-a], maxInstanceAge: 1h}
//	    aws: {accounts: ["123456789012"], regions: [us-east-1], requireLiveCheck: false}
//	    azure: {subscriptions: [<subscription id>]}
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
// gcp.zones, aws.accounts, aws.regions and azure.subscriptions must list
// what is allowed or set their explicit any (anyEKTrust, any, anyProject,
// anyZone, anyAccount, anyRegion, anySubscription), which the server logs at start; a policy with an empty one
// does not load, and Evaluate refuses on one too (a Policy built in code).
//
// docs/policy.md is the reference for operators: every field, its default
// and what empty means, with examples a test loads.
package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
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
	// SecureBootCAs are CAs counted beside Microsoft's own when a node's
	// move to the 2023 Secure Boot CAs is judged (cacheck.go): one a
	// release does not carry yet, or a lab's key standing in for one.
	SecureBootCAs []SecureBootCA `yaml:"secureBootCAs"`
}

// SecureBootCA is one of trust.secureBootCAs.
type SecureBootCA struct {
	// Name names it in messages; required.
	Name string `yaml:"name"`
	// Variable is where it is enrolled: db or KEK.
	Variable string `yaml:"variable"`
	// Year is the generation it counts as: 2011 or 2023.
	Year int `yaml:"year"`
	// SHA256 is its certificate's fingerprint (hex, of the DER).
	SHA256 string `yaml:"sha256"`
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
	// Azure requirements, for Azure Trusted Launch vTPM evidence.
	Azure AzurePolicy `yaml:"azure"`
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
	// Audit puts every boot rule of the pool in audit mode (AuditRules):
	// a machine they would refuse is admitted, and its binding, an Event
	// and a metric say which rule and why. Logged at start.
	Audit bool `yaml:"audit"`
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
	// MaxLiveEnrolments caps the unexpired enrolments (records, each with
	// its own bootstrap token) one enrolled machine may hold for its node
	// name; enrolling again past it is refused EnrolmentCapReached. 0:
	// the server's default (4: the enrolment and three more). A pool
	// whose machines reboot several times while provisioning (each boot
	// enrols again) raises it; at most MaxLiveEnrolmentsCap.
	MaxLiveEnrolments int `yaml:"maxLiveEnrolments"`
}

// MaxLiveEnrolmentsCap bounds Serve.MaxLiveEnrolments.
const MaxLiveEnrolmentsCap = 64

// PublicTier reports whether the public tier is served.
func (s Serve) PublicTier() bool { return s.Public == nil || *s.Public }

// AttestedTier reports whether config tokens are accepted.
func (s Serve) AttestedTier() bool { return s.Attested == nil || *s.Attested }

// Warnings lists what a valid policy allows that a real deployment should
// not: pools open to any cloud project or account, pools that serve
// secrets without credentials, allow-lists opened with their any. The
// server logs each at start.
func (p *Policy) Warnings() []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(p.Pools)) {
		pp := p.Pools[name]
		lists := pp.AllowLists()
		// The world-wide ones first.
		for _, wide := range []bool{true, false} {
			for _, l := range lists {
				if l.Wide == wide && l.Any && pp.takesList(l) {
					out = append(out, fmt.Sprintf("pool %q: %s", name, l.Open))
				}
			}
		}
		if pp.Audit {
			out = append(out, fmt.Sprintf("pool %q: audit: true: its boot rules admit what they would refuse (and report it)", name))
		} else if len(pp.TPM.Audit) > 0 && pp.takes(attest.KindTPM) {
			out = append(out, fmt.Sprintf("pool %q: tpm.audit: %s admit what they would refuse (and report it)", name, strings.Join(pp.TPM.Audit, ", ")))
		}
		for _, r := range pp.TPM.ReferenceSets {
			if r.NotAfter == nil && pp.takes(attest.KindTPM) {
				out = append(out, fmt.Sprintf("pool %q: tpm.referenceSets %s has no notAfter: it is accepted until removed", name, r.Name))
			}
		}
	}
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

// Load reads and checks a policy file. Relative paths in it are resolved
// against the file's directory.
func Load(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	return ParseFile(b, path)
}

// ParseFile is Parse of b, the bytes read from the file at path: its
// relative paths resolved against path's directory, and errors naming it.
// A caller that hashed b applies exactly what it hashed.
func ParseFile(b []byte, path string) (*Policy, error) {
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
	// One policy, one document: a second one after `---` would be read by
	// nothing while looking like part of what is in force.
	var more yaml.Node
	switch err := dec.Decode(&more); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, fmt.Errorf("decode: after the policy: %w", err)
	default:
		return nil, fmt.Errorf("decode: the file holds more than one YAML document (line %d); a policy is one document", more.Line)
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	if err := p.normalize(); err != nil {
		return nil, err
	}
	return &p, nil
}
