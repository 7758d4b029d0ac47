// Package gcevtpm is nodeproof's GCE vTPM evidence: a Shielded or
// Confidential VM's TPM, whose attestation key Google certifies. GCE makes
// the AK from a template it writes into the vTPM's NV (0x01c10001 RSA,
// 0x01c10003 ECC), under the endorsement hierarchy, and writes a
// certificate for it beside it (0x01c10000, 0x01c10002), issued by one of
// Google's two vTPM hierarchies ("tpm_ek_v1_cloud_host_root" and the
// Certificate Authority Service "EK/AK CA Root"), with an extension
// (1.3.6.1.4.1.11129.2.1.21) naming the instance: project number and ID,
// zone, instance ID and name, and whether the host is production.
//
// Collector (node side) loads that AK and quotes with it; Verifier
// (server side) checks the certificate's chain to the pinned roots, reads
// the instance from it, checks that it certifies the AK the quote is
// verified with, and then verifies the quote, the event log and the boot
// state exactly as attest/tpm does on bare metal. So one verification
// names the instance and proves its boot, with no call to a Google API.
// Claims carry both: GCP (project, zone, instance) for the pool's project
// and zone allow-lists, TPM (PCRs, boot state) for its boot policy.
//
// What a certified AK does not prove, and what closes it:
//   - Who on the VM asked for the quote: any process that can open the
//     TPM can quote with the AK (as on bare metal); the quote binds the
//     session nonce and the kubelet key, so it serves one enrolment of one
//     key, and the first-use and re-enrolment rules of the store apply.
//   - Revocation: no CRL is read (Google publishes them for one hierarchy
//     only). A certificate stays good until it expires (Google's: 30
//     years); what ends a VM's enrolment is the operator's revoke.
//   - The instance's age or state: the certificate was issued when the
//     vTPM was provisioned; policy may ask for a live check elsewhere.
//
// Roots and intermediates: certs/roots holds the two pinned roots,
// certs/intermediates the intermediates known at build time, each with
// its source in certs/README.md; hack/gcevtpm-intermediates refreshes
// them over AIA. Operators add an intermediate without a release with
// Trust.WithIntermediates, or allow fetching over AIA (Options.AIA).
package gcevtpm
