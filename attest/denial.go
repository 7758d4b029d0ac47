package attest

import (
	"errors"
	"fmt"
	"strings"
)

// Denial is the one typed refusal. Wrap it with %w; read it back with
// ReasonOf. Detail is for humans and must never carry a secret.
type Denial struct {
	Reason Reason
	Detail string
	// Setting names what an operator changes to allow what was refused,
	// when it is a setting: a policy field ("pools.worker.serve.nodeNames")
	// or a server flag ("--aws-max-document-age"). Empty when no setting
	// should (a forged quote, a replayed session). Detail names it too.
	Setting string
}

func (d *Denial) Error() string {
	if d.Detail == "" {
		return string(d.Reason)
	}
	return string(d.Reason) + ": " + d.Detail
}

// Deny returns a *Denial with a formatted detail.
func Deny(r Reason, format string, args ...any) error {
	return &Denial{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// DenySetting is Deny for a refusal an operator can lift with a setting:
// the Denial's Setting, which the detail names (appended in parentheses
// unless the message already does).
func DenySetting(r Reason, setting, format string, args ...any) error {
	detail := fmt.Sprintf(format, args...)
	if !strings.Contains(detail, setting) {
		detail += " (" + setting + ")"
	}
	return &Denial{Reason: r, Detail: detail, Setting: setting}
}

// SettingOf returns the Setting of the first Denial in err's chain.
func SettingOf(err error) string {
	var d *Denial
	if errors.As(err, &d) {
		return d.Setting
	}
	return ""
}

// ReasonOf returns the reason of the first Denial in err's chain.
func ReasonOf(err error) (Reason, bool) {
	var d *Denial
	if errors.As(err, &d) {
		return d.Reason, true
	}
	return "", false
}

// Identified is a refusal of evidence whose identity was proven before
// the refusal: the evidence's content (a boot state) was refused, not its
// authenticity. A re-attestation records it as the identity's failure;
// anything else treats it as the Denial it wraps.
type Identified struct {
	// Identity is the proven identity (Claims.Identity's form).
	Identity string
	// Err wraps the *Denial.
	Err error
}

func (e *Identified) Error() string { return e.Err.Error() }

func (e *Identified) Unwrap() error { return e.Err }
