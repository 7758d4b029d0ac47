package attest

import (
	"strings"
	"time"
)

// Claims are the facts a verifier vouches for after every one of its checks
// passed. Policy decides what they may have; nothing here is a decision.
type Claims struct {
	Kind Kind `json:"kind"`
	// Identity is a stable, globally unique identifier of the machine for
	// this kind of evidence: "tpm-ek:<sha256 of EK PKIX DER>",
	// "gcp:<project number>/<zone>/<instance id>" or
	// "aws:<account>/<region>/<instance id>" or
	// "azure:<subscription id>/<vm id>". A node name is bound to the
	// first identity that enrolled with it (store.Binding).
	Identity string `json:"identity"`
	// NodeName is the node name the evidence itself establishes (TPM
	// inventory, cloud instance name); empty when the evidence names none.
	NodeName string `json:"nodeName,omitempty"`
	// Addresses the evidence attests for this node (DNS names and IPs).
	Addresses []string `json:"addresses,omitempty"`
	// KubeletKeySHA256 is the hash of the kubelet public key bound into the
	// evidence.
	KubeletKeySHA256 []byte `json:"kubeletKeySHA256"`
	// VerifiedAt is when the verifier finished its checks.
	VerifiedAt time.Time `json:"verifiedAt"`

	// TPM is what a TPM's quote and event log establish (tpm, and a
	// cloud vTPM's kinds).
	TPM *TPMClaims `json:"tpm,omitempty"`
	// Instance is the cloud instance the evidence names (the cloud
	// kinds); nil for a bare-metal TPM. Claims recorded by older versions
	// kept it as "gcp" or "aws": UnmarshalJSON reads those into it.
	Instance *InstanceClaims `json:"instance,omitempty"`

	// Ticket, when set, is what the verifier hands the node to bring to
	// its next attestation (ChallengeInput.Ticket), for the server to seal
	// (a TPM: "this AK is resident in the TPM of this EK", established by
	// the credential this attestation activated, so the next one can skip
	// the activation). It is a statement about the machine, not a claim
	// about its boot: never recorded, never judged.
	Ticket []byte `json:"-"`
}

// Clouds an instance can run in (InstanceClaims.Cloud).
const (
	CloudGCP   = "gcp"
	CloudAWS   = "aws"
	CloudAzure = "azure"
)

// InstanceClaims describe the cloud instance a verified cloud document
// names (a GCP identity token, an AWS identity document, a GCE vTPM's AK
// certificate): one description for every cloud, so that summaries, node
// names and the policy's instance rules read it without a case per cloud.
// A field a cloud does not have stays empty.
type InstanceClaims struct {
	// Cloud is the cloud that vouches for the instance: CloudGCP,
	// CloudAWS, CloudAzure.
	Cloud string `json:"cloud"`
	// Account is what owns the instance and what the policy's account
	// list allows: the GCP project ID, the AWS account ID, the Azure
	// subscription ID.
	Account string `json:"account"`
	// AccountNumber is the account's number where it has one beside its ID
	// (the GCP project number, which the machine's identity names).
	AccountNumber string `json:"accountNumber,omitempty"`
	// Location is where the instance runs, as the policy's location list
	// allows it: the GCP zone, the AWS region; empty for Azure, whose
	// attested document names no location.
	Location string `json:"location"`
	// AvailabilityZone is the zone within Location, where the cloud names
	// one apart (AWS); empty where Location is the zone (GCP).
	AvailabilityZone string `json:"availabilityZone,omitempty"`
	// ID is the instance's ID within its account and location (GCP's
	// numeric instance ID, AWS's i-…, Azure's VM ID).
	ID string `json:"id"`
	// Name is the instance's name, when the cloud gives it one (GCP).
	Name string `json:"name,omitempty"`
	// Created is when the instance was created (GCP) or last launched
	// (AWS's pendingTime); zero when the document does not say.
	Created time.Time `json:"created,omitzero"`
	// Type and Image are the instance's machine type and boot image (AWS's
	// instanceType and imageID), when the document names them.
	Type  string `json:"type,omitempty"`
	Image string `json:"image,omitempty"`
	// ServiceAccount is the identity the instance runs as (a GCP token's
	// email claim), when present.
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// PrivateIP is the instance's private address, when the document
	// names it (AWS).
	PrivateIP string `json:"privateIP,omitempty"`
	// PrivateDNSName is the instance's private DNS name (AWS): from the
	// optional live EC2 check, else derived from PrivateIP and the region
	// the way EC2 names instances (ip-a-b-c-d.<region>.compute.internal;
	// ec2.internal in us-east-1).
	PrivateDNSName string `json:"privateDNSName,omitempty"`
	// LiveChecked is set when the cloud's API confirmed the instance is
	// running (the EC2 live check: and in the expected VPC / with the
	// expected tags).
	LiveChecked bool `json:"liveChecked,omitempty"`
}

// Kinds of endorsement key, by algorithm and size, as TPM vendors
// certify them (TCG EK Credential Profile: an RSA 2048 EK's certificate
// at NV 0x01c00002, an ECC P-256 one at 0x01c0000a, P-384 at
// 0x01c00016).
const (
	EKKindRSA2048 = "rsa-2048"
	EKKindRSA3072 = "rsa-3072"
	EKKindRSA4096 = "rsa-4096"
	EKKindECCP256 = "ecc-p256"
	EKKindECCP384 = "ecc-p384"
	EKKindECCP521 = "ecc-p521"
)

// EKKinds lists every EK kind.
var EKKinds = []string{EKKindRSA2048, EKKindRSA3072, EKKindRSA4096, EKKindECCP256, EKKindECCP384, EKKindECCP521}

// TPMClaims are the facts a TPM attestation establishes.
type TPMClaims struct {
	// EKSHA256 is the hex SHA-256 of the EK public key (PKIX DER).
	EKSHA256 string `json:"ekSHA256"`
	// EKTrust names what vouched for the EK: "ca:<root set name>" or
	// "inventory".
	EKTrust string `json:"ekTrust"`
	// EKKind is the EK's algorithm and size (EKKindRSA2048, …): a TPM
	// holds one EK of each kind its vendor certified, and a pool accepts
	// one kind.
	EKKind string `json:"ekKind,omitempty"`
	// EKCertSubject, EKCertIssuer and EKCertSerial describe the EK
	// certificate when one was presented.
	EKCertSubject string `json:"ekCertSubject,omitempty"`
	EKCertIssuer  string `json:"ekCertIssuer,omitempty"`
	EKCertSerial  string `json:"ekCertSerial,omitempty"`
	// AKCertIssuer and AKCertSerial describe the AK certificate when a
	// cloud certified the AK (GCE vTPM; EKTrust "gce-ak-certificate").
	AKCertIssuer string `json:"akCertIssuer,omitempty"`
	AKCertSerial string `json:"akCertSerial,omitempty"`
	// AKName is the hex TPM name of the attestation key.
	AKName string `json:"akName"`
	// PCRBank is the hash bank the quote covered: "sha256" or "sha1".
	PCRBank string `json:"pcrBank"`
	// PCRs are the quoted PCR values, hex, by index.
	PCRs map[int]string `json:"pcrs"`
	// ResetCount, RestartCount and Clock are the quote's TPMS_CLOCK_INFO:
	// the TPM resets (boots) and restarts (resumes) it has seen, and its
	// clock in milliseconds. They tell a re-attestation's boot apart from
	// the last one's.
	ResetCount   uint32 `json:"resetCount"`
	RestartCount uint32 `json:"restartCount"`
	Clock        uint64 `json:"clock"`
	// Boot is what the replayed event log says about the boot.
	Boot BootState `json:"boot"`
}

// BootState is the boot as the event log tells it, after the log replayed
// against quoted PCRs. A field is only set when replayed events establish it;
// the *Known flags distinguish "absent from the log" from a zero value, so
// an empty or partial log can never satisfy a policy that asks for a field.
type BootState struct {
	// LogEvents is the number of events that replayed.
	LogEvents int `json:"logEvents"`
	// LogMissing is set when the evidence carried no event log at all
	// (not an empty one that replayed: none was sent).
	LogMissing bool `json:"logMissing,omitempty"`
	// ReplayedPCRs lists the PCRs whose events replayed to the quoted value.
	ReplayedPCRs []int `json:"replayedPCRs,omitempty"`

	SecureBootKnown bool `json:"secureBootKnown"`
	SecureBoot      bool `json:"secureBoot"`
	// PK, KEK, DB and DBX are hex SHA-256 digests of the UEFI variables'
	// data as measured into PCR 7; empty when not measured.
	PK  string `json:"pk,omitempty"`
	KEK string `json:"kek,omitempty"`
	DB  string `json:"db,omitempty"`
	DBX string `json:"dbx,omitempty"`
	// DBXKnown is set when the dbx variable was measured; DBXEntries counts
	// its entries (a larger dbx revokes more). DBXSHA256s concatenates its
	// SHA-256 hash entries, 32 bytes each (one slice, not one string per
	// hash: a current dbx has hundreds).
	// KEKCerts and DBCerts are the SHA-256 fingerprints (hex, of the
	// DER) of the certificates in KEK and db as measured into PCR 7, in
	// their order; the *Known flags are set when the variable was
	// measured and read as signature lists. They say which CAs a machine's
	// firmware trusts (the 2011 and 2023 Microsoft CAs:
	// attest/uefivar/microsoft).
	KEKCerts      []string `json:"kekCerts,omitempty"`
	KEKCertsKnown bool     `json:"kekCertsKnown,omitempty"`
	DBCerts       []string `json:"dbCerts,omitempty"`
	DBCertsKnown  bool     `json:"dbCertsKnown,omitempty"`
	DBXKnown      bool     `json:"dbxKnown"`
	DBXEntries    int      `json:"dbxEntries"`
	DBXSHA256s    []byte   `json:"dbxSHA256s,omitempty"`

	// BootApplications are the boot chain: the hex digests (in the PCR
	// bank's hash) of the images measured into PCR 4 after its separator
	// — every digest there that is not the hash of its own event data (an
	// EFI action, a GPT), whatever the event's type says — in PCR 4's own
	// order; preceded by those of PCR 2 after its separator, where a
	// confidential VM's firmware measures the first one. Its stages are
	// named by position (attest/policy): the first (the shim), the second
	// (the boot loader), every later one a kernel (GRUB has the shim verify
	// the kernel and then the firmware loads it: the same image twice).
	// Only each PCR's own sequence is proven by a quote, so nothing here
	// depends on how the log interleaves PCRs or labels events. (A partial
	// log without PCR 4's separator: every PCR 4 image.)
	BootApplications []string `json:"bootApplications,omitempty"`
	// OtherImages are the other image digests of PCRs 2 and 4: drivers,
	// option ROMs and firmware blobs, applications measured before the
	// separator. A denied digest refuses wherever it appears, here too.
	OtherImages []string `json:"otherImages,omitempty"`
	// ExitBootServices is set when PCR 5 holds the ExitBootServices
	// invocation (by its digest). It says nothing of other PCRs: the
	// quote does not prove how PCRs interleave.
	ExitBootServices bool `json:"exitBootServices"`
	// KernelCmdlineKnown is set when GRUB's measured commands (PCR 8)
	// establish the kernel command line: exactly one linux command
	// (`linux`, `linuxefi`, `linux16`), read by its measured text, never
	// by the event's label. KernelCmdline is the image path and the
	// arguments, as GRUB handed them to the kernel.
	KernelCmdlineKnown bool   `json:"kernelCmdlineKnown"`
	KernelCmdline      string `json:"kernelCmdline,omitempty"`
	// GrubCommands are the texts GRUB measured into PCR 8, in order (each
	// event's text whose hash is its digest, without GRUB's label; the
	// label is not measured); GrubCommandsKnown is set when PCR 8 replayed
	// and every event's text was found. The kernel command line is among
	// them.
	GrubCommandsKnown bool     `json:"grubCommandsKnown,omitempty"`
	GrubCommands      []string `json:"grubCommands,omitempty"`
	// GrubFiles are PCR 9's measurements, in order: the contents of every
	// file GRUB read (grub.cfg, the kernel, the initrd, modules) and what
	// the kernel's EFI stub measured there.
	GrubFiles []MeasuredFile `json:"grubFiles,omitempty"`

	// Authorities are the Secure Boot authorities the boot measured
	// into PCR 7 (EV_EFI_VARIABLE_AUTHORITY: the signature database entry
	// that verified an image), in PCR 7's order, each once.
	Authorities []SecureBootAuthority `json:"authorities,omitempty"`
	// AppVerifications say, for each of BootApplications (same order),
	// who verified it and with which of Authorities (attest/tpm's
	// bootState says how the log establishes it). Signer reads one.
	AppVerifications []AppVerification `json:"appVerifications,omitempty"`
	// ShimState is what the shim measured about itself (PCRs 7 and 14);
	// nil when the log shows no shim.
	ShimState *ShimState `json:"shimState,omitempty"`

	// UKISections are what systemd-stub measured into PCR 11 of the
	// unified kernel image (UKI) it ran: each section's name (measured:
	// the hash of the name with its NUL) and the digest of its content,
	// in PCR 11's own order. UKISectionsKnown is set when PCR 11 replayed
	// and every one of its events read as such a pair, the sections in
	// systemd's canonical order, each once, .linux among them
	// (attest/tpm's pcr11 lists the checks).
	UKISectionsKnown bool           `json:"ukiSectionsKnown,omitempty"`
	UKISections      []MeasuredFile `json:"ukiSections,omitempty"`
	// SystemdPhases are the boot phases systemd-pcrphase extended into
	// PCR 11 after systemd-stub's logged measurements (enter-initrd,
	// leave-initrd, sysinit, ready, shutdown, final: a run of them as
	// systemd makes them), read from the quoted value: no log the node
	// sends holds them (attest/tpm's pcr11Phases). Where the boot was, not
	// what it ran: no policy rule reads them.
	SystemdPhases []string `json:"systemdPhases,omitempty"`
}

// UKISection returns the digest of the UKI section name measured, if it
// was.
func (b *BootState) UKISection(name string) (string, bool) {
	for _, s := range b.UKISections {
		if s.Path == name {
			return s.Digest, true
		}
	}
	return "", false
}

// MeasuredFile is one file's measurement (PCR 9): the digest of its
// contents in the PCR bank's hash, and the path the log gives it — not
// measured, so only a name for messages and views.
type MeasuredFile struct {
	Path   string `json:"path,omitempty"`
	Digest string `json:"digest"`
}

// linuxCommands are GRUB's commands that load a Linux kernel.
var linuxCommands = []string{"linux ", "linuxefi ", "linux16 "}

// LinuxCommandArgs returns the arguments of a GRUB linux command's text
// (`linux`, `linuxefi`, `linux16`): the kernel's path and its command
// line.
func LinuxCommandArgs(text string) (string, bool) {
	for _, c := range linuxCommands {
		if args, ok := strings.CutPrefix(text, c); ok {
			return args, true
		}
	}
	return "", false
}

// Stage positions of BootApplications.
const (
	StageShim       = 0
	StageBootloader = 1
	StageKernel     = 2 // and every later application
)

// StageName names the stage of the boot application at position i, for
// people: shim, boot loader, kernel.
func StageName(i int) string {
	switch i {
	case StageShim:
		return "shim"
	case StageBootloader:
		return "boot loader"
	}
	return "kernel"
}

// StageOf names boot application i of this boot for people: as
// StageName, but the last is the unified kernel image when systemd-stub
// measured its sections (UKISectionsKnown).
func (b *BootState) StageOf(i int) string {
	if b.UKISectionsKnown && i == len(b.BootApplications)-1 {
		return "unified kernel image"
	}
	return StageName(i)
}

// Kernels are the boot applications in the kernel's stage: every one
// after the boot loader.
func (b *BootState) Kernels() []string {
	if len(b.BootApplications) <= StageKernel {
		return nil
	}
	return b.BootApplications[StageKernel:]
}

// Who verified a boot image (AppVerification.Verifier,
// SecureBootAuthority.By).
const (
	VerifierFirmware = "firmware"
	VerifierShim     = "shim"
)

// SecureBootAuthority is one entry of a signature database that verified
// an image, as measured into PCR 7.
type SecureBootAuthority struct {
	// Variable is the database it came from, as measured: "db" (UEFI's,
	// checked by the firmware or by the shim), "MokListRT" (the shim's
	// MokList: its vendor certificate, mirrored, then the machine owner's
	// keys), "Shim" (the shim's built-in vendor certificate, checked
	// directly), "vendor_db" (the shim's built-in db).
	Variable string `json:"variable"`
	// By is who measured it: VerifierFirmware or VerifierShim.
	By string `json:"by"`
	// BeforeSeparator: measured before PCR 7's separator (the firmware
	// verifying drivers and option ROMs, not a boot application).
	BeforeSeparator bool `json:"beforeSeparator,omitempty"`
	// SHA256 is the certificate's SHA-256 fingerprint (of its DER), hex;
	// for a hash entry, the image hash itself.
	SHA256 string `json:"sha256"`
	// Hash: the entry is an image's hash (EFI_CERT_SHA256), not a
	// certificate.
	Hash bool `json:"hash,omitempty"`
	// Subject is the certificate's subject ("" for a hash, or a
	// certificate Go does not parse).
	Subject string `json:"subject,omitempty"`
	// Owner is the entry's owner GUID (EFI_SIGNATURE_DATA), when the
	// measurement carried one (old shims measured the bare certificate).
	Owner string `json:"owner,omitempty"`
}

// AppVerification is who verified one boot application.
type AppVerification struct {
	// Verifier is VerifierFirmware, VerifierShim, or "" when nothing
	// verified it (Secure Boot off, or the shim's validation turned off).
	Verifier string `json:"verifier,omitempty"`
	// Signers are the SHA256 of each authority (of Authorities) that may
	// have verified it: exactly one when the log establishes the signer;
	// several when its verifier used several and the log cannot say
	// which; none when the log shows none.
	Signers []string `json:"signers,omitempty"`
}

// Signer is the authority that verified boot application i (of
// BootApplications), when the log establishes exactly one. Otherwise a
// *Denial: BootSignerUnknown (nothing verified it, or the log shows no
// authority for it), BootSignerAmbiguous (its verifier used several
// authorities and the log does not say which verified it).
func (b *BootState) Signer(i int) (SecureBootAuthority, error) {
	if i < 0 || i >= len(b.BootApplications) || i >= len(b.AppVerifications) {
		return SecureBootAuthority{}, Deny(ReasonBootSignerUnknown, "boot application %d: not measured", i)
	}
	v := b.AppVerifications[i]
	switch {
	case v.Verifier == "":
		return SecureBootAuthority{}, Deny(ReasonBootSignerUnknown, "boot application %d (%.12s…): nothing verified it (Secure Boot or the shim's validation off)", i, b.BootApplications[i])
	case len(v.Signers) == 0:
		return SecureBootAuthority{}, Deny(ReasonBootSignerUnknown, "boot application %d (%.12s…): the log shows no authority its verifier (%s) measured", i, b.BootApplications[i], v.Verifier)
	case len(v.Signers) > 1:
		return SecureBootAuthority{}, Deny(ReasonBootSignerAmbiguous, "boot application %d (%.12s…): verified by one of %d authorities the %s measured; the log does not say which", i, b.BootApplications[i], len(v.Signers), v.Verifier)
	}
	for _, a := range b.Authorities {
		if a.SHA256 == v.Signers[0] && a.By == v.Verifier {
			return a, nil
		}
	}
	return SecureBootAuthority{}, Deny(ReasonBootSignerUnknown, "boot application %d: its signer %.12s… is not among the authorities", i, v.Signers[0])
}

// ShimState is what the shim measured about itself.
type ShimState struct {
	// SBATLevelKnown is set when the shim measured its SbatLevel (PCR 7):
	// the revocations it enforced. SBATDate is the level's datestamp (its
	// first line, sbat,1,<date>); SBAT its generations by component
	// ("shim": 4, "grub": 5, …): an image of a component whose SBAT
	// generation is lower was refused.
	SBATLevelKnown bool           `json:"sbatLevelKnown"`
	SBATDate       string         `json:"sbatDate,omitempty"`
	SBAT           map[string]int `json:"sbat,omitempty"`
	// MokList, MokListX and MokListTrusted are the hex digests (the PCR
	// bank's hash) of what the shim measured into PCR 14; "" when not
	// measured. MokList holds the shim's vendor certificate (mirrored)
	// and the machine owner's keys; MokListX what they revoke. The
	// measurement is the digest alone: the lists' entries are not in the
	// log.
	MokList        string `json:"mokList,omitempty"`
	MokListX       string `json:"mokListX,omitempty"`
	MokListTrusted string `json:"mokListTrusted,omitempty"`
	// MokListEmpty and MokListXEmpty: the list is the shim's placeholder
	// (one all-zero SHA-256 entry): nothing in it.
	MokListEmpty  bool `json:"mokListEmpty,omitempty"`
	MokListXEmpty bool `json:"mokListXEmpty,omitempty"`
	// MokListOnly is the SHA256 of the one certificate MokList holds,
	// when its digest is that of a list of exactly one certificate the
	// log shows (an authority the shim measured): for a distribution's
	// shim, its vendor certificate and no machine-owner key.
	MokListOnly string `json:"mokListOnly,omitempty"`
	// MokListTrustedKnown and MokListTrustedOn: the MokListTrusted value
	// measured (1: Linux may trust the MokList's CA keys in its machine
	// keyring).
	MokListTrustedKnown bool `json:"mokListTrustedKnown,omitempty"`
	MokListTrustedOn    bool `json:"mokListTrustedOn,omitempty"`
	// ValidationDisabled: the shim measured MokSBState = 1 (mokutil
	// --disable-validation): it boots what it cannot verify.
	ValidationDisabled bool `json:"validationDisabled,omitempty"`
}
