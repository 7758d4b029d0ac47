// Package firmwaretestdata holds real TCG event logs from real machines and
// the outcome nodeproof expects for each (expected/<name>.json), for tests
// to walk. README.md says where each log came from.
package firmwaretestdata

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

//go:embed logs/*.bin logs/*.json expected/*.json
var files embed.FS

// Expected is the outcome expected for one log.
type Expected struct {
	// Parses says whether the log parses as a TCG PC Client log.
	Parses bool `json:"parses"`
	// ReplayPCRs are the PCRs whose SHA-256 events replay when the log's own
	// digests are extended from a fresh TPM (PCR 0-16). Empty when the log
	// has no SHA-256 digests.
	ReplayPCRs []int `json:"replayPCRs"`
	// SHA256 says whether the log carries SHA-256 digests (crypto-agile).
	SHA256 bool `json:"sha256"`
	// SecureBoot is "on", "off" or "unknown" (no SecureBoot variable
	// measured).
	SecureBoot string `json:"secureBoot"`
	// DBXEntries counts dbx entries; -1 when dbx was not measured.
	DBXEntries int `json:"dbxEntries"`
	// BootApplications are the boot chain's EFI application digests
	// (SHA-256): PCR 2's after its separator (a TDX log's shim), then
	// PCR 4's.
	BootApplications []string `json:"bootApplications"`
	// KernelCmdline is the GRUB-measured command line, "" when none.
	KernelCmdline string `json:"kernelCmdline"`
	// SwTPMReplay says whether extending the log into a TPM at locality 0
	// reproduces every PCR it measures (false for logs that need locality 3
	// startup or DRTM PCRs).
	SwTPMReplay bool `json:"swtpmReplay"`
	// PCRs, for a log made here by a live boot (internal/liveboot), are
	// the SHA-256 PCR values the booted kernel showed
	// (/sys/class/tpm/tpm0/pcr-sha256/N), hex by index, for each PCR in
	// ReplayPCRs: the log extended into a fresh TPM must give them.
	PCRs map[string]string `json:"pcrs,omitempty"`
	// Authorities are the Secure Boot authorities measured into PCR 7
	// (EV_EFI_VARIABLE_AUTHORITY), each once, in the log's order, for a
	// log whose SHA-256 events replay; README.md says how they were read.
	Authorities []Authority `json:"authorities,omitempty"`
	// Signers are, for each of BootApplications, the SHA-256 of the
	// authority that verified it ("" when none did: Secure Boot off).
	Signers []string `json:"signers,omitempty"`
	// SbatLevel is the text of the SbatLevel the shim measured into
	// PCR 7, "" when it measured none.
	SbatLevel string `json:"sbatLevel,omitempty"`
	// MokList, MokListX and MokListTrusted are the hex SHA-256 digests
	// of the shim's PCR 14 measurements of those variables ("" when
	// none).
	MokList        string `json:"mokList,omitempty"`
	MokListX       string `json:"mokListX,omitempty"`
	MokListTrusted string `json:"mokListTrusted,omitempty"`
	// UKISections are, for a log of a unified kernel image's boot, the
	// sections systemd-stub measured into PCR 11, in order: each name and
	// the SHA-256 of its content. Empty: PCR 11 does not establish a UKI.
	UKISections []UKISection `json:"ukiSections,omitempty"`
	// Note says anything special about the log.
	Note string `json:"note,omitempty"`
}

// UKISection is one section of a UKI as PCR 11 shows it.
type UKISection struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// Authority is one Secure Boot authority of a log: who measured it
// ("firmware" before the first boot application, "shim" after), the
// signature database it names ("db", "MokListRT", "Shim"), and its
// certificate's SHA-256 (of the DER) and subject.
type Authority struct {
	By       string `json:"by"`
	Variable string `json:"variable"`
	SHA256   string `json:"sha256"`
	Subject  string `json:"subject"`
}

// Log is one real event log and its expected outcome.
type Log struct {
	Name     string
	Raw      []byte
	Expected Expected
}

// Logs returns every log with its expected outcome, sorted by name.
func Logs() ([]Log, error) {
	names, err := fs.Glob(files, "logs/*.bin")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]Log, 0, len(names))
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "logs/"), ".bin")
		raw, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		l := Log{Name: name, Raw: raw}
		exp, err := files.ReadFile("expected/" + name + ".json")
		if err != nil {
			return nil, fmt.Errorf("log %s has no expected outcome: %w", name, err)
		}
		if err := json.Unmarshal(exp, &l.Expected); err != nil {
			return nil, fmt.Errorf("expected/%s.json: %w", name, err)
		}
		out = append(out, l)
	}
	return out, nil
}

// MustLog returns the named log's bytes or panics: for tests and benches
// that name a log they know is there.
func MustLog(name string) []byte {
	b, err := files.ReadFile("logs/" + name + ".bin")
	if err != nil {
		panic(err)
	}
	return b
}

// WindowsGCPShieldedVM is a real attestation from a Windows Shielded VM on
// GCP (go-attestation's testdata): an AK, a quote, PCRs and the event log.
func WindowsGCPShieldedVM() []byte {
	b, err := files.ReadFile("logs/windows_gcp_shielded_vm.json")
	if err != nil {
		panic(err)
	}
	return b
}
