package tpm

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"strings"

	"github.com/google/go-eventlog/extract"
	"github.com/google/go-eventlog/register"
	"github.com/google/go-eventlog/tcg"

	"github.com/nodeproof/nodeproof/attest"
)

// MaxEventLogSize bounds the event log a node may send. Real logs are tens
// of kilobytes; the largest shipped with go-eventlog is 60 KiB.
const MaxEventLogSize = 1 << 20

// lastSRTMPCR is the last PCR a firmware (static root of trust) event log
// describes: 0-7 firmware, 8-15 boot loader and OS, 16 debug. PCRs 17-22
// belong to a dynamic root of trust with its own log, 23 to applications.
const lastSRTMPCR = 16

// replayLog parses a TCG PC Client event log and replays it against the
// quoted PCR values of one bank, returning only the events that replayed.
// Checks:
//   - the log parses (crypto-agile or SHA-1 format) and is within
//     MaxEventLogSize;
//   - for every quoted PCR 0-16 that has events, extending the events' digests
//     of this bank from the PCR's initial value (locality-aware for PCR 0)
//     gives exactly the quoted value. A PCR with no events in the log is
//     not established by the log, so nothing is read from it.
//
// The common case takes fastReplay; go-eventlog decides everything else.
//
// An empty log replays nothing: the boot state then knows nothing, and a
// policy that asks for any boot field refuses it.
func replayLog(raw []byte, bank crypto.Hash, quoted map[int][]byte) ([]tcg.Event, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if len(raw) > MaxEventLogSize {
		return nil, attest.Deny(attest.ReasonEventLogInvalid, "event log of %d bytes exceeds %d", len(raw), MaxEventLogSize)
	}
	if events, ok := fastReplay(raw, bank, quoted); ok {
		return events, nil
	}
	el, err := tcg.ParseEventLog(raw, tcg.ParseOpts{AllowPadding: true})
	if err != nil {
		return nil, attest.Deny(attest.ReasonEventLogInvalid, "event log does not parse: %v", err)
	}
	mrs := make([]register.MR, 0, len(quoted))
	for _, i := range sortedIndexes(quoted) {
		if i > lastSRTMPCR {
			continue
		}
		mrs = append(mrs, register.PCR{Index: i, Digest: quoted[i], DigestAlg: bank})
	}
	events, err := el.Verify(mrs)
	if err != nil {
		return nil, attest.Deny(attest.ReasonEventLogReplay, "event log does not replay to the quoted PCRs: %v", err)
	}
	return events, nil
}

// bootState extracts what replayed events establish about the boot. Events
// whose meaning depends on their data (UEFI variables, GRUB commands) are
// used only when their data hashes to their replayed digest; any other
// event data is untrusted and ignored. Extraction:
//   - PCR 7 EV_EFI_VARIABLE_DRIVER_CONFIG: SecureBoot (enabled iff its data
//     is the single byte 1), and the digests of PK, KEK, db and dbx; dbx's
//     hash entries are counted and listed.
//   - PCR 4 EV_EFI_BOOT_SERVICES_APPLICATION: the image digests, in order
//     (shim, bootloader, kernel).
//   - PCRs 8/9 GRUB EV_IPL events: the kernel command line, through
//     go-eventlog's GRUB extractor (which checks each command's digest).
func bootState(events []tcg.Event, bank crypto.Hash) (attest.BootState, error) {
	var bs attest.BootState
	bs.LogEvents = len(events)
	var replayed [lastSRTMPCR + 1]bool
	grubEvents := make([]tcg.Event, 0, len(events))
	grubUsable := true
	for _, e := range events {
		if e.Index >= 0 && e.Index <= lastSRTMPCR {
			replayed[e.Index] = true
		}
		switch {
		case e.Index == 7 && e.Type == tcg.EFIVariableDriverConfig:
			if err := readVariable(&bs, e, bank); err != nil {
				return bs, err
			}
		case e.Index == 4 && e.Type == tcg.EFIBootServicesApplication:
			bs.BootApplications = append(bs.BootApplications, hex.EncodeToString(e.Digest))
		case e.Index == 8 || e.Index == 9:
			// go-eventlog's GRUB extractor reads only EV_IPL and
			// EV_EVENT_TAG; other types there mean another loader.
			if e.Type != tcg.Ipl && e.Type != tcg.EventTag {
				grubUsable = false
			}
			grubEvents = append(grubEvents, e)
		}
	}
	for i, ok := range replayed {
		if ok {
			bs.ReplayedPCRs = append(bs.ReplayedPCRs, i)
		}
	}
	for i, d := range bs.BootApplications {
		switch i {
		case 0:
			bs.Shim = d
		case 1:
			bs.Bootloader = d
		case 2:
			bs.Kernel = d
		}
	}
	if grubUsable && len(grubEvents) > 0 {
		if grub, err := extract.GrubStateFromTPMLog(bank, grubEvents); err == nil {
			if k, err := extract.LinuxKernelStateFromGRUB(grub); err == nil && k.GetCommandLine() != "" {
				bs.KernelCmdlineKnown = true
				bs.KernelCmdline = strings.TrimRight(k.GetCommandLine(), "\x00")
			}
		}
	}
	return bs, nil
}

// readVariable records one measured UEFI variable.
func readVariable(bs *attest.BootState, e tcg.Event, bank crypto.Hash) error {
	if !dataMatchesDigest(e.Data, e.Digest, bank) {
		return attest.Deny(attest.ReasonEventLogInvalid, "PCR 7 variable event's data does not match its digest")
	}
	v, err := parseUEFIVariable(e.Data)
	if err != nil {
		return attest.Deny(attest.ReasonEventLogInvalid, "PCR 7 variable event: %v", err)
	}
	sum := sha256.Sum256(v.data)
	digest := hex.EncodeToString(sum[:])
	switch {
	case v.is("SecureBoot"):
		bs.SecureBootKnown = true
		bs.SecureBoot = len(v.data) == 1 && v.data[0] == 1
	case v.is("PK"):
		bs.PK = digest
	case v.is("KEK"):
		bs.KEK = digest
	case v.is("db"):
		bs.DB = digest
	case v.is("dbx"):
		n, hashes, err := signatureLists(v.data)
		if err != nil {
			return attest.Deny(attest.ReasonEventLogInvalid, "dbx: %v", err)
		}
		bs.DBX, bs.DBXKnown, bs.DBXEntries, bs.DBXSHA256s = digest, true, n, hashes
	}
	return nil
}

// dataMatchesDigest reports whether data hashes to digest in bank's hash.
func dataMatchesDigest(data, digest []byte, bank crypto.Hash) bool {
	if bank == crypto.SHA256 {
		sum := sha256.Sum256(data)
		return bytes.Equal(sum[:], digest)
	}
	h := bank.New()
	h.Write(data)
	return bytes.Equal(h.Sum(nil), digest)
}

func sortedIndexes(m map[int][]byte) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	return keys
}
