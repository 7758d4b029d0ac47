// Package azuretpm is nodeproof's Azure Trusted Launch vTPM evidence: a
// Trusted Launch VM's TPM, whose attestation key Azure certifies, beside
// the Instance Metadata Service's attested document naming the VM.
//
// Azure provisions the vTPM with an AK at persistent handle 0x81000003 and
// the AK's certificate at NV index 0x01C101D0 (there is no EK certificate:
// the AK quotes directly). The certificate's subject is
// CN=<vm id>.TrustedVM.Azure.windows.net, issued by "Azure Cloud Virtual
// TPM CA - 11" (under "Azure Cloud Virtual TPM CA 2025") or by "Global
// Virtual TPM CA - 03", both under "Azure Virtual TPM Root Certificate
// Authority 2023", which certs/roots pins.
//
// The certificate names the VM but not its subscription; the attested
// document does: IMDS's PKCS#7, signed by a metadata.azure.com certificate
// chaining to Microsoft's and DigiCert's TLS roots, of a JSON content with
// the nonce the caller asked for, vmId, subscriptionId and a validity.
//
// Collector (node side) loads the AK, reads its certificate, quotes over
// the session nonce and the kubelet key, and fetches the attested
// document with a nonce derived from the same two (IMDSNonce). Verifier
// (server side) checks the AK certificate's chain to the pinned root and
// reads the VM ID from it, checks that it certifies the AK the quote is
// verified with, verifies the quote, the event log and the boot state
// exactly as attest/tpm does on bare metal, and checks the document: its
// signature, its signer's chain and name, its nonce (this session's), its
// vmId (the certificate's VM) and its validity. One verification names the
// VM and its subscription and proves its boot, with no call to an Azure
// API.
//
// What this does not prove, and what closes it:
//   - Who on the VM asked: any process that can open the TPM can quote,
//     and any process can ask IMDS; the quote and the document bind the
//     session nonce and the kubelet key, so they serve one enrolment of
//     one key, and the store's first-use and re-enrolment rules apply.
//   - Revocation: no CRL is read; what ends a VM's enrolment is the
//     operator's revoke.
//   - The VM's name: neither the certificate nor the document carries it
//     (Claims.NodeName is empty; the node's requested name is policy's).
//
// The VM's subscription and ID are the claims' Instance (attest.CloudAzure).
package azuretpm
