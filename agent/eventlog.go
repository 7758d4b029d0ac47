package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// MissingEventLog says on the console, before attesting, that the
// firmware's event log at path is missing and what that usually means, or
// returns "" when it is there (or cannot be looked at: the attestation
// then says what went wrong). Without a log the server cannot tell how
// the machine booted, and a pool that needs to know refuses it
// EventLogMissing: the operator should learn why from the console, not
// from a refusal alone.
func MissingEventLog(path string) string {
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	return fmt.Sprintf("the firmware's event log is missing (%s does not exist): the kernel got no measured-boot log from the firmware, "+
		"so the server cannot tell how this machine booted. Most likely the kernel was not started through its EFI stub: "+
		"with Secure Boot off, GRUB's `linux` command (what update-grub writes) loads the kernel itself; `linuxefi` keeps the log. "+
		"Otherwise the firmware measures nothing (no TPM enabled in the firmware, or no UEFI measured boot)", path)
}
