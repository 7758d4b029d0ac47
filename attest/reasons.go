package attest

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
