package policy

import "github.com/nodeproof/nodeproof/attest"

// A cloud vTPM's evidence (gce-vtpm, aws-nitrotpm) names a cloud instance
// and proves its boot: the pool judges the instance with the lists of its
// cloud's identity kind (gcp.projects and zones; aws.accounts, regions and
// requireLiveCheck) and the boot with the TPM rules from the event log on
// (tpm.requireSecureBoot, bootComponents, minimumDBX, pcrs, kernelCmdline,
// deniedDigests). tpm.ekTrust does not apply: the cloud vouches for the
// AK, not an EK chain the pool picks.

// cloudOf is the identity kind whose lists judge vTPM kind k's instance;
// "" when k is no cloud vTPM.
func cloudOf(k attest.Kind) attest.Kind {
	switch k {
	case attest.KindGCEVTPM:
		return attest.KindGCP
	case attest.KindNitroTPM:
		return attest.KindAWS
	}
	return ""
}

// vtpmBank is the PCR bank kind k's quote must be of: the SHA-384 bank a
// Nitro document signs; SHA-256 for a GCE vTPM (SHA-1 only with
// tpm.allowSHA1, as on bare metal).
func vtpmBank(k attest.Kind) string {
	if k == attest.KindNitroTPM {
		return "sha384"
	}
	return "sha256"
}

// judges reports whether l is checked in a pool that takes kind k: its own
// kind's, and for a cloud vTPM also its cloud's lists and the TPM's boot
// lists (not tpm.ekTrust).
func (l AllowList) judges(k attest.Kind) bool {
	switch {
	case l.Kind == k:
		return true
	case cloudOf(k) == "":
		return false
	case l.Kind == cloudOf(k):
		return true
	}
	return l.Kind == attest.KindTPM && l.Field != ekTrustField
}

// takesList reports whether the pool takes a kind l judges.
func (pp Pool) takesList(l AllowList) bool {
	for _, k := range pp.Evidence {
		if l.judges(k) {
			return true
		}
	}
	return false
}

// evaluateVTPM checks a cloud vTPM's claims: the instance as its cloud's
// identity kind is checked (evaluateGCP without the first-boot window,
// which needs the instance's creation time the AK certificate does not
// carry: the quote's nonce proves freshness; evaluateAWS), then the PCR
// bank (vtpmBank: SHA1BankNotAllowed for another, naming tpm.allowSHA1
// when SHA-1 would do) and the boot (evaluateBoot). Claims without the
// instance or the TPM facts are MalformedEvidence.
func evaluateVTPM(at string, pp *Pool, c *attest.Claims, e *evaluation) error {
	if c.TPM == nil || (c.Kind == attest.KindGCEVTPM && c.GCP == nil) || (c.Kind == attest.KindNitroTPM && c.AWS == nil) {
		return attest.Deny(attest.ReasonMalformed, "%s claims without the instance or the TPM facts", c.Kind)
	}
	var err error
	if c.Kind == attest.KindGCEVTPM {
		err = evaluateGCP(at+"gcp.", &pp.GCP, c.GCP, c.VerifiedAt, false)
	} else {
		err = evaluateAWS(at+"aws.", &pp.AWS, c.AWS)
	}
	if err != nil {
		return err
	}
	in := at + "tpm."
	want := vtpmBank(c.Kind)
	if c.TPM.PCRBank != want && !(want == "sha256" && c.TPM.PCRBank == "sha1" && pp.TPM.AllowSHA1) {
		return attest.DenySetting(attest.ReasonPolicySHA1, in+"allowSHA1", "%s evidence must quote the %s bank, not %s (%sallowSHA1 allows SHA-1 for a GCE vTPM)", c.Kind, want, c.TPM.PCRBank, in)
	}
	return evaluateBoot(in, &pp.TPM, c.TPM, e)
}

// ekTrustField is the EK trust list's field: the one TPM list a cloud
// vTPM's pool does not need.
const ekTrustField = "tpm.ekTrust"
