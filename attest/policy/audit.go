package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
)

// The boot rules a pool may audit (tpm.audit; Pool.Audit audits them
// all): a refusal of an audited rule admits the machine and is reported
// (Audit) instead. What makes the machine the machine — the evidence kind,
// the EK's trust, the PCR bank, an event log for the rules to read — is
// never audited.
const (
	RuleSecureBoot       = "requireSecureBoot"
	RuleDeniedDigests    = "deniedDigests"
	RuleBootComponents   = "bootComponents" // every stage; or one: bootComponents.shim, .bootloader, .kernel
	RuleMinimumSBAT      = "minimumSBAT"
	RuleMachineOwnerKeys = "machineOwnerKeys"
	RuleMinimumDBX       = "minimumDBX"
	RulePCRs             = "pcrs"
	RuleKernelCmdline    = "kernelCmdline"
)

// AuditRules lists every name tpm.audit takes.
var AuditRules = []string{RuleSecureBoot, RuleDeniedDigests, RuleBootComponents,
	RuleBootComponents + ".shim", RuleBootComponents + ".bootloader", RuleBootComponents + ".kernel",
	RuleMinimumSBAT, RuleMachineOwnerKeys, RuleMinimumDBX, RulePCRs, RuleKernelCmdline}

// Audit is a refusal an audited rule would have made of a machine the
// pool admitted.
type Audit struct {
	// Rule is the rule (AuditRules).
	Rule string `json:"rule"`
	// Reason is the refusal's reason; Setting the setting that lifts it.
	Reason  attest.Reason `json:"reason"`
	Setting string        `json:"setting,omitempty"`
	// Message says why, as the refusal would have.
	Message string `json:"message"`
}

// String is the audit in one line: "rule: Reason: message".
func (a Audit) String() string { return a.Rule + ": " + string(a.Reason) + ": " + a.Message }

// FormatAudits is audits in one line each, at most max bytes (cut on a
// line; the first alone cut where it must), for a binding's status and an
// Event.
func FormatAudits(audits []Audit, max int) string {
	var b strings.Builder
	for i, a := range audits {
		line := a.String()
		if i > 0 {
			line = "\n" + line
		}
		if b.Len()+len(line) > max {
			if i == 0 {
				b.WriteString(line[:max]) // the first, cut: never nothing
			}
			break
		}
		b.WriteString(line)
	}
	return b.String()
}

// Decision is what Decide decided of an admitted machine: the rules in
// audit mode that would have refused it.
type Decision struct {
	Audits []Audit
}

// Options say when and for what Decide decides.
type Options struct {
	// Now is the time reference sets' notAfter is compared to; zero: the
	// claims' VerifiedAt. (With neither, a set with a notAfter counts as
	// past it.)
	Now time.Time
	// Reattestation decides for a node attesting again after its
	// enrolment: every requirement but the first-boot window of cloud
	// evidence (GCP maxInstanceAge), which a running node is past by
	// design.
	Reattestation bool
}

// evaluation is one Decide: its clock, which rules audit, and what they
// reported.
type evaluation struct {
	now    time.Time
	all    bool
	rules  []string
	audits []Audit
}

// audited reports whether rule audits: the pool audits all, the pool
// lists it, or (for a stage of bootComponents) the pool lists
// bootComponents.
func (e *evaluation) audited(rule string) bool {
	if e.all || slices.Contains(e.rules, rule) {
		return true
	}
	parent, _, ok := strings.Cut(rule, ".")
	return ok && slices.Contains(e.rules, parent)
}

// rule passes err through, unless rule audits: then it is reported and
// the evaluation goes on.
func (e *evaluation) rule(rule string, err error) error {
	if err == nil || !e.audited(rule) {
		return err
	}
	a := auditOf(rule, err)
	if !slices.Contains(e.audits, a) {
		e.audits = append(e.audits, a)
	}
	return nil
}

func auditOf(rule string, err error) Audit {
	a := Audit{Rule: rule, Reason: attest.ReasonPolicyRefused, Message: err.Error()}
	var d *attest.Denial
	if errors.As(err, &d) {
		a.Reason, a.Setting, a.Message = d.Reason, d.Setting, d.Detail
	}
	return a
}

// checkAudit checks tpm.audit's names.
func checkAudit(rules []string) error {
	for _, r := range rules {
		if !slices.Contains(AuditRules, r) {
			return fmt.Errorf("tpm.audit: %q is not a rule that audits (%s)", r, strings.Join(AuditRules, ", "))
		}
	}
	return nil
}
