// Package attest is the shared vocabulary of nodeproof's evidence checks:
// the kinds of evidence, the claims a verifier vouches for, the session that
// ties a challenge to its answer, the binding of a kubelet key into evidence,
// and the one typed refusal, Denial, that every check returns.
//
// Authenticity and authorization are separate steps. A Verifier (attest/tpm,
// identity/gcp, identity/aws) returns Claims only when every check in its
// doc comment passed; attest/policy then decides whether those claims may
// have a pool. Neither logs: callers write one line per decision.
package attest

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Kind names a kind of evidence.
type Kind string

// The kinds of evidence nodeproof understands.
const (
	KindTPM Kind = "tpm"
	KindGCP Kind = "gcp"
	KindAWS Kind = "aws"
	// KindGCEVTPM: a GCE Shielded or Confidential VM's vTPM, whose
	// attestation key Google certifies (identity/gcevtpm).
	KindGCEVTPM Kind = "gce-vtpm"
	// KindNitroTPM: an EC2 instance's NitroTPM, whose AK a Nitro
	// attestation document binds, beside the instance identity document
	// (identity/nitrotpm).
	KindNitroTPM Kind = "aws-nitrotpm"
)

// BindingLabel starts every binding digest, so that a quote or token made
// for nodeproof cannot be mistaken for one made for another protocol.
const BindingLabel = "nodeproof/v1 attestation binding"

// NonceSize is the size of a server nonce in bytes.
const NonceSize = 32

// DefaultSessionTTL is how long a sealed attestation session lives when a
// verifier's SessionTTL is unset: the bound between challenge and answer.
const DefaultSessionTTL = 5 * time.Minute

// BindingDigest returns SHA-256(BindingLabel ‖ 0x00 ‖ nonce ‖ kubeletKeySHA256).
// It is the qualifying data of a TPM quote and part of a GCP token's
// audience: one piece of evidence serves exactly one session (the nonce) and
// one kubelet key (its hash), so neither a replayed quote nor a swapped key
// passes.
func BindingDigest(nonce, kubeletKeySHA256 []byte) []byte {
	h := sha256.New()
	h.Write([]byte(BindingLabel))
	h.Write([]byte{0})
	h.Write(nonce)
	h.Write(kubeletKeySHA256)
	return h.Sum(nil)
}

// KeySHA256 returns the SHA-256 of a public key's PKIX DER encoding after
// checking that it parses as one. This is the hash that evidence binds and
// that the CSR approver compares against a CSR's key.
func KeySHA256(pkixDER []byte) ([]byte, error) {
	if _, err := x509.ParsePKIXPublicKey(pkixDER); err != nil {
		return nil, Deny(ReasonMalformed, "kubelet public key is not PKIX DER: %v", err)
	}
	sum := sha256.Sum256(pkixDER)
	return sum[:], nil
}

// Equal reports whether a and b are equal, in time that depends only on
// their lengths. Every comparison of a secret or a binding goes through it.
func Equal(a, b []byte) bool {
	return subtle.ConstantTimeCompare(a, b) == 1
}

// Session is what a server remembers between a challenge and its answer.
// Servers seal it (AEAD) and hand it to the node, so any replica can verify
// the answer; nothing in it may be trusted unless it came back sealed.
type Session struct {
	Kind Kind   `json:"kind"`
	Pool string `json:"pool"`
	// Purpose is what the attestation is for: PurposeEnrol (the default:
	// it releases a config) or PurposeReattest (a node that enrolled,
	// proving itself again: it releases nothing).
	Purpose Purpose `json:"purpose,omitempty"`
	// Nonce is the server's fresh random value for this session.
	Nonce []byte `json:"nonce"`
	// KubeletKeySHA256 is the hash of the kubelet public key the node bound.
	KubeletKeySHA256 []byte `json:"kubeletKeySHA256"`
	// IssuedAt and Expires bound the session's life.
	IssuedAt time.Time `json:"issuedAt"`
	Expires  time.Time `json:"expires"`
	// State is kind-specific (for TPM: the activation secret, the AK and
	// the EK facts already checked).
	State []byte `json:"state,omitempty"`
}

// Purpose is what an attestation is for.
type Purpose string

// Purposes.
const (
	// PurposeEnrol: the first attestation of an identity (or its
	// re-enrolment), which releases a config and leads to the node's first
	// kubelet certificate. The empty Purpose means it.
	PurposeEnrol Purpose = "enrol"
	// PurposeReattest: an enrolled node attesting again, at every boot and
	// on a timer; it releases nothing and updates the node's status.
	PurposeReattest Purpose = "reattest"
)

// Reattest reports whether s is a re-attestation.
func (s *Session) Reattest() bool { return s.Purpose == PurposeReattest }

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

// Claims are the facts a verifier vouches for after every one of its checks
// passed. Policy decides what they may have; nothing here is a decision.
type Claims struct {
	Kind Kind `json:"kind"`
	// Identity is a stable, globally unique identifier of the machine for
	// this kind of evidence: "tpm-ek:<sha256 of EK PKIX DER>",
	// "gcp:<project number>/<zone>/<instance id>" or
	// "aws:<account>/<region>/<instance id>". A node name is bound to the
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

	TPM *TPMClaims `json:"tpm,omitempty"`
	GCP *GCPClaims `json:"gcp,omitempty"`
	AWS *AWSClaims `json:"aws,omitempty"`
}

// GCPClaims are what a verified GCP instance identity token establishes
// (its google.compute_engine claims).
type GCPClaims struct {
	ProjectID       string    `json:"projectID"`
	ProjectNumber   string    `json:"projectNumber"`
	Zone            string    `json:"zone"`
	InstanceID      string    `json:"instanceID"`
	InstanceName    string    `json:"instanceName"`
	InstanceCreated time.Time `json:"instanceCreated"`
	// ServiceAccount is the token's email claim, when present.
	ServiceAccount string `json:"serviceAccount,omitempty"`
}

// AWSClaims are what a verified AWS instance identity document establishes.
type AWSClaims struct {
	AccountID        string    `json:"accountID"`
	Region           string    `json:"region"`
	AvailabilityZone string    `json:"availabilityZone"`
	InstanceID       string    `json:"instanceID"`
	InstanceType     string    `json:"instanceType"`
	ImageID          string    `json:"imageID"`
	PrivateIP        string    `json:"privateIP"`
	PendingTime      time.Time `json:"pendingTime"`
	// PrivateDNSName is the instance's private DNS name: from the optional
	// live EC2 check, else derived from PrivateIP and Region the way EC2
	// names instances (ip-a-b-c-d.<region>.compute.internal;
	// ec2.internal in us-east-1).
	PrivateDNSName string `json:"privateDNSName,omitempty"`
	// LiveChecked is set when the EC2 API confirmed the instance is running
	// (and in the expected VPC / with the expected tags).
	LiveChecked bool `json:"liveChecked"`
}

// TPMClaims are the facts a TPM attestation establishes.
type TPMClaims struct {
	// EKSHA256 is the hex SHA-256 of the EK public key (PKIX DER).
	EKSHA256 string `json:"ekSHA256"`
	// EKTrust names what vouched for the EK: "ca:<root set name>" or
	// "inventory".
	EKTrust string `json:"ekTrust"`
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
	DBXKnown   bool   `json:"dbxKnown"`
	DBXEntries int    `json:"dbxEntries"`
	DBXSHA256s []byte `json:"dbxSHA256s,omitempty"`

	// BootApplications are the hex digests (in the PCR bank's hash) of the
	// EFI boot services applications measured into PCR 4 between its
	// separator and ExitBootServices, in boot order: for a shim + GRUB
	// boot, the shim, GRUB, then the kernel. (A partial log without PCR
	// 4's separator: every PCR 4 application.)
	BootApplications []string `json:"bootApplications,omitempty"`
	// Shim and Bootloader are BootApplications[0] and [1] when present.
	Shim       string `json:"shim,omitempty"`
	Bootloader string `json:"bootloader,omitempty"`
	// Kernel is the boot application that is the kernel, identified by
	// content (KernelBy says how), never by position: empty when the log
	// does not establish it (no ExitBootServices event, no loader command
	// or file name that names it).
	Kernel   string `json:"kernel,omitempty"`
	KernelBy string `json:"kernelBy,omitempty"`
	// ExitBootServices is set when the log has the ExitBootServices
	// invocation (PCR 5): everything the boot measured came before it.
	ExitBootServices bool `json:"exitBootServices"`
	// KernelCmdlineKnown is set when a kernel command line was measured.
	KernelCmdlineKnown bool   `json:"kernelCmdlineKnown"`
	KernelCmdline      string `json:"kernelCmdline,omitempty"`

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

// Reason is the machine-readable cause of a refusal. Tests assert reasons,
// never message text; mcs maps each to an HTTP status and approver to a CSR
// condition reason.
type Reason string

// Reasons for refusing evidence. Each check has its own.
const (
	// Input.
	ReasonMalformed Reason = "MalformedEvidence"
	// Sessions.
	ReasonSessionInvalid Reason = "SessionInvalid"
	// ReasonKeyProof: a proof of possession of the kubelet key
	// (VerifyKeyProof) that does not verify.
	ReasonKeyProof       Reason = "KubeletKeyProofInvalid"
	ReasonSessionExpired Reason = "SessionExpired"
	ReasonSessionReused  Reason = "SessionReused"
	// TPM: endorsement key.
	ReasonEKUntrusted      Reason = "EKUntrusted"
	ReasonEKMismatch       Reason = "EKCertificateKeyMismatch"
	ReasonEKNotInInventory Reason = "EKNotInInventory"
	ReasonEKCertInvalid    Reason = "EKCertificateInvalid"
	// TPM: attestation key.
	ReasonAKInvalid      Reason = "AKInvalid"
	ReasonAKAttributes   Reason = "AKAttributes"
	ReasonAKCreation     Reason = "AKCreationAttestation"
	ReasonActivation     Reason = "CredentialActivationFailed"
	ReasonQuoteSignature Reason = "QuoteSignature"
	ReasonQuoteNotTPM    Reason = "QuoteNotTPMGenerated"
	ReasonQuoteBinding   Reason = "QuoteBindingMismatch"
	// ReasonQuoteRawNonce: the quote's qualifying data is the session's
	// nonce itself, not the binding digest (BindingDigest).
	ReasonQuoteRawNonce Reason = "QuoteQualifyingDataRawNonce"
	// ReasonQuoteKeyMissing: the qualifying data binds the nonce but no
	// kubelet key hash.
	ReasonQuoteKeyMissing Reason = "QuoteKubeletKeyHashMissing"
	ReasonKubeletKey      Reason = "KubeletKeyMismatch"
	ReasonQuoteSelection  Reason = "QuotePCRSelection"
	ReasonQuotePCRDigest  Reason = "QuotePCRDigestMismatch"
	ReasonNoSHA256Bank    Reason = "SHA256BankMissing"
	ReasonEventLogInvalid Reason = "EventLogMalformed"
	ReasonEventLogReplay  Reason = "EventLogReplayMismatch"
	// ReasonEventLogMissing: the machine sent no event log at all, and the
	// pool's rules need one (Secure Boot, boot components, dbx, command
	// line). A Linux kernel has none when the firmware's log did not reach
	// it: Debian's GRUB `linux` command with Secure Boot off boots the
	// kernel without its EFI stub (linuxefi keeps the log).
	ReasonEventLogMissing Reason = "EventLogMissing"
	// The event log read as the boot's sequence (attest/tpm's bootState):
	// what firmware would never have logged, refused rather than read.
	//
	// ReasonEventLogOutOfOrder: an event where the boot cannot have put
	// it — a UEFI variable after PCR 7's separator, a second separator,
	// anything but an authority in PCR 7 after its separator, a boot event
	// (PCRs 0-9) after ExitBootServices. Root on a booted machine appending
	// events (and extending PCRs to match) is refused this way.
	ReasonEventLogOutOfOrder Reason = "EventLogOutOfOrder"
	// ReasonEventLogVariableRepeated: a UEFI variable measured twice.
	ReasonEventLogVariableRepeated Reason = "EventLogVariableRepeated"
	// ReasonEventLogVariableGUID: SecureBoot, PK or KEK not under the EFI
	// global variable GUID, or db or dbx not under the image security
	// database GUID: not that variable.
	ReasonEventLogVariableGUID Reason = "EventLogVariableGUID"
	// ReasonEventLogUnexpected: an event firmware does not log there (a
	// PCR 7 event type other than variables, authorities, separator and
	// known actions; a separator whose data is not zero; a SecureBoot
	// variable that is not 0 or 1; Secure Boot on without the keys and
	// authorities it implies).
	ReasonEventLogUnexpected Reason = "EventLogUnexpectedEvent"
	// ReasonUEFIDebugger: the firmware logged "UEFI Debug Mode": a
	// debugger was attached during boot.
	ReasonUEFIDebugger Reason = "UEFIDebuggerPresent"
	// ReasonBootSignerUnknown: the log does not establish which Secure
	// Boot authority verified a boot application (nothing verified it, or
	// no authority its verifier measured is in the log).
	// ReasonBootSignerAmbiguous: its verifier used several authorities
	// and the log does not say which verified it (BootState.Signer).
	ReasonBootSignerUnknown   Reason = "BootSignerUnknown"
	ReasonBootSignerAmbiguous Reason = "BootSignerAmbiguous"
	// Cloud identity: signed tokens and documents.
	ReasonTokenAlgorithm   Reason = "TokenAlgorithmNotAllowed"
	ReasonTokenKeyUnknown  Reason = "TokenKeyUnknown"
	ReasonTokenSignature   Reason = "TokenSignatureInvalid"
	ReasonTokenIssuer      Reason = "TokenIssuerMismatch"
	ReasonTokenAudience    Reason = "TokenAudienceMismatch"
	ReasonTokenExpired     Reason = "TokenExpired"
	ReasonTokenNotYetValid Reason = "TokenIssuedInFuture"
	ReasonTokenClaims      Reason = "TokenClaimsMissing"
	ReasonKeysUnavailable  Reason = "TrustRootsUnavailable"
	ReasonDocSignature     Reason = "DocumentSignatureInvalid"
	ReasonDocRegionCert    Reason = "DocumentRegionCertMismatch"
	ReasonDocMalformed     Reason = "DocumentMalformed"
	// ReasonDocSubstituted: an AWS document sent beside a valid signature
	// is not the signed one (the substitution attack), as opposed to a
	// document or signature that does not parse (DocumentMalformed).
	ReasonDocSubstituted  Reason = "DocumentSubstituted"
	ReasonDocTooOld       Reason = "DocumentTooOld"
	ReasonInstanceNotLive Reason = "InstanceNotRunning"
	// Cloud vTPMs: the cloud, not an EK chain, vouches for the AK
	// (docs/cloud-tpm.md).
	//
	// ReasonAKCertMissing: no AK certificate (a GCE VM without one in NV).
	ReasonAKCertMissing Reason = "AKCertificateMissing"
	// ReasonAKCertInvalid: the AK certificate or an intermediate sent
	// beside it does not parse, or is not an end-entity certificate.
	ReasonAKCertInvalid Reason = "AKCertificateInvalid"
	// ReasonAKCertUntrusted: the AK certificate does not chain to a
	// pinned root (a foreign or self-made chain).
	ReasonAKCertUntrusted Reason = "AKCertificateUntrusted"
	// ReasonAKCertExpired: the AK certificate, or a certificate of its
	// chain, is outside its validity at the verifier's clock.
	ReasonAKCertExpired Reason = "AKCertificateExpired"
	// ReasonAKCertKeyMismatch: the certified key is not the AK public area
	// the quote is verified with.
	ReasonAKCertKeyMismatch Reason = "AKCertificateKeyMismatch"
	// ReasonInstanceInfoMissing: the AK certificate has no GCE instance
	// extension (1.3.6.1.4.1.11129.2.1.21): it names no instance.
	ReasonInstanceInfoMissing Reason = "GCEInstanceInfoMissing"
	// ReasonInstanceInfoMalformed: the instance extension does not parse
	// (or carries an empty or out-of-range field).
	ReasonInstanceInfoMalformed Reason = "GCEInstanceInfoMalformed"
	// ReasonNotProduction: the instance extension says isProduction false
	// (or omits it): not a production Google host.
	ReasonNotProduction Reason = "GCEInstanceNotProduction"
	// ReasonNitroDocMalformed: the NitroTPM attestation document is not a
	// COSE_Sign1 of the documented CBOR payload.
	ReasonNitroDocMalformed Reason = "NitroDocumentMalformed"
	// ReasonNitroDocSignature: the document's ES384 signature does not
	// verify under its certificate.
	ReasonNitroDocSignature Reason = "NitroDocumentSignatureInvalid"
	// ReasonNitroDocUntrusted: the document's certificate does not chain
	// through its CA bundle to the pinned AWS Nitro root.
	ReasonNitroDocUntrusted Reason = "NitroDocumentChainUntrusted"
	// ReasonNitroDocExpired: a certificate of the document's chain is
	// outside its validity at the verifier's clock.
	ReasonNitroDocExpired Reason = "NitroDocumentCertificateExpired"
	// ReasonNitroDocTime: the document's timestamp is not within this
	// session (before the challenge, or in the future).
	ReasonNitroDocTime Reason = "NitroDocumentTimestamp"
	// ReasonNitroDocNonce: the document's nonce is not the session's.
	ReasonNitroDocNonce Reason = "NitroDocumentNonceMismatch"
	// ReasonNitroDocKey: the document's public_key is not the AK.
	ReasonNitroDocKey Reason = "NitroDocumentKeyMismatch"
	// ReasonNitroPCRs: a quoted SHA-384 PCR differs from the document's.
	ReasonNitroPCRs Reason = "NitroPCRMismatch"
	// ReasonNitroInstance: the document's module_id names another instance
	// than the instance identity document sent beside it, or names none
	// nodeproof can read.
	ReasonNitroInstance Reason = "NitroDocumentInstanceMismatch"
	// Enrolment: who owns a node name (mcs, store.Binding).
	//
	// ReasonNodeNameTaken: the node name is bound to another identity
	// (the first one that enrolled with it) until an operator releases it.
	ReasonNodeNameTaken Reason = "NodeNameTaken"
	// ReasonIdentityEnrolled: the identity already enrolled (under this
	// or another name) and the request may not enrol it again: no proof of
	// the kubelet key the enrolment bound, no release, and a pool that
	// does not re-enrol always.
	ReasonIdentityEnrolled Reason = "IdentityAlreadyEnrolled"
	// ReasonEnrolledInAnotherPool: the identity enrolled in another pool;
	// enrolling again cannot move it (an operator releases the node, and
	// the machine enrols in the new pool).
	ReasonEnrolledInAnotherPool Reason = "EnrolledInAnotherPool"
	// ReasonNodeNotAdopted: a Node of the requested name exists that
	// nodeproof never owned (it predates nodeproof); a requested name
	// cannot claim it until an operator adopts it (nodeproof adopt NODE).
	ReasonNodeNotAdopted Reason = "NodeNotAdopted"
	// Lifetime: a node's attestations after its enrolment.
	//
	// ReasonRevoked: an operator revoked (banned) the identity (nodeproof
	// revoke): refused everything, under any name and pool, until lifted.
	ReasonRevoked Reason = "Revoked"
	// ReasonAttestationFailed: the node's latest attestation was refused.
	ReasonAttestationFailed Reason = "AttestationFailed"
	// ReasonAttestationStale: the node has not passed an attestation
	// within its pool's freshness window.
	ReasonAttestationStale Reason = "AttestationStale"
	// ReasonNotEnrolled: a re-attestation by an identity that owns no node
	// name (never enrolled, or released).
	ReasonNotEnrolled Reason = "NotEnrolled"
	// Policy (authorization).
	ReasonPolicyProject     Reason = "ProjectNotAllowed"
	ReasonPolicyZone        Reason = "ZoneNotAllowed"
	ReasonPolicyInstanceAge Reason = "InstanceTooOld"
	ReasonPolicyAccount     Reason = "AccountNotAllowed"
	ReasonPolicyRegion      Reason = "RegionNotAllowed"
	ReasonPolicyLiveCheck   Reason = "LiveCheckRequired"

	ReasonPolicyUnknownPool     Reason = "PoolNotInPolicy"
	ReasonPolicyKindNotAllowed  Reason = "EvidenceKindNotAllowed"
	ReasonPolicySHA1            Reason = "SHA1BankNotAllowed"
	ReasonPolicyEKTrust         Reason = "EKTrustNotAllowed"
	ReasonPolicySecureBootOff   Reason = "SecureBootDisabled"
	ReasonPolicySecureBootUnk   Reason = "SecureBootStateUnknown"
	ReasonPolicyBootDenied      Reason = "BootComponentDenied"
	ReasonPolicyBootNotAllowed  Reason = "BootComponentNotAllowed"
	ReasonPolicyBootMissing     Reason = "BootComponentNotMeasured"
	ReasonPolicyDBX             Reason = "DBXOutdated"
	ReasonPolicyPCRValue        Reason = "PCRValueMismatch"
	ReasonPolicyKernelCmdline   Reason = "KernelCmdlineNotAllowed"
	ReasonPolicyNodeNameMissing Reason = "NodeNameNotEstablished"
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
