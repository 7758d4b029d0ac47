package attest

import "strings"

// Reason is the machine-readable cause of a decision: of a refusal the
// server sends (mcs maps each to one HTTP status), of a CSR's Approved or
// Denied condition and Event (approver), of a Node's Attested condition,
// of a node's failure report, of a connection refused at accept. Tests
// assert reasons, never message text.
//
// This file is nodeproof's one vocabulary of reasons: no other package
// declares one, and docs/reasons.md explains each in one table (both held
// by TestReasonsDocumented).
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
	ReasonTokenAlgorithm  Reason = "TokenAlgorithmNotAllowed"
	ReasonTokenKeyUnknown Reason = "TokenKeyUnknown"
	ReasonTokenSignature  Reason = "TokenSignatureInvalid"
	ReasonTokenIssuer     Reason = "TokenIssuerMismatch"
	ReasonTokenAudience   Reason = "TokenAudienceMismatch"
	// ReasonTokenExpired: a GCP identity token past its exp, or a config
	// token past its life (the server's --config-token-ttl).
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
	// Azure Trusted Launch vTPM (identity/azuretpm): the IMDS attested
	// document beside the AK certificate.
	//
	// ReasonAzureDocMalformed: the attested document is not base64 of a
	// PKCS#7 SignedData with one signer and a JSON content of the
	// documented fields and shapes, or exceeds its bound.
	ReasonAzureDocMalformed Reason = "AzureDocumentMalformed"
	// ReasonAzureDocSignature: the document's PKCS#7 signature does not
	// verify under the certificate it names.
	ReasonAzureDocSignature Reason = "AzureDocumentSignatureInvalid"
	// ReasonAzureDocUntrusted: the document's signer does not chain to a
	// pinned IMDS root, or is not an allowed metadata signer
	// (metadata.azure.com, …).
	ReasonAzureDocUntrusted Reason = "AzureDocumentSignerUntrusted"
	// ReasonAzureDocExpired: the document is outside its timeStamp
	// (createdOn, expiresOn), or a certificate of its signer's chain
	// outside its validity, at the verifier's clock.
	ReasonAzureDocExpired Reason = "AzureDocumentExpired"
	// ReasonAzureDocNonce: the document's nonce is not the one this
	// session asked for (a document of another session, replayed).
	ReasonAzureDocNonce Reason = "AzureDocumentNonceMismatch"
	// ReasonAzureDocVM: the document's vmId is not the VM the AK
	// certificate names (two machines' evidence spliced).
	ReasonAzureDocVM Reason = "AzureDocumentVMMismatch"
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
	// ReasonPolicySubscription: the Azure VM's subscription is not in
	// azure.subscriptions.
	ReasonPolicySubscription Reason = "SubscriptionNotAllowed"

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
	// ReasonPolicyBootSigner: a boot stage's signer (the Secure Boot
	// authority that verified it) is not in its signedBy.
	ReasonPolicyBootSigner Reason = "BootSignerNotAllowed"
	// ReasonPolicyBootSignerDenied: a Secure Boot authority the boot
	// measured (a certificate that verified a boot application, a driver
	// or an option ROM) is in tpm.deniedSigners: a revoked signer.
	ReasonPolicyBootSignerDenied Reason = "BootSignerDenied"
	// ReasonPolicySBAT: the SbatLevel the shim measured is below
	// tpm.minimumSBAT for a component, or was not measured.
	ReasonPolicySBAT Reason = "SBATLevelOutdated"
	// ReasonPolicySecureBootCA: the machine has not moved off Microsoft's
	// 2011 Secure Boot CAs as tpm.microsoftCA2023 requires: its db or KEK
	// lacks the 2023 CA, or its firmware verified the boot chain through
	// a 2011 CA.
	ReasonPolicySecureBootCA Reason = "SecureBootCAOutdated"
	// ReasonPolicyMOK: a boot application verified (or possibly verified)
	// by a machine-owner key tpm.machineOwnerKeys does not list.
	ReasonPolicyMOK Reason = "MachineOwnerKeyNotAllowed"
	// ReasonPolicyGrubFile: a file GRUB read (PCR 9: grub.cfg, the
	// kernel, the initramfs) is not the one tpm.grub.files lists at its
	// place, or GRUB read more or fewer files.
	ReasonPolicyGrubFile Reason = "GrubFileNotAllowed"
	// ReasonPolicyGrubCommand: a command GRUB ran (PCR 8) is not the one
	// tpm.grub.commands lists at its place, GRUB ran more or fewer, or
	// PCR 8 holds a text nobody can check.
	ReasonPolicyGrubCommand Reason = "GrubCommandNotAllowed"
	// ReasonPolicyKernelVersion: a kernel older than
	// tpm.minimumKernel.version, or one whose version the policy does not
	// know (minimumKernel.versions maps digests to versions).
	ReasonPolicyKernelVersion Reason = "KernelBelowMinimum"
	// ReasonPolicyEKKind: the TPM attested with an endorsement key of
	// another kind than the one the pool accepts (tpm.ek): a TPM's other
	// EK is not a second identity.
	ReasonPolicyEKKind Reason = "EKKindNotAccepted"
	// ReasonPolicyUKISections: a pool that judges a unified kernel image
	// (tpm.uki) got a boot whose PCR 11 does not establish the UKI's
	// sections (not replayed, not systemd-stub's name and content pairs
	// in its order, no .linux), or a section tpm.uki.sections pins was
	// not measured or holds other content.
	ReasonPolicyUKISections Reason = "UKISectionNotAllowed"
	// ReasonPolicyUKIExtended: a UKI booted with measurements its
	// signature does not cover: PCR 12 (a command line the boot loader
	// passed, credentials) or PCR 13 (system extensions) extended.
	ReasonPolicyUKIExtended Reason = "UKIExtraMeasurements"
	// ReasonPolicyReferenceSetExpired: the boot chain matches only
	// reference sets whose notAfter has passed.
	ReasonPolicyReferenceSetExpired Reason = "ReferenceSetExpired"
	// ReasonPolicyAudit is the Event reason of an admitted machine that a
	// rule in audit mode would have refused (the message names the rule
	// and the reason it would have given).
	ReasonPolicyAudit Reason = "PolicyAuditRefusal"
)

// The server's own refusals (mcs): the request, the credentials of a
// config fetch and the tiers, the admission limits, readiness.
const (
	ReasonNotFound         Reason = "NotFound"
	ReasonBadPath          Reason = "BadPath"
	ReasonMethodNotAllowed Reason = "MethodNotAllowed"
	// ReasonUnknownPool: a config of a pool the inputs do not have.
	ReasonUnknownPool Reason = "UnknownPool"
	ReasonSpecVersion Reason = "UnsupportedSpecVersion"
	ReasonCredentials Reason = "CredentialsRequired"
	// ReasonTokenInvalid: a config or provisioning token that does not
	// open or match.
	ReasonTokenInvalid   Reason = "TokenInvalid"
	ReasonTokenWrongPool Reason = "TokenForAnotherPool"
	// ReasonTokenUsed: a config token that fetched its config already.
	// Nodes act on it: a token spent by a delivery that never arrived
	// means attesting again (agent).
	ReasonTokenUsed         Reason = "TokenAlreadyUsed"
	ReasonTierDisabled      Reason = "TierDisabled"
	ReasonInsecurePort      Reason = "InsecurePortRefused"
	ReasonBodyTooLarge      Reason = "BodyTooLarge"
	ReasonMalformedRequest  Reason = "MalformedRequest"
	ReasonUnavailable       Reason = "Unavailable"
	ReasonConfigUnavailable Reason = "ConfigUnavailable"
	// ReasonNotReady: /healthz of a server that lacks something it needs
	// to serve configs (mcs.Options.Health says what).
	ReasonNotReady Reason = "NotReady"
	// ReasonRateLimited: the source address or the identity asked too
	// often; Retry-After says when a token is back.
	ReasonRateLimited Reason = "RateLimited"
	// ReasonOverloaded: too many attestations in flight.
	ReasonOverloaded Reason = "Overloaded"
	// ReasonEnrolmentCap: an enrolled machine enrolling again already holds
	// its pool's cap of unexpired enrolments (each with its own bootstrap
	// token). Final: retrying cannot help before the oldest expires, and a
	// machine rebooting through provisioning needs an operator (release,
	// or a larger serve.maxLiveEnrolments for the pool).
	ReasonEnrolmentCap Reason = "EnrolmentCapReached"
	// ReasonTPMClockRollback: a TPM's reset count went back since the
	// node's last attestation (a TPM2_Clear, or evidence that is not this
	// TPM's boots in order): recorded as the node's failure.
	ReasonTPMClockRollback Reason = "TPMClockRollback"
	// ReasonPolicyRefused is the Event reason of an enrolment the policy
	// refused with an error that carries no reason of its own (the Event
	// carries the refusal's reason when it has one).
	ReasonPolicyRefused Reason = "PolicyRefused"
	// ReasonPolicyRejudged is the Event reason of a node whose last
	// verified claims a change of the policy in force judged again
	// (mcs/rejudge): a warning when they now fail (the message names the
	// policy's version and the refusing rule's reason, which the binding's
	// status keeps as its reason), normal when a node failed that way
	// passes again.
	ReasonPolicyRejudged Reason = "PolicyRejudged"
)

// Event reasons of a node's failure report (POST /report/v1), and what
// the agent reports.
const (
	// ReasonNodeReport: a report whose sender proved the kubelet key of a
	// session the server issued.
	ReasonNodeReport Reason = "NodeReportedFailure"
	// ReasonNodeReportUnauthenticated: a report without that proof.
	ReasonNodeReportUnauthenticated Reason = "NodeReportedFailureUnauthenticated"
	// ReasonAgentError and ReasonAgentTimeout: what the agent reports
	// failed when the server gave no reason (an error of its own, a
	// deadline).
	ReasonAgentError   Reason = "Error"
	ReasonAgentTimeout Reason = "Timeout"
	// ReasonRedirected is the agent's own refusal of a server answer that
	// redirects (3xx): the agent follows no redirect, so neither the
	// session and kubelet key proof of a verify nor the config token of a
	// fetch ever leave for another host or scheme.
	ReasonRedirected Reason = "Redirected"
	// ReasonUnknown is the agent's reason of a refusal whose body names
	// none (or one that is not a reason's shape).
	ReasonUnknown Reason = "Unknown"
)

// Connections refused at accept by the PROXY protocol checks
// (mcs/proxied): the log's reason and the refusal metric.
const (
	// ReasonProxyHeaderMissing: a trusted peer sent no PROXY header.
	ReasonProxyHeaderMissing Reason = "ProxyHeaderMissing"
	// ReasonProxyHeaderUntrusted: a peer outside Trusted sent a PROXY
	// header (or began with a PROXY signature).
	ReasonProxyHeaderUntrusted Reason = "ProxyHeaderUntrusted"
	// ReasonProxyHeaderInvalid: a trusted peer's header did not parse.
	ReasonProxyHeaderInvalid Reason = "ProxyHeaderInvalid"
	// ReasonProxyQueueFull: too many listed balancers' connections were
	// waiting for their header.
	ReasonProxyQueueFull Reason = "ProxyHeaderQueueFull"
)

// The approver's decisions on a kubelet CSR: the reason of its Approved
// or Denied condition, of the Event on it, and the decisions metric's
// label. An approval's is ReasonAttested(kind).
const (
	// ReasonAttestedPrefix starts an approval's reason: ReasonAttested.
	ReasonAttestedPrefix = "NodeproofAttested"
	// Not ours (left alone, no event).
	ReasonNotKubelet Reason = "NotKubeletSigner"
	// Shape: the CSR is not what a kubelet sends.
	ReasonBadCSR           Reason = "MalformedCSR"
	ReasonBadSubject       Reason = "SubjectNotAllowed"
	ReasonKeyNotAllowed    Reason = "KeyNotAllowed"
	ReasonSANsNotAllowed   Reason = "SANsNotAllowed"
	ReasonUsagesNotAllowed Reason = "UsagesNotAllowed"
	// ReasonExtensionNotAllowed: the CSR requests an extension a kubelet's
	// certificate never carries — BasicConstraints, name constraints, a
	// key usage or extended key usage beyond its signer's, a SAN of a kind
	// other than DNS name and IP address, or any other extension. Denied
	// whatever DenyUnattested says: no kubelet sends it, and a signer that
	// copies requested extensions would issue it.
	ReasonExtensionNotAllowed Reason = "ExtensionNotAllowed"
	// Evidence.
	ReasonNoAttestation  Reason = "NoAttestation"
	ReasonRecordExpired  Reason = "AttestationExpired"
	ReasonKeyNotAttested Reason = "KubeletKeyNotAttested"
	ReasonRecordConsumed Reason = "AttestationAlreadyUsed"
	// ReasonRequesterMismatch: a serving CSR not requested by the node
	// itself, or a client CSR from another requester than the bootstrap
	// token its record names.
	ReasonRequesterMismatch Reason = "RequesterMismatch"
	ReasonSANNotAttested    Reason = "SANNotAttested"
	// ReasonNoAddresses: the node's record attested no address of a kind
	// the serving CSR asks for (GCP evidence attests no IP address; a TPM
	// trusted through a vendor CA with no inventory entry no address at
	// all): nothing to check those SANs against, so the CSR is left to
	// another approver.
	ReasonNoAddresses Reason = "NoAttestedAddresses"
	// ReasonTokenOtherNode: the CSR was made with a per-node bootstrap
	// token that nodeproof issued for another node (the records naming the
	// token are all for other names).
	ReasonTokenOtherNode Reason = "BootstrapTokenOtherNode"
	// ReasonNoClientCertificate: a CSR the node made itself (requester
	// system:node:NAME) carries no credential ID of the X.509 client
	// certificate that authenticated it (spec.extra
	// authentication.kubernetes.io/credential-id = X509SHA256=<hex>), so
	// nothing tells which kubelet made it.
	ReasonNoClientCertificate Reason = "NoClientCertificate"
	// ReasonNotCurrentOwner: a CSR the node made itself was authenticated
	// by a client certificate that is not in the lineage of the identity
	// that owns the name now (store.Lineage): a certificate issued to a
	// previous owner of the name, to a kubelet of an earlier enrolment, or
	// one whose issuance the approver never saw.
	ReasonNotCurrentOwner Reason = "CertificateNotCurrentOwner"
	// ReasonNodeAttested is the Node's Attested condition's reason while
	// it is attested (the node controller); when it is not, the reason is
	// Revoked, AttestationFailed or AttestationStale.
	ReasonNodeAttested Reason = "Attested"
)

// ReasonAttested is the reason of an approval resting on evidence of kind
// k: NodeproofAttestedTPM, NodeproofAttestedGCP, ...
func ReasonAttested(k Kind) Reason {
	return Reason(ReasonAttestedPrefix + strings.ToUpper(string(k)))
}
