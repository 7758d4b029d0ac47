package policy

import "github.com/nodeproof/nodeproof/attest"

// A cloud vTPM's evidence (gce-vtpm, aws-nitrotpm, azure-vtpm) names a
// cloud instance and proves its boot: the pool judges the instance by its
// cloud's block (kinds.go: gcp.projects and zones; aws.accounts, regions
// and requireLiveCheck; azure.subscriptions) and the boot with the TPM rules from the event log on
// (tpm.requireSecureBoot, bootComponents, minimumDBX, pcrs, kernelCmdline,
// deniedDigests, deniedSigners). tpm.ekTrust does not apply: the cloud vouches for the
// AK, not an EK chain the pool picks.

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
// block judges it (evaluateGCP without the first-boot window,
// which needs the instance's creation time the AK certificate does not
// carry: the quote's nonce proves freshness; evaluateAWS; evaluateAzure), then the PCR
// bank (the row's: SHA1BankNotAllowed for another, naming tpm.allowSHA1
// when SHA-1 would do) and the boot (evaluateBoot). Claims without the
// instance or the TPM facts are MalformedEvidence.
func evaluateVTPM(r *kindRow, at string, pp *Pool, c *attest.Claims, e *evaluation, _ Options) error {
	if c.TPM == nil || c.Instance == nil || c.Instance.Cloud != r.cloud.cloud {
		return attest.Deny(attest.ReasonMalformed, "%s claims without the instance or the TPM facts", c.Kind)
	}
	if err := r.cloud.evaluate(at+r.cloud.block+".", pp, c.Instance, c.VerifiedAt, false); err != nil {
		return err
	}
	in := at + "tpm."
	want := r.bank
	if c.TPM.PCRBank != want && !(want == "sha256" && c.TPM.PCRBank == "sha1" && pp.TPM.AllowSHA1) {
		return attest.DenySetting(attest.ReasonPolicySHA1, in+"allowSHA1", "%s evidence must quote the %s bank, not %s (%sallowSHA1 allows SHA-1 where the bank is sha256)", c.Kind, want, c.TPM.PCRBank, in)
	}
	return evaluateBoot(in, &pp.TPM, c.TPM, e)
}

// ekTrustField is the EK trust list's field: the one TPM list a cloud
// vTPM's pool does not need.
const ekTrustField = "tpm.ekTrust"
