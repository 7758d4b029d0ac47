package mcs

import (
	"fmt"
	"strings"

	"github.com/nodeproof/nodeproof/attest"
)

// summarize describes claims in one line for records and logs (no
// secrets: claims hold none): the instance a cloud names, then the boot a
// TPM's quote and log tell (a cloud vTPM has both): for a unified kernel
// image its digest, and the boot phases systemd measured into PCR 11.
func summarize(c *attest.Claims) string {
	var parts []string
	switch i := c.Instance; {
	case i != nil:
		in := fmt.Sprintf("%s %s account=%s", c.Kind, i.Cloud, i.Account)
		if i.Location != "" {
			in += " location=" + i.Location
		}
		in += " instance=" + i.ID
		if i.Name != "" {
			in += " (" + i.Name + ")"
		}
		if i.LiveChecked {
			in += " live"
		}
		parts = append(parts, in)
	case c.TPM == nil:
		return string(c.Kind) + " " + c.Identity
	}
	if c.TPM != nil {
		b := c.TPM.Boot
		sb := "unknown"
		if b.SecureBootKnown {
			sb = map[bool]string{true: "on", false: "off"}[b.SecureBoot]
		}
		if c.Instance == nil {
			parts = append(parts, fmt.Sprintf("%s ek=%.16s… (%s)", c.Kind, c.TPM.EKSHA256, c.TPM.EKKind))
		}
		kernel := ""
		if k := b.Kernels(); len(k) > 0 {
			kernel = k[0]
		}
		parts = append(parts, fmt.Sprintf("trust=%s bank=%s secureBoot=%s kernel=%.16s pcr8=%.16s pcr9=%.16s", c.TPM.EKTrust, c.TPM.PCRBank, sb, kernel, c.TPM.PCRs[8], c.TPM.PCRs[9]))
		if n := len(b.BootApplications); b.UKISectionsKnown && n > 0 {
			parts = append(parts, fmt.Sprintf("uki=%.16s", b.BootApplications[n-1]))
		}
		if len(b.SystemdPhases) > 0 {
			parts = append(parts, "phases="+strings.Join(b.SystemdPhases, ","))
		}
	}
	return strings.Join(parts, " ")
}
