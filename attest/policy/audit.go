package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nodeproof/nodeproof/attest"
	"github.com/nodeproof/nodeproof/attest/uefivar/microsoft"
)

// The boot rules a pool may audit (tpm.audit; Pool.Audit audits them
// all): a refusal of an audited rule admits the machine and is reported
// (Audit) instead. What makes the machine the machine — the evidence kind,
// the EK's trust, the PCR bank, an event log for the rules to read — is
// never audited.
const (
	RuleSecureBoot       = "requireSecureBoot"
	RuleDeniedDigests    = "deniedDigests"
	RuleDeniedSigners    = "deniedSigners"
	RuleBootComponents   = "bootComponents" // every stage; or one: bootComponents.shim, .bootloader, .kernel
	RuleMinimumSBAT      = "minimumSBAT"
	RuleMachineOwnerKeys = "machineOwnerKeys"
	RuleMinimumDBX       = "minimumDBX"
	RulePCRs             = "pcrs"
	RuleKernelCmdline    = "kernelCmdline"
	RuleGrub             = "grub" // both; or one: grub.files, grub.commands
	RuleGrubFiles        = RuleGrub + ".files"
	RuleGrubCommands     = RuleGrub + ".commands"
	RuleMinimumKernel    = "minimumKernel"
	RuleMicrosoftCA2023  = "microsoftCA2023"
	RuleUKI              = "uki"
)

// AuditRules lists every name tpm.audit takes.
var AuditRules = []string{RuleSecureBoot, RuleDeniedDigests, RuleDeniedSigners, RuleBootComponents,
	RuleBootComponents + ".shim", RuleBootComponents + ".bootloader", RuleBootComponents + ".kernel",
	RuleMinimumSBAT, RuleMachineOwnerKeys, RuleMinimumDBX, RulePCRs, RuleKernelCmdline,
	RuleGrub, RuleGrubFiles, RuleGrubCommands, RuleMinimumKernel, RuleMicrosoftCA2023, RuleUKI}

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
	// Refusals, with Options.Explain, are every boot rule that refused
	// (Decide then returns the first's refusal too).
	Refusals []Audit
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
	// Explain judges every boot rule, none stopping at its refusal, and
	// refuses with all their refusals: the Decision's Refusals, the
	// error's reason the first one's, its message every one
	// (`policy check --event-log`). Rules in audit mode still admit and
	// report (Audits).
	Explain bool
}

// evaluation is one Decide: its clock, which rules audit, and what they
// reported; with explain, every rule goes on past its refusal, which is
// recorded (refusals) unless the rule audits.
type evaluation struct {
	now      time.Time
	cas      microsoft.Set // the Secure Boot CAs (Policy.SecureBootCAs)
	all      bool
	rules    []string
	audits   []Audit
	explain  bool
	refusals []Audit
}

// audited reports whether the evaluation goes on past rule's refusal:
// the rule audits, or the evaluation explains.
func (e *evaluation) audited(rule string) bool { return e.explain || e.audits_(rule) }

// audits_ reports whether rule audits: the pool audits all, the pool
// lists it, or (for a stage of bootComponents, a part of grub) the pool
// lists its parent.
func (e *evaluation) audits_(rule string) bool {
	if e.all || slices.Contains(e.rules, rule) {
		return true
	}
	parent, _, ok := strings.Cut(rule, ".")
	return ok && slices.Contains(e.rules, parent)
}

// rule passes err through, unless rule audits (it is reported and the
// evaluation goes on) or the evaluation explains (it is recorded and the
// evaluation goes on).
func (e *evaluation) rule(rule string, err error) error {
	if err == nil || !e.audited(rule) {
		return err
	}
	a := auditOf(rule, err)
	list := &e.refusals
	if e.audits_(rule) {
		list = &e.audits
	}
	if !slices.Contains(*list, a) {
		*list = append(*list, a)
	}
	return nil
}

// audit records err, rule's refusal, as an audit whatever the pool
// audits (a rule not yet in force: tpm.microsoftCA2023.from).
func (e *evaluation) audit(rule string, err error) {
	if a := auditOf(rule, err); !slices.Contains(e.audits, a) {
		e.audits = append(e.audits, a)
	}
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
