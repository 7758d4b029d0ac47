package policy

import (
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// kindRow is one kind of evidence as a pool judges it: the instance block
// that judges the cloud instance it names, whether the TPM's rules judge
// its quote and boot, the PCR bank its quote must be of, and its
// evaluation. A new kind is a row of kinds; a new cloud also a row of
// clouds and its block in Pool.
type kindRow struct {
	kind attest.Kind
	// cloud is the pool's block that judges the instance the evidence
	// names (gcp, aws, azure); nil for evidence that names none (a bare-metal
	// TPM).
	cloud *cloudBlock
	// ekTrust: tpm.ekTrust judges the TPM's EK (bare metal: the pool
	// picks what vouches for it; a cloud vouches for a vTPM's AK).
	ekTrust bool
	// boot: the TPM rules judge the quote's boot, from the event log on
	// (tpm.requireSecureBoot, bootComponents, minimumDBX, pcrs,
	// kernelCmdline, grub, deniedDigests).
	boot bool
	// bank is the PCR bank the quote must be of ("" for evidence without
	// a quote); "sha256" also takes SHA-1 with tpm.allowSHA1.
	bank string
	// evaluate judges claims of the kind by pool pp (at: where the pool's
	// settings are, "pools.worker.").
	evaluate func(r *kindRow, at string, pp *Pool, c *attest.Claims, e *evaluation, o Options) error
}

// cloudBlock is a pool's block of rules for one cloud's instances
// (GCPPolicy, AWSPolicy, AzurePolicy).
type cloudBlock struct {
	// cloud is the instances' attest.InstanceClaims.Cloud; block the
	// block's name in a pool ("gcp"), and the prefix of its allow-lists'
	// fields; name the cloud for messages ("GCP").
	cloud, block, name string
	// lists are the block's allow-lists, in the order they are checked.
	lists func(pp *Pool) []AllowList
	// evaluate judges an instance by the block (in: where it is,
	// "pools.worker.gcp."; now: the verification time; firstBoot: an
	// enrolment, not a re-attestation, from evidence that carries the
	// instance's creation time).
	evaluate func(in string, pp *Pool, inst *attest.InstanceClaims, now time.Time, firstBoot bool) error
	// nodeName is the node name the block gives the instance in place of
	// the evidence's ("" keeps the evidence's).
	nodeName func(pp *Pool, inst *attest.InstanceClaims) string
}

// The clouds whose instances a pool judges, each with its block.
var (
	gcpBlock = &cloudBlock{cloud: attest.CloudGCP, block: "gcp", name: "GCP",
		lists: func(pp *Pool) []AllowList { return []AllowList{pp.GCP.ProjectList(), pp.GCP.ZoneList()} },
		evaluate: func(in string, pp *Pool, inst *attest.InstanceClaims, now time.Time, firstBoot bool) error {
			return evaluateGCP(in, &pp.GCP, inst, now, firstBoot)
		},
		nodeName: func(*Pool, *attest.InstanceClaims) string { return "" }}
	awsBlock = &cloudBlock{cloud: attest.CloudAWS, block: "aws", name: "AWS",
		lists: func(pp *Pool) []AllowList { return []AllowList{pp.AWS.AccountList(), pp.AWS.RegionList()} },
		evaluate: func(in string, pp *Pool, inst *attest.InstanceClaims, _ time.Time, _ bool) error {
			return evaluateAWS(in, &pp.AWS, inst)
		},
		nodeName: func(pp *Pool, inst *attest.InstanceClaims) string {
			if pp.AWS.NodeName == AWSNodeNameInstanceID {
				return inst.ID
			}
			return ""
		}}
	azureBlock = &cloudBlock{cloud: attest.CloudAzure, block: "azure", name: "Azure",
		lists: func(pp *Pool) []AllowList { return []AllowList{pp.Azure.SubscriptionList()} },
		evaluate: func(in string, pp *Pool, inst *attest.InstanceClaims, _ time.Time, _ bool) error {
			return evaluateAzure(in, &pp.Azure, inst)
		},
		nodeName: func(*Pool, *attest.InstanceClaims) string { return "" }}
)

// clouds are the cloud blocks, in the order their lists are checked.
var clouds = []*cloudBlock{gcpBlock, awsBlock, azureBlock}

// kinds is every kind of evidence a pool may take (pools.*.evidence), in
// the order messages list them.
var kinds = []kindRow{
	{kind: attest.KindTPM, ekTrust: true, boot: true, bank: "sha256", evaluate: evaluateBareMetal},
	{kind: attest.KindGCP, cloud: gcpBlock, evaluate: evaluateInstance},
	{kind: attest.KindAWS, cloud: awsBlock, evaluate: evaluateInstance},
	{kind: attest.KindGCEVTPM, cloud: gcpBlock, boot: true, bank: "sha256", evaluate: evaluateVTPM},
	{kind: attest.KindNitroTPM, cloud: awsBlock, boot: true, bank: "sha384", evaluate: evaluateVTPM},
	{kind: attest.KindAzureVTPM, cloud: azureBlock, boot: true, bank: "sha256", evaluate: evaluateVTPM},
}

// kindOf is kind k's row; nil for a kind the policy does not know.
func kindOf(k attest.Kind) *kindRow {
	for i := range kinds {
		if kinds[i].kind == k {
			return &kinds[i]
		}
	}
	return nil
}

// evaluateBareMetal judges a bare-metal TPM's claims: evaluateTPM.
// Claims without the TPM facts are MalformedEvidence.
func evaluateBareMetal(_ *kindRow, at string, pp *Pool, c *attest.Claims, e *evaluation, _ Options) error {
	if c.TPM == nil {
		return attest.Deny(attest.ReasonMalformed, "TPM claims without TPM facts")
	}
	return evaluateTPM(at+"tpm.", &pp.TPM, c.TPM, e)
}

// evaluateInstance judges a cloud identity's claims by its cloud's block
// (evaluateGCP, with the first-boot window at an enrolment; evaluateAWS).
// Claims without an instance of the row's cloud are MalformedEvidence.
func evaluateInstance(r *kindRow, at string, pp *Pool, c *attest.Claims, _ *evaluation, o Options) error {
	if c.Instance == nil || c.Instance.Cloud != r.cloud.cloud {
		return attest.Deny(attest.ReasonMalformed, "%s claims without %s facts", r.cloud.name, r.cloud.name)
	}
	return r.cloud.evaluate(at+r.cloud.block+".", pp, c.Instance, c.VerifiedAt, !o.Reattestation)
}

// judges reports whether l is checked in a pool that takes kind k: the
// lists of k's cloud block, tpm.ekTrust when the pool picks k's EK trust,
// and the TPM's other lists when they judge k's boot.
func (l AllowList) judges(k attest.Kind) bool {
	r := kindOf(k)
	switch {
	case r == nil:
		return false
	case l.Field == ekTrustField:
		return r.ekTrust
	case strings.HasPrefix(l.Field, "tpm."):
		return r.boot
	}
	return r.cloud != nil && strings.HasPrefix(l.Field, r.cloud.block+".")
}

// bootKinds lists the kinds whose boot the TPM rules judge, for messages
// ("tpm, gce-vtpm, aws-nitrotpm, azure-vtpm").
func bootKinds() string {
	var out []string
	for _, r := range kinds {
		if r.boot {
			out = append(out, string(r.kind))
		}
	}
	return strings.Join(out, ", ")
}

// cloudOf is the cloud whose block judges the instance of a cloud vTPM
// kind k (evidence that names an instance and whose boot the TPM rules
// judge); "" for any other kind.
func cloudOf(k attest.Kind) string {
	if r := kindOf(k); r != nil && r.boot && r.cloud != nil {
		return r.cloud.cloud
	}
	return ""
}

// EvidenceNodeName is the node name claims establish in pool: the
// evidence's (Claims.NodeName), or the one the instance's cloud block
// chooses in its place (aws.nodeName: instanceID); "" when there is
// none.
func (p *Policy) EvidenceNodeName(pool string, c *attest.Claims) string {
	pp, ok := p.Pools[pool]
	if r := kindOf(c.Kind); ok && r != nil && r.cloud != nil && c.Instance != nil && c.Instance.Cloud == r.cloud.cloud {
		if n := r.cloud.nodeName(&pp, c.Instance); n != "" {
			return n
		}
	}
	return c.NodeName
}
